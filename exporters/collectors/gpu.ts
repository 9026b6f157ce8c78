import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { Counter, Gauge, type Registry } from 'prom-client';
import { errorMessage } from '../../core/errors.js';
import type { Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { DCGM_EXPORTER_URL_FLAG, dcgmExporterUrl, fetchDcgmExporterText, gpuKey, parseDcgmExporterText, type DcgmGpuSample } from '../sources/dcgm-exporter.js';
import { parseNvidiaSmiXml, type ClockReadings } from '../sources/nvidia-smi-xml.js';

/**
 * The `gpu` collector: `nvidia-smi -q -x`, or with --gpu.dcgm-exporter-url a dcgm-exporter
 * endpoint, polled in the background so that a scrape never waits on it (nvidia-smi can hang
 * for tens of seconds on a sick GPU). A GPU that was listed once and is missing from a later
 * poll keeps `steadfast_gpu_present 0`: that is how a lost GPU (Xid 79 and friends) shows up
 * even when the kernel log says nothing.
 */

export interface GpuCollectorOptions {
  /** Longest an nvidia-smi run may take before it is killed and the poll counted as failed. */
  readonly commandTimeoutMs?: number;
  /** Longest a dcgm-exporter request may take before the poll is counted as failed. */
  readonly httpTimeoutMs?: number;
}

const DEFAULT_COMMAND_TIMEOUT_MS = 30_000;
const DEFAULT_HTTP_TIMEOUT_MS = 10_000;
/** nvidia-smi -q -x is about 20 KB per GPU (more with MIG and process lists). */
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

const execFileAsync = promisify(execFile);

/**
 * Every per-GPU series carries the GPU's `UUID` under dcgm-exporter's own label name, so that a
 * query relates it to DCGM's series with `on (UUID)`, no label_replace needed. `pci_bus_id` is
 * steadfast's `dddd:bb:dd` (the kernel log's spelling, which the xid series and the alerts use).
 */
type GpuLabel = 'gpu' | 'pci_bus_id' | 'UUID';

/** What one poll of either source yields; a GpuSample from nvidia-smi is a DcgmGpuSample without the DCGM-only fields. */
interface GpuReport {
  readonly gpus: readonly DcgmGpuSample[];
}

/** Where the GPU readings come from: nvidia-smi or dcgm-exporter. */
interface GpuSource {
  /** Names the source in errors and logs: `nvidia-smi`, `dcgm-exporter at http://…`. */
  readonly description: string;
  read(signal: AbortSignal): Promise<GpuReport>;
}

/** Every series the collector exports; made once per collector on the agent's registry. */
class GpuMetrics {
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
  /**
   * Label-less gauges start at 0 in prom-client; these are registered at the first good poll
   * instead, so that no fake 0 is exported before the source has answered.
   */
  private readonly attached: Gauge;
  private readonly lastPoll: Gauge;
  private readonly pollAge: Gauge;
  private totalsRegistered = false;
  /** Unix time (seconds) of the last good poll. */
  private polledAt = 0;

  constructor(private readonly registry: Registry) {
    const registers = [registry];
    const gauge = <L extends string = GpuLabel>(name: string, help: string, labelNames: readonly L[]): Gauge<L> =>
      new Gauge<L>({ name, help, labelNames, registers });
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]): Counter<L> =>
      new Counter<L>({ name, help, labelNames, registers });
    const gpu = ['gpu', 'pci_bus_id', 'UUID'] as const;
    this.info = gauge('steadfast_gpu_info', 'GPU identity; always 1.', [...gpu, 'uuid', 'name', 'driver_version']);
    this.present = gauge('steadfast_gpu_present', 'Whether the GPU source (nvidia-smi or dcgm-exporter) lists this GPU (1), or listed it before and no longer does (0).', gpu);
    this.attached = new Gauge({ name: 'steadfast_gpu_attached', help: 'Number of GPUs the GPU source lists.', registers: [] });
    this.temperature = gauge('steadfast_gpu_temperature_celsius', 'GPU core temperature.', gpu);
    this.memoryTemperature = gauge('steadfast_gpu_memory_temperature_celsius', 'GPU memory (HBM) temperature.', gpu);
    this.power = gauge('steadfast_gpu_power_watts', 'Board power draw.', gpu);
    this.powerLimit = gauge('steadfast_gpu_power_limit_watts', 'Power limit in force.', gpu);
    this.utilization = gauge('steadfast_gpu_utilization_ratio', 'Fraction of the last sample period a kernel was running (0..1).', gpu);
    this.memoryUsed = gauge('steadfast_gpu_memory_used_bytes', 'Frame buffer memory in use.', gpu);
    this.memoryTotal = gauge('steadfast_gpu_memory_total_bytes', 'Frame buffer memory size.', gpu);
    this.ecc = counter('steadfast_gpu_ecc_errors_total', 'ECC errors as counted by the driver; scope volatile (since driver load) or aggregate (lifetime).', [
      ...gpu,
      'scope',
      'type',
      'location',
    ]);
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
    this.throttleReason = gauge('steadfast_gpu_throttle_reason', 'Whether this reason is holding the clocks down right now (1) or not (0).', [...gpu, 'reason']);
    this.dcgmLastXid = gauge(
      'steadfast_gpu_dcgm_last_xid',
      'Code of the last Xid error DCGM saw on this GPU (0: none); a last value, not a count (see steadfast_xid_errors_total).',
      gpu,
    );
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

  /** Exports the node-wide series once there is a real value for them. */
  writeTotals(attached: number, polledAt: number): void {
    if (!this.totalsRegistered) {
      this.registry.registerMetric(this.attached);
      this.registry.registerMetric(this.lastPoll);
      this.registry.registerMetric(this.pollAge);
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
    ]) {
      metric.reset();
    }
  }
}

type GpuLabels = Partial<Record<GpuLabel, string>> & { readonly gpu: string };

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

/** Writes one GPU's sample. Hardware counters are absolute readings, so reset() + inc(value) sets them. */
function writeSample(metrics: GpuMetrics, sample: DcgmGpuSample): void {
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
    metrics.ecc.inc({ ...labels, scope: ecc.scope, type: ecc.type, location: ecc.location }, ecc.count);
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
}

/** A GPU's labels: each identifier it has, none made up. */
function gpuLabels(sample: DcgmGpuSample): GpuLabels {
  const labels: { gpu: string; pci_bus_id?: string; UUID?: string } = { gpu: String(sample.index) };
  if (sample.pciBusId !== undefined) labels.pci_bus_id = sample.pciBusId;
  if (sample.uuid !== undefined) labels.UUID = sample.uuid;
  return labels;
}

/** `nvidia-smi -q -x`: the binary, or a captured file read at every poll. */
function nvidiaSmiSource(context: CollectorContext, commandTimeoutMs: number): GpuSource {
  const { nvidiaSmiXml, nvidiaSmi } = context.paths;
  return {
    description: 'nvidia-smi',
    async read(signal) {
      if (nvidiaSmiXml !== undefined) return parseNvidiaSmiXml(await readFile(nvidiaSmiXml, { encoding: 'utf8', signal }));
      const { stdout } = await execFileAsync(nvidiaSmi, ['-q', '-x'], {
        timeout: commandTimeoutMs,
        killSignal: 'SIGKILL',
        maxBuffer: MAX_OUTPUT_BYTES,
        signal,
        encoding: 'utf8',
      });
      return parseNvidiaSmiXml(stdout);
    },
  };
}

/**
 * dcgm-exporter's /metrics. GPUs are placed by `pci_bus_id`, or by `UUID` where the exporter
 * sets no `pci_bus_id` (before mid-2024, NVIDIA/dcgm-exporter#326). A body with GPU series of
 * which none can be placed is a failed poll, not a node without GPUs.
 */
function dcgmExporterSource(url: URL, httpTimeoutMs: number, logger: CollectorContext['logger']): GpuSource {
  const description = `dcgm-exporter at ${url.href}`;
  // Logged when the number of bad lines changes, not at every poll.
  let badLines = 0;
  return {
    description,
    async read(signal) {
      const report = parseDcgmExporterText(await fetchDcgmExporterText(url, httpTimeoutMs, signal));
      if (report.gpus.length === 0 && report.unidentifiedSeries > 0) {
        throw new Error(`${report.unidentifiedSeries} GPU series have neither a pci_bus_id nor a UUID label; steadfast cannot tell the GPUs apart`);
      }
      if (report.lineErrorCount !== badLines && report.lineErrorCount > 0) {
        logger.warn({ collector: 'gpu', source: description, lines: report.lineErrorCount, first: report.lineErrors[0] }, 'dcgm-exporter sent lines that do not parse; skipped them');
      }
      badLines = report.lineErrorCount;
      return report;
    },
  };
}

class GpuCollector implements Collector {
  readonly name = 'gpu';
  private readonly metrics: GpuMetrics;
  /** Every GPU seen since start, by PCI bus id (UUID without one), with the labels it was last seen under. */
  private readonly seen = new Map<string, GpuLabels>();
  /** GPUs missing right now; a fast-path event goes out once per disappearance. */
  private readonly missing = new Set<string>();
  private readonly abort = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private closed = false;
  private polledOnce = false;
  private lastError: Error | undefined;

  constructor(
    private readonly context: CollectorContext,
    private readonly source: GpuSource,
  ) {
    this.metrics = new GpuMetrics(context.registry);
  }

  async start(): Promise<void> {
    if (this.running || this.closed) return;
    this.running = this.poll();
    await this.running;
    this.schedule();
  }

  async update(): Promise<void> {
    if (this.lastError) throw this.lastError;
    if (!this.polledOnce) throw new Error(`${this.source.description} has not been read yet`);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    this.abort.abort();
    await this.running;
  }

  private schedule(): void {
    if (this.closed) return;
    this.timer = setTimeout(() => {
      this.running = this.poll().finally(() => this.schedule());
    }, this.context.pollIntervalSeconds * 1000);
    // The agent's HTTP server keeps the process alive; this timer alone must not.
    this.timer.unref();
  }

  private async poll(): Promise<void> {
    try {
      const report = await this.source.read(this.abort.signal);
      if (this.closed) return;
      this.apply(report);
      if (this.lastError) this.context.logger.info({ collector: this.name }, `${this.source.description} readable again`);
      this.lastError = undefined;
      this.polledOnce = true;
    } catch (error) {
      if (this.closed) return;
      const failure = new Error(`cannot read ${this.source.description}: ${errorMessage(error)}`, { cause: error });
      if (this.lastError?.message !== failure.message) this.context.logger.warn({ collector: this.name, err: failure.message }, 'gpu poll failed');
      // The values of the last good poll stay exported; steadfast_gpu_poll_age_seconds shows their age.
      this.lastError = failure;
    }
  }

  private apply(report: GpuReport): void {
    const listed = new Set(report.gpus.map(gpuKey));
    this.metrics.resetPerGpu();
    for (const sample of report.gpus) {
      writeSample(this.metrics, sample);
      const key = gpuKey(sample);
      this.seen.set(key, gpuLabels(sample));
      if (this.missing.delete(key)) this.context.logger.info({ gpu: sample.pciBusId ?? sample.uuid }, 'GPU is listed again');
    }
    for (const [key, labels] of this.seen) {
      if (listed.has(key)) continue;
      this.metrics.present.set(labels, 0);
      if (this.missing.has(key)) continue;
      this.missing.add(key);
      const id = labels.pci_bus_id ?? labels.UUID;
      const message = `GPU ${labels.gpu} (${id}) is no longer listed by ${this.source.description}`;
      this.context.logger.error({ gpu: id }, message);
      // The fast path names a GPU by PCI bus id; one known by UUID alone is reported by the
      // SteadfastGpuMissing alert on steadfast_gpu_present 0, for its node.
      if (labels.pci_bus_id !== undefined) this.context.fastPath({ kind: 'gpu_lost', node: this.context.node, gpu: labels.pci_bus_id, message, time: new Date().toISOString() });
    }
    this.metrics.writeTotals(report.gpus.length, Date.now() / 1000);
  }
}

/**
 * The gpu collector on the source its settings name: dcgm-exporter when `gpu.dcgm-exporter-url`
 * is set, nvidia-smi otherwise. Throws InputError naming the flag when its value is not a URL.
 */
export function createGpuCollector(context: CollectorContext, options: GpuCollectorOptions = {}): Collector {
  const url = dcgmExporterUrl(context.settings[DCGM_EXPORTER_URL_FLAG]);
  const source =
    url === undefined
      ? nvidiaSmiSource(context, options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS)
      : dcgmExporterSource(url, options.httpTimeoutMs ?? DEFAULT_HTTP_TIMEOUT_MS, context.logger);
  return new GpuCollector(context, source);
}

export const gpuCollectorFactory: CollectorFactory = {
  name: 'gpu',
  defaultEnabled: true,
  help: 'GPU health from nvidia-smi -q -x or dcgm-exporter: temperature, power, clocks, throttle reasons, memory, ECC, remapped rows, retired pages, PCIe, presence.',
  flags: [
    {
      name: DCGM_EXPORTER_URL_FLAG,
      value: '<url>',
      description:
        'poll this dcgm-exporter /metrics endpoint (e.g. http://127.0.0.1:9400/metrics) instead of running nvidia-smi; GPUs without a pci_bus_id label (dcgm-exporter before mid-2024) are known by UUID; takes precedence over --nvidia-smi.xml',
    },
  ],
  create: (context) => createGpuCollector(context),
};
