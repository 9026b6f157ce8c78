import { Counter, Gauge, type Registry } from 'prom-client';
import type { GpuProcessHolding } from '../../gpu-processes.js';
import type { DcgmGpuSample } from '../../sources/dcgm-exporter.js';
import { isComputeProcess, type ClockReadings } from '../../sources/nvidia-smi-xml.js';
import { gpuHealthAction } from './health-action.js';

/** The gpu collector's series, and how one GPU sample is written into them. */

/**
 * Every per-GPU series carries the GPU's `UUID` under dcgm-exporter's own label name, so that a
 * query relates it to DCGM's series with `on (UUID)`, no label_replace needed. `pci_bus_id` is
 * steadfast's `dddd:bb:dd` (the kernel log's spelling, which the xid series and the alerts use).
 */
export type GpuLabel = 'gpu' | 'pci_bus_id' | 'UUID';

/** Series of steadfast_gpu_process_info a poll writes at most (8 GPUs × 8 ranks and some to spare). */
export const MAX_GPU_PROCESS_SERIES = 256;

/** Every series the collector exports; made once per collector on the agent's registry. */
export class GpuMetrics {
  readonly info;
  readonly present;
  readonly temperature;
  readonly memoryTemperature;
  readonly power;
  readonly powerLimit;
  readonly utilization;
  readonly memoryUsed;
  readonly memoryTotal;
  readonly ecc;
  readonly remappedRows;
  readonly remappedRowsPending;
  readonly remappedRowsFailure;
  readonly retiredPages;
  readonly retiredPagesPending;
  readonly pcieGeneration;
  readonly pcieWidth;
  readonly pcieReplays;
  readonly clock;
  readonly clockMax;
  readonly throttleReason;
  readonly dcgmLastXid;
  readonly fabricState;
  readonly fabricHealthy;
  readonly healthAction;
  readonly processInfo;
  readonly processMemory;
  /**
   * Label-less gauges start at 0 in prom-client; these are registered at the first good poll
   * instead, so that no fake 0 is exported before the source has answered.
   */
  private readonly attached: Gauge;
  private readonly lastPoll: Gauge;
  private readonly pollAge: Gauge;
  private totalsRegistered = false;
  private pollAgeRegistered = false;
  /** Unix time (seconds) of the last good poll (before the first: of the start of polling). */
  private polledAt = 0;

  constructor(private readonly registry: Registry) {
    const registers = [registry];
    const gauge = <L extends string = GpuLabel>(name: string, help: string, labelNames: readonly L[]): Gauge<L> =>
      new Gauge<L>({ name, help, labelNames, registers });
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]): Counter<L> =>
      new Counter<L>({ name, help, labelNames, registers });
    const gpu = ['gpu', 'pci_bus_id', 'UUID'] as const;
    this.info = gauge('steadfast_gpu_info', 'GPU identity; always 1.', [...gpu, 'uuid', 'name', 'driver_version']);
    this.present = gauge(
      'steadfast_gpu_present',
      'Whether the GPU source (NVML, nvidia-smi or dcgm-exporter) lists this GPU (1), or listed it before and no longer does (0).',
      gpu,
    );
    this.attached = new Gauge({ name: 'steadfast_gpu_attached', help: 'Number of GPUs the GPU source lists.', registers: [] });
    this.temperature = gauge('steadfast_gpu_temperature_celsius', 'GPU core temperature.', gpu);
    this.memoryTemperature = gauge('steadfast_gpu_memory_temperature_celsius', 'GPU memory (HBM) temperature.', gpu);
    this.power = gauge('steadfast_gpu_power_watts', 'Board power draw.', gpu);
    this.powerLimit = gauge('steadfast_gpu_power_limit_watts', 'Power limit in force.', gpu);
    this.utilization = gauge('steadfast_gpu_utilization_ratio', 'Fraction of the last sample period a kernel was running (0..1).', gpu);
    this.memoryUsed = gauge('steadfast_gpu_memory_used_bytes', 'Frame buffer memory in use.', gpu);
    this.memoryTotal = gauge('steadfast_gpu_memory_total_bytes', 'Frame buffer memory size.', gpu);
    this.ecc = counter(
      'steadfast_gpu_ecc_errors_total',
      'ECC errors as counted by the driver; scope volatile (since driver load) or aggregate (lifetime). With MIG on, volatile uncorrectable SRAM errors are counted per MIG device (GPU_I_ID, compute_instance_id) and the GPU has no volatile series.',
      [...gpu, 'scope', 'type', 'location', 'GPU_I_ID', 'compute_instance_id'],
    );
    this.remappedRows = counter('steadfast_gpu_remapped_rows_total', 'Memory rows remapped, by the kind of error that caused it.', [...gpu, 'type']);
    this.remappedRowsPending = gauge('steadfast_gpu_remapped_rows_pending', 'Whether a row remap waits for the next GPU reset (1) or not (0).', gpu);
    this.remappedRowsFailure = gauge('steadfast_gpu_remapped_rows_failure', 'Whether a row remap has failed (1) or not (0).', gpu);
    this.retiredPages = counter('steadfast_gpu_retired_pages_total', 'Memory pages retired, by cause.', [...gpu, 'cause']);
    this.retiredPagesPending = gauge('steadfast_gpu_retired_pages_pending', 'Whether pages wait to be retired at the next driver reload (1) or not (0).', gpu);
    this.pcieGeneration = gauge('steadfast_gpu_pcie_link_generation', 'Current PCIe link generation.', gpu);
    this.pcieWidth = gauge('steadfast_gpu_pcie_link_width', 'Current PCIe link width (lanes).', gpu);
    this.pcieReplays = counter('steadfast_gpu_pcie_replay_errors_total', 'PCIe replays (link-level retransmissions).', gpu);
    this.clock = gauge('steadfast_gpu_clock_hertz', 'Current clock frequency, by clock domain.', [...gpu, 'clock']);
    this.clockMax = gauge('steadfast_gpu_clock_max_hertz', 'Highest clock frequency the GPU supports, by clock domain.', [...gpu, 'clock']);
    this.throttleReason = gauge('steadfast_gpu_throttle_reason', 'Whether this reason is holding the clocks down right now (1) or not (0).', [
      ...gpu,
      'reason',
    ]);
    this.dcgmLastXid = gauge(
      'steadfast_gpu_dcgm_last_xid',
      'Code of the last Xid error DCGM saw on this GPU (0: none); a last value, not a count (see steadfast_xid_errors_total).',
      gpu,
    );
    this.fabricState = gauge(
      'steadfast_gpu_fabric_state',
      'NVLink fabric registration state of the GPU (NVSwitch systems; fabric manager), 1 for the current state: not_started, in_progress, completed, ….',
      [...gpu, 'state'],
    );
    this.fabricHealthy = gauge('steadfast_gpu_fabric_status_success', "Whether the GPU's fabric registration status is Success (1) or an error (0).", gpu);
    this.healthAction = gauge(
      'steadfast_gpu_health_action',
      'What this GPU needs now, from its memory and clock state, 1 for the one that applies: action drain (now), reset_gpu (at the next idle moment), watch, none; reason names the cause.',
      [...gpu, 'action', 'reason'],
    );
    // Pids change with every job: the series are rewritten at each poll (resetPerGpu).
    this.processInfo = gauge(
      'steadfast_gpu_process_info',
      `A process holding a context on the GPU, as the GPU source lists it (at most ${MAX_GPU_PROCESS_SERIES}): pid in the agent's pid namespace, type C (compute), G (graphics) or C+G, and the process name; always 1.`,
      [...gpu, 'pid', 'type', 'name'],
    );
    this.processMemory = gauge('steadfast_gpu_process_used_memory_bytes', 'GPU memory the process holds on the GPU.', [...gpu, 'pid']);
    this.lastPoll = new Gauge({
      name: 'steadfast_gpu_last_poll_timestamp_seconds',
      help: 'When the GPU source was last read successfully (Unix time).',
      registers: [],
    });
    this.pollAge = new Gauge({
      name: 'steadfast_gpu_poll_age_seconds',
      help: 'Seconds since the GPU source was last read successfully, as of this scrape.',
      registers: [],
      // Computed when scraped: a poll loop that has stalled shows a growing age, not a frozen one.
      collect: () => {
        this.pollAge.set(Math.max(0, Date.now() / 1000 - this.polledAt));
      },
    });
  }

  /**
   * Exports steadfast_gpu_poll_age_seconds from the start of polling, before any read: a node
   * whose first nvidia-smi hangs shows a growing age, not nothing.
   */
  pollingSince(startedAt: number): void {
    if (this.polledAt !== 0 || this.pollAgeRegistered) return;
    this.polledAt = startedAt;
    this.registry.registerMetric(this.pollAge);
    this.pollAgeRegistered = true;
  }

  /** Exports the node-wide series once there is a real value for them. */
  writeTotals(attached: number, polledAt: number): void {
    if (!this.totalsRegistered) {
      // The age, exported since polling started, moves behind the other two (a stable exposition).
      if (this.pollAgeRegistered) this.registry.removeSingleMetric('steadfast_gpu_poll_age_seconds');
      this.registry.registerMetric(this.attached);
      this.registry.registerMetric(this.lastPoll);
      this.registry.registerMetric(this.pollAge);
      this.pollAgeRegistered = true;
      this.totalsRegistered = true;
    }
    this.attached.set(attached);
    this.lastPoll.set(polledAt);
    this.polledAt = polledAt;
  }

  /** Forgets every per-GPU series before a poll's values are written. */
  resetPerGpu(): void {
    for (const metric of [
      this.info,
      this.present,
      this.temperature,
      this.memoryTemperature,
      this.power,
      this.powerLimit,
      this.utilization,
      this.memoryUsed,
      this.memoryTotal,
      this.ecc,
      this.remappedRows,
      this.remappedRowsPending,
      this.remappedRowsFailure,
      this.retiredPages,
      this.retiredPagesPending,
      this.pcieGeneration,
      this.pcieWidth,
      this.pcieReplays,
      this.clock,
      this.clockMax,
      this.throttleReason,
      this.dcgmLastXid,
      this.fabricState,
      this.fabricHealthy,
      this.healthAction,
      this.processInfo,
      this.processMemory,
    ]) {
      metric.reset();
    }
  }
}

export type GpuLabels = Partial<Record<GpuLabel, string>> & { readonly gpu: string };

function setIfDefined(gauge: Gauge<GpuLabel>, labels: GpuLabels, value: number | undefined): void {
  if (value !== undefined) gauge.set(labels, value);
}

function asNumber(value: boolean | undefined): number | undefined {
  return value === undefined ? undefined : Number(value);
}

function writeClocks(gauge: Gauge<GpuLabel | 'clock'>, labels: GpuLabels, readings: ClockReadings | undefined): void {
  for (const [clock, hertz] of Object.entries(readings ?? {})) {
    if (hertz !== undefined) gauge.set({ ...labels, clock }, hertz);
  }
}

/** The processes on the GPUs, at most MAX_GPU_PROCESS_SERIES of them (compute ones first); call after resetPerGpu. */
export function writeProcesses(metrics: GpuMetrics, holdings: readonly GpuProcessHolding[]): void {
  const ordered = [...holdings].sort((a, b) => Number(isComputeProcess(b)) - Number(isComputeProcess(a)));
  for (const holding of ordered.slice(0, MAX_GPU_PROCESS_SERIES)) {
    const labels: GpuLabels = {
      gpu: holding.gpu,
      ...(holding.pciBusId === undefined ? {} : { pci_bus_id: holding.pciBusId }),
      ...(holding.uuid === undefined ? {} : { UUID: holding.uuid }),
    };
    const pid = String(holding.pid);
    metrics.processInfo.set({ ...labels, pid, type: holding.type ?? '', name: (holding.name ?? '').slice(0, 128) }, 1);
    if (holding.usedMemoryBytes !== undefined) metrics.processMemory.set({ ...labels, pid }, holding.usedMemoryBytes);
  }
}

/** Writes one GPU's sample. Hardware counters are absolute readings, so reset() + inc(value) sets them. */
export function writeSample(metrics: GpuMetrics, sample: DcgmGpuSample): void {
  const labels = gpuLabels(sample);
  const identity: Record<string, string> = { ...labels };
  if (sample.uuid !== undefined) identity.uuid = sample.uuid;
  if (sample.productName !== undefined) identity.name = sample.productName;
  if (sample.driverVersion !== undefined) identity.driver_version = sample.driverVersion;
  metrics.info.set(identity, 1);
  metrics.present.set(labels, 1);
  setIfDefined(metrics.temperature, labels, sample.temperatureCelsius);
  setIfDefined(metrics.memoryTemperature, labels, sample.memoryTemperatureCelsius);
  setIfDefined(metrics.power, labels, sample.powerDrawWatts);
  setIfDefined(metrics.powerLimit, labels, sample.powerLimitWatts);
  setIfDefined(metrics.utilization, labels, sample.utilizationRatio);
  setIfDefined(metrics.memoryUsed, labels, sample.memoryUsedBytes);
  setIfDefined(metrics.memoryTotal, labels, sample.memoryTotalBytes);
  for (const ecc of sample.ecc) {
    const instance: Partial<Record<'GPU_I_ID' | 'compute_instance_id', string>> = {};
    if (ecc.gpuInstance !== undefined) instance.GPU_I_ID = String(ecc.gpuInstance);
    if (ecc.computeInstance !== undefined) instance.compute_instance_id = String(ecc.computeInstance);
    metrics.ecc.inc({ ...labels, scope: ecc.scope, type: ecc.type, location: ecc.location, ...instance }, ecc.count);
  }
  const rows = sample.remappedRows;
  if (rows?.correctable !== undefined) metrics.remappedRows.inc({ ...labels, type: 'correctable' }, rows.correctable);
  if (rows?.uncorrectable !== undefined) metrics.remappedRows.inc({ ...labels, type: 'uncorrectable' }, rows.uncorrectable);
  setIfDefined(metrics.remappedRowsPending, labels, asNumber(rows?.pending));
  setIfDefined(metrics.remappedRowsFailure, labels, asNumber(rows?.failure));
  const pages = sample.retiredPages;
  if (pages?.singleBit !== undefined) metrics.retiredPages.inc({ ...labels, cause: 'multiple_single_bit' }, pages.singleBit);
  if (pages?.doubleBit !== undefined) metrics.retiredPages.inc({ ...labels, cause: 'double_bit' }, pages.doubleBit);
  setIfDefined(metrics.retiredPagesPending, labels, asNumber(pages?.pending));
  setIfDefined(metrics.pcieGeneration, labels, sample.pcieLinkGeneration);
  setIfDefined(metrics.pcieWidth, labels, sample.pcieLinkWidth);
  if (sample.pcieReplayErrors !== undefined) metrics.pcieReplays.inc(labels, sample.pcieReplayErrors);
  writeClocks(metrics.clock, labels, sample.clocks);
  writeClocks(metrics.clockMax, labels, sample.maxClocks);
  for (const [reason, active] of Object.entries(sample.throttleReasons ?? {})) {
    metrics.throttleReason.set({ ...labels, reason }, Number(active));
  }
  setIfDefined(metrics.dcgmLastXid, labels, sample.lastXid);
  if (sample.fabric?.state !== undefined) metrics.fabricState.set({ ...labels, state: sample.fabric.state }, 1);
  if (sample.fabric?.success !== undefined) metrics.fabricHealthy.set(labels, Number(sample.fabric.success));
  const { action, reason } = gpuHealthAction(sample);
  metrics.healthAction.set({ ...labels, action, reason }, 1);
}

/** A GPU's labels: each identifier it has, none made up. */
export function gpuLabels(sample: DcgmGpuSample): GpuLabels {
  const labels: { gpu: string; pci_bus_id?: string; UUID?: string } = { gpu: String(sample.index) };
  if (sample.pciBusId !== undefined) labels.pci_bus_id = sample.pciBusId;
  if (sample.uuid !== undefined) labels.UUID = sample.uuid;
  return labels;
}
