/**
 * "steadfast / Node detail": one node, everything its agent sees — GPUs, InfiniBand ports, NFS
 * mounts — with the steadfast actions on it as annotations. Panels come from the topic modules.
 */
import { RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { NODE_VARIABLE, nodeVariable, numberPanels, steadfastDashboard } from './frame.js';
import {
  collectorHealthPanel,
  eccErrorsPanel,
  gpuClocksPanel,
  gpuInventoryTable,
  gpuMemoryUsedPanel,
  gpuPowerPanel,
  gpuTemperaturePanel,
  gpuThrottlePanel,
  gpuUtilizationPanel,
  pcieReplaysPanel,
  remappedRowsPanel,
  xidsByCodePanel,
} from './gpu.js';
import { congestionNotificationsPanel, portErrorsPanel, portStateTable, portThroughputPanel, retransmitsPanel, transmitWaitPanel } from './network.js';
import { backlogPanel, mountsTable, operationLatencyPanel, operationsPanel, slotUtilizationPanel } from './storage.js';

export const NODE_UID = 'steadfast-node';
export const NODE_TITLE = 'steadfast / Node detail';

/** Link to this dashboard for one node, keeping the time range (for tables keyed by node). */
export function nodeDetailUrl(nodeField: string): string {
  return `/d/${NODE_UID}?var-${NODE_VARIABLE}=\${__data.fields.${nodeField}}&\${__url_time_range}`;
}

export function nodeDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: NODE_UID,
    title: NODE_TITLE,
    description: 'One node: GPU temperatures, power, clocks, throttling, ECC and row remaps; InfiniBand ports; NFS mounts.',
  })
    .withVariable(nodeVariable('steadfast_collector_success', { multi: false }))
    .withRow(new RowBuilder('GPUs'))
    .withPanel(gpuInventoryTable())
    .withPanel(gpuTemperaturePanel({ memory: true }))
    .withPanel(gpuPowerPanel({ limit: true }))
    .withPanel(gpuClocksPanel())
    .withPanel(gpuThrottlePanel())
    .withPanel(gpuUtilizationPanel())
    .withPanel(gpuMemoryUsedPanel())
    .withPanel(eccErrorsPanel())
    .withPanel(remappedRowsPanel())
    .withPanel(xidsByCodePanel())
    .withPanel(pcieReplaysPanel())
    .withRow(new RowBuilder('InfiniBand'))
    .withPanel(portStateTable().span(24))
    .withPanel(portThroughputPanel())
    .withPanel(portErrorsPanel())
    .withPanel(congestionNotificationsPanel())
    .withPanel(retransmitsPanel())
    .withPanel(transmitWaitPanel().span(24))
    .withRow(new RowBuilder('NFS'))
    .withPanel(mountsTable().span(24))
    .withPanel(slotUtilizationPanel())
    .withPanel(backlogPanel())
    .withPanel(operationsPanel())
    .withPanel(operationLatencyPanel())
    .withRow(new RowBuilder('Agent'))
    .withPanel(collectorHealthPanel());
  return numberPanels(builder.build());
}
