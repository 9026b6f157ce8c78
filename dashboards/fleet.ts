/**
 * "steadfast / Fleet overview": GPU health from the node agents on top, the controller's
 * signal → action pipeline below. One exported function per panel.
 */
import { DashboardBuilder, DashboardCursorSync, RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import {
  RATE_WINDOW,
  STEADFAST_TAG,
  aggregateBy,
  datasourceVariable,
  equals,
  histogramQuantile,
  increase,
  matches,
  nodeSeries,
  nodeVariable,
  numberPanels,
  rate,
  series,
  statPanel,
  sumBy,
  tablePanel,
  thresholdsRedBelow,
  thresholdsRedFrom,
  timeseriesPanel,
  unit,
} from './common.js';

export const FLEET_UID = 'steadfast-fleet';
export const FLEET_TITLE = 'steadfast / Fleet overview';

/** Labels that name one GPU on one node. */
const GPU = ['node', 'gpu', 'pci_bus_id'] as const;
const GPU_LEGEND = '{{node}} GPU {{gpu}}';

// ---- GPUs (node agents) --------------------------------------------------------------------

export function gpusPresentStat() {
  return statPanel({
    title: 'GPUs present',
    description: 'GPUs that nvidia-smi lists on the selected nodes.',
    unit: unit.count,
    queries: [{ expr: `sum(${nodeSeries('steadfast_gpu_present')})`, instant: true }],
    width: 6,
  });
}

export function gpusLostStat() {
  return statPanel({
    title: 'GPUs lost',
    description: 'GPUs listed before that nvidia-smi no longer lists (present = 0); each one drains its node.',
    unit: unit.count,
    queries: [{ expr: `count(${nodeSeries('steadfast_gpu_present')} == 0) or vector(0)`, instant: true }],
    width: 6,
  }).thresholds(thresholdsRedFrom(1));
}

export function gpusPerNodeTable() {
  return tablePanel({
    title: 'GPUs present per node',
    description: 'Listed GPUs per node, now.',
    unit: unit.count,
    queries: [{ expr: sumBy(['node'], nodeSeries('steadfast_gpu_present')) }],
  });
}

export function fatalXidsPanel() {
  return timeseriesPanel({
    title: 'Fatal Xids by node, GPU and code',
    description: `New fatal Xid errors per GPU (PCI bus id) and Xid code over ${RATE_WINDOW}. Above 0 means steadfast drains the node.`,
    unit: unit.count,
    queries: [
      {
        expr: sumBy(['node', 'pci_bus_id', 'xid'], increase(nodeSeries('steadfast_xid_errors_total', equals('severity', 'fatal')))),
        legend: '{{node}} {{pci_bus_id}} Xid {{xid}}',
      },
    ],
  });
}

export function xidsBySeverityPanel() {
  return timeseriesPanel({
    title: 'Xid errors by severity',
    description: `New Xid errors over ${RATE_WINDOW} on the selected nodes, by the severity class the agent gives each Xid code.`,
    unit: unit.count,
    queries: [{ expr: sumBy(['severity'], increase(nodeSeries('steadfast_xid_errors_total'))), legend: '{{severity}}' }],
  });
}

export function gpuTemperaturePanel() {
  return timeseriesPanel({
    title: 'GPU temperature',
    description: 'Core temperature per GPU.',
    unit: unit.celsius,
    queries: [{ expr: aggregateBy('max', GPU, nodeSeries('steadfast_gpu_temperature_celsius')), legend: GPU_LEGEND }],
  });
}

export function gpuPowerPanel() {
  return timeseriesPanel({
    title: 'GPU power',
    description: 'Board power draw per GPU.',
    unit: unit.watts,
    queries: [{ expr: aggregateBy('max', GPU, nodeSeries('steadfast_gpu_power_watts')), legend: GPU_LEGEND }],
  });
}

export function collectorHealthPanel() {
  return timeseriesPanel({
    title: 'Collector health',
    description: 'Whether each agent collector succeeded at its last scrape (1) or failed (0); a failure is logged by the agent with its reason.',
    unit: unit.bool,
    queries: [{ expr: aggregateBy('min', ['node', 'collector'], nodeSeries('steadfast_collector_success')), legend: '{{node}} {{collector}}' }],
    width: 24,
  })
    .min(0)
    .max(1)
    .thresholds(thresholdsRedBelow(1));
}

// ---- Controller ----------------------------------------------------------------------------

export function signalsAcceptedPanel() {
  return timeseriesPanel({
    title: 'Signals accepted',
    description: 'Signals the controller stored durably, per second, by source and kind.',
    unit: unit.perSecond,
    queries: [{ expr: sumBy(['source', 'kind'], rate(series('steadfast_signals_accepted_total'))), legend: '{{source}} {{kind}}' }],
  });
}

export function actionsByStatePanel() {
  return timeseriesPanel({
    title: 'Actions by state',
    description: 'Actions that reached a final state in the last hour, by verb and state.',
    unit: unit.count,
    queries: [{ expr: sumBy(['verb', 'state'], increase(series('steadfast_actions_total'), '1h')), legend: '{{verb}} {{state}}' }],
  });
}

export function requestsRejectedPanel() {
  return timeseriesPanel({
    title: 'Requests rejected',
    description: 'Requests the controller answered with an error, per second, by endpoint and reason.',
    unit: unit.perSecond,
    queries: [{ expr: sumBy(['endpoint', 'reason'], rate(series('steadfast_requests_rejected_total'))), legend: '{{endpoint}} {{reason}}' }],
  });
}

export function signalToActionLatencyPanel() {
  const histogram = 'steadfast_signal_to_action_seconds';
  return timeseriesPanel({
    title: 'Signal → action latency',
    description: 'Time from the fault to its action reaching a final state, by verb.',
    unit: unit.seconds,
    queries: [
      { expr: histogramQuantile(0.5, histogram, ['verb']), legend: 'p50 {{verb}}' },
      { expr: histogramQuantile(0.95, histogram, ['verb']), legend: 'p95 {{verb}}' },
    ],
  });
}

export function queueDepthPanel() {
  return timeseriesPanel({
    title: 'Queue depth',
    description: 'Jobs in each steadfast queue, by state.',
    unit: unit.count,
    queries: [{ expr: sumBy(['queue', 'state'], series('steadfast_queue_jobs')), legend: '{{queue}} {{state}}' }],
  });
}

export function firingAlertsTable() {
  return tablePanel({
    title: 'Firing steadfast alerts',
    description: 'steadfast alerts firing now, with their labels.',
    unit: unit.count,
    queries: [{ expr: series('ALERTS', matches('alertname', 'Steadfast.*'), equals('alertstate', 'firing')) }],
    width: 24,
  });
}

export function fleetDashboard(): Dashboard {
  const builder = new DashboardBuilder(FLEET_TITLE)
    .uid(FLEET_UID)
    .tags([STEADFAST_TAG])
    .description('GPU health across the fleet and how the steadfast controller reacts to it.')
    .editable()
    .tooltip(DashboardCursorSync.Crosshair)
    .refresh('30s')
    .time({ from: 'now-6h', to: 'now' })
    .timezone('browser')
    .withVariable(datasourceVariable())
    .withVariable(nodeVariable('steadfast_gpu_present'))
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
    .withPanel(requestsRejectedPanel())
    .withPanel(signalToActionLatencyPanel())
    .withPanel(queueDepthPanel());
  return numberPanels(builder.build());
}
