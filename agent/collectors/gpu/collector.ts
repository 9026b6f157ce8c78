import { execFile } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { promisify } from 'node:util';
import { errorMessage } from '../../../core/errors.js';
import { errnoCode } from '../../log-follower.js';
import type { Collector, CollectorContext, CollectorFactory, CollectorStartOptions } from '../../collector.js';
import { DCGM_EXPORTER_URL_FLAG, fetchDcgmExporterText, gpuKey, parseDcgmExporterText, type DcgmGpuSample } from '../../sources/dcgm-exporter.js';
import { GPU_SOURCE_FLAG, GpuSourceChoice, NVML_LIBRARY_FLAG, DEFAULT_NVML_LIBRARY, type ResolvedGpuSource } from '../../gpu-source.js';
import { nvmlGpuSource } from './nvml.js';
import { parseNvidiaSmiXml } from '../../sources/nvidia-smi-xml.js';
import { BackgroundPoll } from '../../background-poll.js';
import type { GpuProcessHolding } from '../../gpu-processes.js';
import { COMPUTE_APPS_QUERY, parseComputeApps, type ComputeApp } from '../../sources/nvidia-smi-compute-apps.js';
import { GpuMetrics, gpuLabels, writeProcesses, writeSample, type GpuLabels } from './metrics.js';
import { gpuQueryFailures, isTimeout } from './query-health.js';

/**
 * The `gpu` collector: NVML in-process (nvml.ts), `nvidia-smi -q -x`, or a dcgm-exporter
 * endpoint, as --gpu.source chooses (gpu-source.ts), polled in the background so that a scrape
 * never waits on it (nvidia-smi can hang for tens of seconds on a sick GPU). A GPU that was listed once and is missing from a later
 * poll keeps `steadfast_gpu_present 0`: that is how a lost GPU (Xid 79 and friends) shows up
 * even when the kernel log says nothing.
 */

export interface GpuCollectorOptions {
  /** Longest an nvidia-smi run may take before it is killed and the poll counted as failed. */
  readonly commandTimeoutMs?: number;
  /** Longest a dcgm-exporter request may take before the poll is counted as failed. */
  readonly httpTimeoutMs?: number;
  /** Longest an NVML poll may take (normally milliseconds) before it is counted as timed out. */
  readonly nvmlTimeoutMs?: number;
}

const DEFAULT_COMMAND_TIMEOUT_MS = 30_000;
const DEFAULT_NVML_TIMEOUT_MS = 10_000;
const DEFAULT_HTTP_TIMEOUT_MS = 10_000;
/** nvidia-smi -q -x is about 20 KB per GPU (more with MIG and process lists). */
const MAX_OUTPUT_BYTES = 64 * 1024 * 1024;

const execFileAsync = promisify(execFile);

/** What one poll of either source yields; a GpuSample from nvidia-smi is a DcgmGpuSample without the DCGM-only fields. */
interface GpuReport {
  readonly gpus: readonly DcgmGpuSample[];
  /** Compute processes from `nvidia-smi --query-compute-apps`, where the GPUs' own report lists none. */
  readonly computeApps?: readonly ComputeApp[] | undefined;
}

/** Where the GPU readings come from: NVML, nvidia-smi or dcgm-exporter. */
interface GpuSource {
  /** Names the source in errors and logs: `nvidia-smi`, `dcgm-exporter at http://…`. */
  readonly description: string;
  /** The `command` label of steadfast_gpu_query_failures_total. */
  readonly command: string;
  read(signal: AbortSignal): Promise<GpuReport>;
  close?(): Promise<void>;
}

/** `--gpu.source=nvml` with a library that does not load: every poll fails, saying why. */
function unavailableSource(reason: string): GpuSource {
  return {
    description: 'NVML',
    command: 'nvml',
    read: () => Promise.reject(new Error(reason)),
  };
}

/** `nvidia-smi -q -x`: the binary, or a captured file read at every poll. */
function nvidiaSmiSource(context: CollectorContext, commandTimeoutMs: number): GpuSource {
  const { nvidiaSmiXml, nvidiaSmi } = context.paths;
  return {
    description: 'nvidia-smi',
    command: 'nvidia-smi -q -x',
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
function dcgmExporterSource(url: URL, httpTimeoutMs: number, context: CollectorContext, commandTimeoutMs: number): GpuSource {
  const { logger } = context;
  const description = `dcgm-exporter at ${url.href}`;
  // Logged when the number of bad lines changes, not at every poll.
  let badLines = 0;
  const computeApps = computeAppsReader(context, commandTimeoutMs);
  return {
    description,
    command: 'dcgm-exporter',
    async read(signal) {
      const report = parseDcgmExporterText(await fetchDcgmExporterText(url, httpTimeoutMs, signal));
      if (report.gpus.length === 0 && report.unidentifiedSeries > 0) {
        throw new Error(`${report.unidentifiedSeries} GPU series have neither a pci_bus_id nor a UUID label; steadfast cannot tell the GPUs apart`);
      }
      if (report.lineErrorCount !== badLines && report.lineErrorCount > 0) {
        logger.warn(
          { collector: 'gpu', source: description, lines: report.lineErrorCount, first: report.lineErrors[0] },
          'dcgm-exporter sent lines that do not parse; skipped them',
        );
      }
      badLines = report.lineErrorCount;
      return { gpus: report.gpus, computeApps: await computeApps(signal) };
    },
  };
}

/**
 * dcgm-exporter names no pids; `nvidia-smi --query-compute-apps` does, where nvidia-smi is
 * installed beside it. Its failure never fails the poll: the processes are then unknown. A node
 * without nvidia-smi is not asked again.
 */
function computeAppsReader(context: CollectorContext, commandTimeoutMs: number): (signal: AbortSignal) => Promise<readonly ComputeApp[] | undefined> {
  let absent = false;
  let lastError: string | undefined;
  return async (signal) => {
    if (absent || context.gpuProcesses === undefined) return undefined;
    try {
      const { stdout } = await execFileAsync(context.paths.nvidiaSmi, COMPUTE_APPS_QUERY, {
        timeout: commandTimeoutMs,
        killSignal: 'SIGKILL',
        maxBuffer: MAX_OUTPUT_BYTES,
        signal,
        encoding: 'utf8',
      });
      lastError = undefined;
      return parseComputeApps(stdout);
    } catch (error) {
      if (errnoCode(error) === 'ENOENT') {
        absent = true;
        context.logger.info({ collector: 'gpu', binary: context.paths.nvidiaSmi }, 'no nvidia-smi beside dcgm-exporter; GPU processes are not listed');
      } else if (errorMessage(error) !== lastError) {
        lastError = errorMessage(error);
        context.logger.warn({ collector: 'gpu', err: lastError }, 'nvidia-smi --query-compute-apps failed; GPU processes are not listed');
      }
      return undefined;
    }
  };
}

class GpuCollector implements Collector {
  readonly name = 'gpu';
  private readonly metrics: GpuMetrics;
  private readonly failures;
  /** Every GPU seen since start, by PCI bus id (UUID without one), with the labels it was last seen under. */
  private readonly seen = new Map<string, GpuLabels>();
  /** GPUs missing right now; a fast-path event goes out once per disappearance. */
  private readonly missing = new Set<string>();
  private readonly poller: BackgroundPoll;
  private lastError: Error | undefined;
  private source: GpuSource | undefined;
  private acquired = false;

  constructor(
    private readonly context: CollectorContext,
    private readonly choice: GpuSourceChoice,
    private readonly makeSource: (resolved: ResolvedGpuSource, pollNow: () => void) => GpuSource,
  ) {
    this.metrics = new GpuMetrics(context.registry);
    this.failures = gpuQueryFailures(context.registry);
    this.poller = new BackgroundPoll(context.pollIntervalSeconds * 1000, () => this.poll());
  }

  async start(options?: CollectorStartOptions): Promise<void> {
    // Until the first read, scrapes carry steadfast_gpu_poll_age_seconds counted from here.
    this.metrics.pollingSince(Date.now() / 1000);
    if (this.source === undefined) {
      this.acquired = true;
      this.source = this.makeSource(await this.choice.acquire(), () => this.poller.now());
    }
    await this.poller.start(options?.waitForFirstRead);
  }

  /** Fails when the last poll failed; while the first one runs there is nothing to fail on, only an age. */
  async update(): Promise<void> {
    if (this.lastError) throw this.lastError;
  }

  async close(): Promise<void> {
    await this.poller.close();
    await this.source?.close?.();
    if (this.acquired) {
      this.acquired = false;
      await this.choice.release();
    }
  }

  private async poll(): Promise<void> {
    const source = this.source;
    if (source === undefined) return;
    try {
      const report = await source.read(this.poller.signal);
      if (this.poller.closed) return;
      this.apply(report);
      if (this.lastError) this.context.logger.info({ collector: this.name }, `${source.description} readable again`);
      this.lastError = undefined;
    } catch (error) {
      if (this.poller.closed) return;
      // A query stuck on a sick GPU is a signal, not a gap: counted, and alerted on (SteadfastGpuQueryStuck).
      this.failures.inc({ command: source.command, reason: isTimeout(error) ? 'timeout' : 'error' });
      const failure = new Error(`cannot read ${source.description}: ${errorMessage(error)}`, { cause: error });
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
      const message = `GPU ${labels.gpu} (${id}) is no longer listed by ${this.source?.description ?? 'the GPU source'}`;
      this.context.logger.error({ gpu: id }, message);
      // The fast path names a GPU by PCI bus id; one known by UUID alone is reported by the
      // SteadfastGpuMissing alert on steadfast_gpu_present 0, for its node.
      if (labels.pci_bus_id !== undefined)
        this.context.fastPath({ kind: 'gpu_lost', node: this.context.node, gpu: labels.pci_bus_id, message, time: new Date().toISOString() });
    }
    this.metrics.writeTotals(report.gpus.length, Date.now() / 1000);
    const holdings = gpuHoldings(report);
    writeProcesses(this.metrics, holdings ?? []);
    this.context.gpuProcesses?.update(holdings);
  }
}

/** Which process holds which GPU, from the GPUs' own lists or from the compute-apps query. */
function gpuHoldings(report: GpuReport): GpuProcessHolding[] | undefined {
  const listed = report.gpus.some((sample) => sample.processes !== undefined);
  if (!listed && report.computeApps === undefined) return undefined;
  const holdings: GpuProcessHolding[] = [];
  for (const sample of report.gpus) {
    const labels = gpuLabels(sample);
    const where = { gpu: labels.gpu, pciBusId: sample.pciBusId, uuid: sample.uuid };
    for (const process of sample.processes ?? []) holdings.push({ ...process, ...where });
    for (const app of report.computeApps ?? []) {
      const same = (app.uuid !== undefined && app.uuid === sample.uuid) || (app.pciBusId !== undefined && app.pciBusId === sample.pciBusId);
      if (same) holdings.push({ pid: app.pid, type: 'C', name: app.name, usedMemoryBytes: app.usedMemoryBytes, ...where });
    }
  }
  return holdings;
}

/**
 * The gpu collector on the source its settings name (gpu-source.ts). Throws InputError naming
 * the flag when a value is wrong (an unknown source, a URL that is not one).
 */
export function createGpuCollector(context: CollectorContext, options: GpuCollectorOptions = {}): Collector {
  const choice = context.gpuSource ?? new GpuSourceChoice(context);
  const commandTimeoutMs = options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS;
  return new GpuCollector(context, choice, (resolved, pollNow) => {
    switch (resolved.kind) {
      case 'nvml':
        return nvmlGpuSource(context, resolved.nvml, options.nvmlTimeoutMs ?? DEFAULT_NVML_TIMEOUT_MS, pollNow);
      case 'nvml-unavailable':
        return unavailableSource(resolved.reason);
      case 'dcgm-exporter':
        return dcgmExporterSource(resolved.url, options.httpTimeoutMs ?? DEFAULT_HTTP_TIMEOUT_MS, context, commandTimeoutMs);
      case 'nvidia-smi':
        return nvidiaSmiSource(context, commandTimeoutMs);
    }
  });
}

export const gpuCollectorFactory: CollectorFactory = {
  name: 'gpu',
  defaultEnabled: true,
  help: 'GPU health from NVML (in-process), nvidia-smi -q -x or dcgm-exporter: temperature, power, clocks, throttle reasons, memory, ECC, remapped rows, retired pages, PCIe, fabric, processes, presence; Xid events from NVML.',
  flags: [
    {
      name: GPU_SOURCE_FLAG,
      value: '<source>',
      description:
        'where to read the GPUs: nvml (libnvidia-ml in-process, microseconds a value), nvidia-smi (runs nvidia-smi -q -x at every poll), dcgm-exporter (needs --gpu.dcgm-exporter-url), or auto: dcgm-exporter or nvidia-smi where their flags are given, else NVML when the library loads, else nvidia-smi',
      default: 'auto',
    },
    {
      name: NVML_LIBRARY_FLAG,
      value: '<file>',
      description: 'the NVML library to load (a name the dynamic loader looks up, or a path)',
      default: DEFAULT_NVML_LIBRARY,
    },
    {
      name: DCGM_EXPORTER_URL_FLAG,
      value: '<url>',
      description:
        'poll this dcgm-exporter /metrics endpoint (e.g. http://127.0.0.1:9400/metrics) instead of running nvidia-smi; GPUs without a pci_bus_id label (dcgm-exporter before mid-2024) are known by UUID; takes precedence over --nvidia-smi.xml',
    },
  ],
  create: (context) => createGpuCollector(context),
};
