/**
 * "steadfast / Storage": NFS from the agent's nfs collector (/proc/self/mountstats). The RPC
 * slot table is where checkpoint writes queue up: the 504-GPU operations report traced its
 * checkpoint stalls to a saturated 128-slot table. The node detail dashboard reuses the panels.
 */
import { RowBuilder, type Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';
import { RATE_WINDOW, aggregateBy, increase, rate, ratioOfRates, sumBy } from '../core/promql.js';
import { nodeSeries, nodeVariable, numberPanels, steadfastDashboard } from './frame.js';
import { statPanel, tablePanel, thresholdsRedFrom, timeseriesPanel, unit } from './panels.js';

export const STORAGE_UID = 'steadfast-storage';
export const STORAGE_TITLE = 'steadfast / Storage';

/** Labels that name one NFS mount on one node. */
const MOUNT = ['node', 'mount'] as const;
const MOUNT_LEGEND = '{{node}} {{mount}}';
const OPERATION = [...MOUNT, 'operation'] as const;
const OPERATION_LEGEND = '{{node}} {{mount}} {{operation}}';
/** Slot utilisation from which a mount counts as saturated (requests queue for a slot). */
const SATURATED_SLOTS = 0.9;

export function saturatedMountsStat() {
  return statPanel({
    title: 'Mounts with saturated RPC slots',
    description: `Mounts whose RPC slot table is at least ${SATURATED_SLOTS * 100} % used now: further requests wait in the backlog.`,
    unit: unit.count,
    queries: [{ expr: `count(${nodeSeries('steadfast_nfs_rpc_slot_utilization_ratio')} >= ${SATURATED_SLOTS}) or vector(0)`, instant: true }],
    width: 6,
  }).thresholds(thresholdsRedFrom(1));
}

export function mountsTable() {
  return tablePanel({
    title: 'NFS mounts',
    description: 'Each NFS mount: export, mount point, NFS version and transport protocol.',
    unit: unit.count,
    queries: [{ expr: aggregateBy('max', [...MOUNT, 'export', 'mountpoint', 'version', 'protocol'], nodeSeries('steadfast_nfs_mount_info')) }],
    width: 18,
  });
}

export function slotUtilizationPanel() {
  return timeseriesPanel({
    title: 'RPC slot utilisation',
    description: 'Requests in flight per RPC slot between two scrapes, per mount. At 1 the table is full and requests wait in the backlog.',
    unit: unit.ratio,
    queries: [{ expr: aggregateBy('max', MOUNT, nodeSeries('steadfast_nfs_rpc_slot_utilization_ratio')), legend: MOUNT_LEGEND }],
  })
    .min(0)
    .thresholds(thresholdsRedFrom(SATURATED_SLOTS));
}

export function backlogPanel() {
  return timeseriesPanel({
    title: 'RPC backlog',
    description: 'Average requests waiting for a free slot per send, per mount, between two scrapes; above 0 the slot table is the bottleneck.',
    unit: unit.count,
    queries: [{ expr: aggregateBy('max', MOUNT, nodeSeries('steadfast_nfs_rpc_backlog_average')), legend: MOUNT_LEGEND }],
  });
}

export function slotTableSizePanel() {
  return timeseriesPanel({
    title: 'RPC slot table size',
    description: 'Slots the transport has allocated per mount (sunrpc.tcp_max_slot_table_entries caps it).',
    unit: unit.count,
    queries: [{ expr: sumBy(MOUNT, nodeSeries('steadfast_nfs_transport_max_slots')), legend: MOUNT_LEGEND }],
  });
}

export function operationsPanel() {
  return timeseriesPanel({
    title: 'NFS operations',
    description: 'RPC operations per second per mount and operation.',
    unit: unit.perSecond,
    queries: [{ expr: `${sumBy(OPERATION, rate(nodeSeries('steadfast_nfs_operations_total')))} > 0`, legend: OPERATION_LEGEND }],
  });
}

/** Mean seconds per operation of one mountstats time counter (queue, RTT or execute). */
function perOperationSeconds(metric: string): string {
  return ratioOfRates(nodeSeries(metric), nodeSeries('steadfast_nfs_operations_total'), OPERATION);
}

export function operationLatencyPanel() {
  return timeseriesPanel({
    title: 'NFS latency per operation',
    description: `Mean seconds per operation over ${RATE_WINDOW}: execute is the whole request as the client sees it, RTT the server round trip; a gap between them is time queued for a slot.`,
    unit: unit.seconds,
    queries: [
      { expr: perOperationSeconds('steadfast_nfs_execute_seconds_total'), legend: `${OPERATION_LEGEND} execute` },
      { expr: perOperationSeconds('steadfast_nfs_rtt_seconds_total'), legend: `${OPERATION_LEGEND} RTT` },
    ],
  });
}

export function operationQueuePanel() {
  return timeseriesPanel({
    title: 'NFS queue time per operation',
    description: `Mean seconds an operation waited before it was sent, over ${RATE_WINDOW}: grows when the slot table is full.`,
    unit: unit.seconds,
    queries: [{ expr: perOperationSeconds('steadfast_nfs_queue_seconds_total'), legend: OPERATION_LEGEND }],
  });
}

export function nfsThroughputPanel() {
  return timeseriesPanel({
    title: 'NFS throughput',
    description: 'Bytes per second read and written by applications per mount (writes below the axis).',
    unit: unit.bytesPerSecond,
    queries: [
      { expr: sumBy(MOUNT, rate(nodeSeries('steadfast_nfs_read_bytes_total'))), legend: `${MOUNT_LEGEND} read` },
      { expr: `-${sumBy(MOUNT, rate(nodeSeries('steadfast_nfs_write_bytes_total')))}`, legend: `${MOUNT_LEGEND} write` },
    ],
  });
}

export function nfsTimeoutsPanel() {
  return timeseriesPanel({
    title: 'Major timeouts and errors',
    description: `Major RPC timeouts and operation errors over ${RATE_WINDOW}, per mount: the server stopped answering in time.`,
    unit: unit.count,
    queries: [
      { expr: sumBy(MOUNT, increase(nodeSeries('steadfast_nfs_major_timeouts_total'))), legend: `${MOUNT_LEGEND} major timeouts` },
      { expr: sumBy(MOUNT, increase(nodeSeries('steadfast_nfs_errors_total'))), legend: `${MOUNT_LEGEND} errors` },
    ],
  });
}

export function storageDashboard(): Dashboard {
  const builder = steadfastDashboard({
    uid: STORAGE_UID,
    title: STORAGE_TITLE,
    description: 'NFS on the selected nodes: RPC slot saturation and backlog, per-operation latency, throughput.',
  })
    .withVariable(nodeVariable('steadfast_nfs_mount_info'))
    .withRow(new RowBuilder('RPC slots'))
    .withPanel(saturatedMountsStat())
    .withPanel(mountsTable())
    .withPanel(slotUtilizationPanel())
    .withPanel(backlogPanel())
    .withRow(new RowBuilder('Operations'))
    .withPanel(operationLatencyPanel())
    .withPanel(operationQueuePanel())
    .withPanel(operationsPanel())
    .withPanel(nfsThroughputPanel())
    .withPanel(nfsTimeoutsPanel())
    .withPanel(slotTableSizePanel());
  return numberPanels(builder.build());
}
