/**
 * GPU panels from the agent's gpu and xid collectors (nvidia-smi and the kernel log): health,
 * temperatures, power, clocks, throttling, memory errors. Used by the fleet overview and the
 * node detail dashboard; every query keeps `node` so the panels read the same on one node or many.
 */
import { RATE_WINDOW, aggregateBy, equals, increase, isEqual, notEquals, rate, sumBy } from '../core/promql.js';
import { nodeSeries } from './frame.js';
import { statPanel, tablePanel, thresholdsRedBelow, thresholdsRedFrom, timeseriesPanel, unit } from './panels.js';

/** Labels that name one GPU on one node. */
const GPU = ['node', 'gpu', 'pci_bus_id'] as const;
const GPU_LEGEND = '{{node}} GPU {{gpu}}';

function perGpu(metric: string, ...matchers: string[]): string {
  return aggregateBy('max', GPU, nodeSeries(metric, ...matchers));
}

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
    queries: [{ expr: `sum(${isEqual(nodeSeries('steadfast_gpu_present'), 0)}) or vector(0)`, instant: true }],
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

export function gpuInventoryTable() {
  return tablePanel({
    title: 'GPUs',
    description: 'Each GPU with its model, driver and UUID, as nvidia-smi reports them.',
    unit: unit.count,
    queries: [{ expr: aggregateBy('max', [...GPU, 'name', 'uuid', 'driver_version'], nodeSeries('steadfast_gpu_info')) }],
    width: 24,
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

export function xidsByCodePanel() {
  return timeseriesPanel({
    title: 'Xid errors by GPU and code',
    description: `New Xid errors over ${RATE_WINDOW}, every severity, by GPU (PCI bus id) and Xid code.`,
    unit: unit.count,
    queries: [
      {
        expr: sumBy(['node', 'pci_bus_id', 'xid', 'severity'], increase(nodeSeries('steadfast_xid_errors_total'))),
        legend: '{{pci_bus_id}} Xid {{xid}} ({{severity}})',
      },
    ],
  });
}

export function gpuTemperaturePanel(options: { memory?: boolean } = {}) {
  return timeseriesPanel({
    title: options.memory ? 'GPU and HBM temperature' : 'GPU temperature',
    description: options.memory ? 'Core and memory (HBM) temperature per GPU.' : 'Core temperature per GPU.',
    unit: unit.celsius,
    queries: [
      { expr: perGpu('steadfast_gpu_temperature_celsius'), legend: GPU_LEGEND },
      ...(options.memory ? [{ expr: perGpu('steadfast_gpu_memory_temperature_celsius'), legend: `${GPU_LEGEND} memory` }] : []),
    ],
  });
}

export function gpuPowerPanel(options: { limit?: boolean } = {}) {
  return timeseriesPanel({
    title: 'GPU power',
    description: options.limit ? 'Board power draw per GPU, and the enforced power limit.' : 'Board power draw per GPU.',
    unit: unit.watts,
    queries: [
      { expr: perGpu('steadfast_gpu_power_watts'), legend: GPU_LEGEND },
      ...(options.limit ? [{ expr: `max(${nodeSeries('steadfast_gpu_power_limit_watts')})`, legend: 'power limit (max)' }] : []),
    ],
  });
}

export function gpuUtilizationPanel() {
  return timeseriesPanel({
    title: 'GPU utilisation',
    description: 'Fraction of the last sample period a kernel ran on each GPU.',
    unit: unit.ratio,
    queries: [{ expr: perGpu('steadfast_gpu_utilization_ratio'), legend: GPU_LEGEND }],
  })
    .min(0)
    .max(1);
}

export function gpuMemoryUsedPanel() {
  return timeseriesPanel({
    title: 'GPU memory used',
    description: 'Framebuffer memory in use per GPU.',
    unit: unit.bytes,
    queries: [{ expr: perGpu('steadfast_gpu_memory_used_bytes'), legend: GPU_LEGEND }],
  });
}

export function gpuClocksPanel() {
  const sm = equals('clock', 'sm');
  return timeseriesPanel({
    title: 'SM clock',
    description: 'Streaming-multiprocessor clock per GPU against its maximum: a GPU well below the others while busy is throttled or fail-slow.',
    unit: unit.hertz,
    queries: [
      { expr: perGpu('steadfast_gpu_clock_hertz', sm), legend: GPU_LEGEND },
      { expr: `max(${nodeSeries('steadfast_gpu_clock_max_hertz', sm)})`, legend: 'max SM clock' },
    ],
  });
}

export function gpuThrottlePanel() {
  return timeseriesPanel({
    title: 'Throttle reasons active',
    description: 'GPUs held back by each clock-event reason (idle excluded); thermal and power-brake reasons on a busy GPU slow the whole job.',
    unit: unit.count,
    queries: [
      {
        expr: sumBy(['node', 'reason'], nodeSeries('steadfast_gpu_throttle_reason', notEquals('reason', 'gpu_idle'))),
        legend: '{{node}} {{reason}}',
      },
    ],
  });
}

export function eccErrorsPanel() {
  return timeseriesPanel({
    title: 'ECC errors',
    description: `New ECC errors over ${RATE_WINDOW} per GPU and type (volatile counters, since the driver loaded).`,
    unit: unit.count,
    queries: [
      {
        expr: sumBy([...GPU, 'type'], increase(nodeSeries('steadfast_gpu_ecc_errors_total', equals('scope', 'volatile')))),
        legend: `${GPU_LEGEND} {{type}}`,
      },
    ],
  });
}

export function remappedRowsPanel() {
  return timeseriesPanel({
    title: 'Remapped rows',
    description:
      'HBM rows remapped per GPU by cause, rows waiting for a GPU reset to be remapped, and remap failures (a failure means the GPU must be replaced).',
    unit: unit.count,
    queries: [
      { expr: aggregateBy('max', [...GPU, 'type'], nodeSeries('steadfast_gpu_remapped_rows_total')), legend: `${GPU_LEGEND} {{type}}` },
      { expr: perGpu('steadfast_gpu_remapped_rows_pending'), legend: `${GPU_LEGEND} pending` },
      { expr: perGpu('steadfast_gpu_remapped_rows_failure'), legend: `${GPU_LEGEND} failure` },
    ],
  });
}

export function pcieReplaysPanel() {
  return timeseriesPanel({
    title: 'PCIe replays',
    description: 'PCIe replay errors per second per GPU: a degrading link or riser.',
    unit: unit.perSecond,
    queries: [{ expr: sumBy([...GPU], rate(nodeSeries('steadfast_gpu_pcie_replay_errors_total'))), legend: GPU_LEGEND }],
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
