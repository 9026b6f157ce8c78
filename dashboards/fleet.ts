/**
 * "steadfast / Fleet overview": health per node and GPU health from the node agents on top, the
 * controller's signal → action pipeline below, steadfast's actions as annotations throughout.
 * One exported function per panel; the GPU and controller panels come from their topic modules.
 */
import { DashboardLinkBuilder, DashboardLinkType, RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { aggregateBy, equals, increase, isEqual, matches, sumBy } from '../core/promql.js';
import { AGENT_SCRAPE_JOB } from '../core/scrape.js';
import { clusterSeries, nodeSeries, nodeVariable, numberPanels, steadfastDashboard } from './frame.js';
import { mergedTablePanel, tablePanel, unit } from './panels.js';
import {
  collectorHealthPanel,
  fatalXidsPanel,
  gpuPowerPanel,
  gpuTemperaturePanel,
  gpusLostStat,
  gpusPerNodeTable,
  gpusPresentStat,
  xidsBySeverityPanel,
} from './gpu.js';
import { nodeDetailUrl } from './node.js';
import { actionsByStatePanel, remediationsPanel, queueDepthPanel, requestsRejectedPanel, signalToActionLatencyPanel, signalsAcceptedPanel } from './self.js';

export const FLEET_UID = 'steadfast-fleet';
export const FLEET_TITLE = 'steadfast / Fleet overview';

const NODE = ['node'] as const;
/** steadfast's alerts, by the prefix every alert name in rules/ carries. */
const STEADFAST_ALERTS = matches('alertname', 'Steadfast.*');

/**
 * One row per node: is its agent scraped, are its GPUs, collectors and ports healthy, did it log
 * a fatal Xid, is a steadfast alert firing on it. Red cells need a look; the node name links to
 * the node detail dashboard.
 */
export function nodeHealthTable() {
  return mergedTablePanel({
    title: 'Health per node',
    description:
      'Per node now: agent scraped (1) or not, GPUs lost, collectors failing, RDMA ports down, row-remap failures, fatal Xids in the last hour, steadfast alerts firing. Click a node for its detail.',
    unit: unit.count,
    columns: [
      { name: 'Agent up', expr: aggregateBy('max', NODE, nodeSeries('up', equals('job', AGENT_SCRAPE_JOB))), redBelow: 1 },
      { name: 'GPUs', expr: sumBy(NODE, nodeSeries('steadfast_gpu_present')) },
      { name: 'GPUs lost', expr: sumBy(NODE, isEqual(nodeSeries('steadfast_gpu_present'), 0)), redFrom: 1 },
      { name: 'Collectors failing', expr: sumBy(NODE, isEqual(nodeSeries('steadfast_collector_success'), 0)), redFrom: 1 },
      { name: 'Ports down', expr: sumBy(NODE, isEqual(nodeSeries('steadfast_rdma_port_up'), 0)), redFrom: 1 },
      { name: 'Row-remap failures', expr: sumBy(NODE, nodeSeries('steadfast_gpu_remapped_rows_failure')), redFrom: 1 },
      { name: 'Fatal Xids (1 h)', expr: sumBy(NODE, increase(nodeSeries('steadfast_xid_errors_total', equals('severity', 'fatal')), '1h')), redFrom: 1 },
      { name: 'Alerts firing', expr: aggregateBy('count', NODE, nodeSeries('ALERTS', STEADFAST_ALERTS, equals('alertstate', 'firing'))), redFrom: 1 },
    ],
    width: 24,
    height: 10,
  }).overrideByName('node', [
    {
      id: 'links',
      value: [new DashboardLinkBuilder('Node detail').type(DashboardLinkType.Link).url(nodeDetailUrl('node')).build()],
    },
  ]);
}

export function firingAlertsTable() {
  return tablePanel({
    title: 'Firing steadfast alerts',
    description: 'steadfast alerts firing now, with their labels.',
    unit: unit.count,
    queries: [{ expr: clusterSeries('ALERTS', STEADFAST_ALERTS, equals('alertstate', 'firing')) }],
    width: 24,
  });
}

export function fleetDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: FLEET_UID,
    title: FLEET_TITLE,
    description: 'GPU health across the fleet and how the steadfast controller reacts to it.',
  })
    .withVariable(nodeVariable('steadfast_gpu_present'))
    .withRow(new RowBuilder('Nodes'))
    .withPanel(nodeHealthTable())
    .withRow(new RowBuilder('GPUs'))
    .withPanel(gpusPresentStat())
    .withPanel(gpusLostStat())
    .withPanel(gpusPerNodeTable())
    .withPanel(fatalXidsPanel())
    .withPanel(xidsBySeverityPanel())
    .withPanel(gpuTemperaturePanel())
    .withPanel(gpuPowerPanel())
    .withPanel(collectorHealthPanel())
    .withRow(new RowBuilder('Controller'))
    .withPanel(firingAlertsTable())
    .withPanel(signalsAcceptedPanel())
    .withPanel(actionsByStatePanel())
    .withPanel(remediationsPanel())
    .withPanel(requestsRejectedPanel())
    .withPanel(signalToActionLatencyPanel())
    .withPanel(queueDepthPanel());
  return numberPanels(builder.build());
}
