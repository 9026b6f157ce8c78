import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { Counter } from 'prom-client';
import { errorMessage } from '../../core/errors.js';
import { errnoCode } from '../log-follower.js';
import type { Collector, CollectorContext, CollectorFactory, CollectorStartOptions } from '../collector.js';
import { BackgroundPoll } from '../background-poll.js';
import { parseNvlinkErrors, type NvlinkErrorCount } from '../sources/nvlink-errors.js';
import { gpuQueryFailures, isTimeout } from './gpu/query-health.js';
import { GpuSourceChoice, type ResolvedGpuSource } from '../gpu-source.js';

/**
 * The `nvlink` collector: per-link NVLink error counters from NVML where the GPUs are read
 * through it (--gpu.source, gpu-source.ts), else from `nvidia-smi nvlink -e`, polled in
 * the background under a time limit (a query stuck on a sick GPU is counted in
 * steadfast_gpu_query_failures_total, never waited on by a scrape). The rules drain a node whose
 * link errors climb past a threshold (rules/domains/gpu-fabric.ts). A node without the binary
 * (a CPU node), or an agent reading captured nvidia-smi XML, exports no NVLink series.
 */

const COMMAND = 'nvidia-smi nvlink -e';
const DEFAULT_COMMAND_TIMEOUT_MS = 30_000;
const MAX_OUTPUT_BYTES = 8 * 1024 * 1024;
const execFileAsync = promisify(execFile);

export interface NvlinkCollectorOptions {
  readonly commandTimeoutMs?: number;
  readonly nvmlTimeoutMs?: number;
}

const DEFAULT_NVML_TIMEOUT_MS = 10_000;

class NvlinkCollector implements Collector {
  readonly name = 'nvlink';
  private readonly errors: Counter<'gpu' | 'UUID' | 'link' | 'type'>;
  private readonly failures;
  private readonly poller: BackgroundPoll;
  private lastError: Error | undefined;
  /** No nvidia-smi on this node, or captured XML instead of the binary: nothing to poll. */
  private absent = false;
  private source: ResolvedGpuSource | undefined;

  constructor(
    private readonly context: CollectorContext,
    private readonly choice: GpuSourceChoice,
    private readonly commandTimeoutMs: number,
    private readonly nvmlTimeoutMs: number,
  ) {
    this.errors = new Counter({
      name: 'steadfast_gpu_nvlink_errors_total',
      help: 'NVLink error counters as the GPU keeps them (since the last reset), by GPU, link and type: replay, recovery, crc (crc_flit, crc_data on older parts).',
      labelNames: ['gpu', 'UUID', 'link', 'type'],
      registers: [context.registry],
    });
    this.failures = gpuQueryFailures(context.registry);
    this.absent = context.paths.nvidiaSmiXml !== undefined;
    this.poller = new BackgroundPoll(
      context.pollIntervalSeconds * 1000,
      () => this.poll(),
      () => !this.absent,
    );
  }

  async start(options?: CollectorStartOptions): Promise<void> {
    if (this.source === undefined) {
      this.source = await this.choice.acquire();
      // dcgm-exporter has no per-link counters: nvidia-smi beside it, as before.
      if (this.source.kind === 'nvml' || this.source.kind === 'nvml-unavailable') this.absent = false;
    }
    await this.poller.start(options?.waitForFirstRead);
  }

  async update(): Promise<void> {
    if (this.lastError) throw this.lastError;
  }

  async close(): Promise<void> {
    await this.poller.close();
    if (this.source !== undefined) {
      this.source = undefined;
      await this.choice.release();
    }
  }

  private async poll(): Promise<void> {
    if (this.source?.kind === 'nvml' || this.source?.kind === 'nvml-unavailable') {
      await this.pollNvml(this.source);
      return;
    }
    try {
      const { stdout } = await execFileAsync(this.context.paths.nvidiaSmi, ['nvlink', '-e'], {
        timeout: this.commandTimeoutMs,
        killSignal: 'SIGKILL',
        maxBuffer: MAX_OUTPUT_BYTES,
        signal: this.poller.signal,
        encoding: 'utf8',
      });
      if (this.poller.closed) return;
      this.write(parseNvlinkErrors(stdout));
      this.lastError = undefined;
    } catch (error) {
      if (this.poller.closed) return;
      if (errnoCode(error) === 'ENOENT') {
        this.context.logger.info({ collector: this.name, binary: this.context.paths.nvidiaSmi }, 'no nvidia-smi on this node; no NVLink counters');
        this.absent = true;
        return;
      }
      const timedOut = isTimeout(error);
      this.failures.inc({ command: COMMAND, reason: timedOut ? 'timeout' : 'error' });
      const failure = new Error(timedOut ? `${COMMAND} did not answer within ${this.commandTimeoutMs} ms` : `${COMMAND} failed: ${errorMessage(error)}`);
      if (this.lastError?.message !== failure.message) this.context.logger.warn({ collector: this.name, err: failure.message }, 'nvlink poll failed');
      // The counts of the last good poll stay exported.
      this.lastError = failure;
    }
  }

  private async pollNvml(source: Extract<ResolvedGpuSource, { kind: 'nvml' | 'nvml-unavailable' }>): Promise<void> {
    try {
      if (source.kind === 'nvml-unavailable') throw new Error(source.reason);
      const counts = await source.nvml.nvlink(this.nvmlTimeoutMs, this.poller.signal);
      if (this.poller.closed) return;
      this.write(counts);
      this.lastError = undefined;
    } catch (error) {
      if (this.poller.closed) return;
      this.failures.inc({ command: 'nvml', reason: isTimeout(error) ? 'timeout' : 'error' });
      const failure = new Error(`cannot read NVLink counters through NVML: ${errorMessage(error)}`);
      if (this.lastError?.message !== failure.message) this.context.logger.warn({ collector: this.name, err: failure.message }, 'nvlink poll failed');
      this.lastError = failure;
    }
  }

  /** The GPU keeps the counts: reset() + inc(value) sets each to its reading. */
  private write(counts: readonly NvlinkErrorCount[]): void {
    this.errors.reset();
    for (const count of counts) {
      const identity = count.uuid === undefined ? { gpu: String(count.gpu) } : { gpu: String(count.gpu), UUID: count.uuid };
      this.errors.inc({ ...identity, link: String(count.link), type: count.type }, count.count);
    }
  }
}

export function createNvlinkCollector(context: CollectorContext, options: NvlinkCollectorOptions = {}): Collector {
  return new NvlinkCollector(
    context,
    context.gpuSource ?? new GpuSourceChoice(context),
    options.commandTimeoutMs ?? DEFAULT_COMMAND_TIMEOUT_MS,
    options.nvmlTimeoutMs ?? DEFAULT_NVML_TIMEOUT_MS,
  );
}

export const nvlinkCollectorFactory: CollectorFactory = {
  name: 'nvlink',
  defaultEnabled: true,
  help: 'Per-link NVLink error counters (replay, recovery, CRC) from NVML, or nvidia-smi nvlink -e where the GPUs are not read through NVML; none on a node without either or with --nvidia-smi.xml.',
  create: (context) => createNvlinkCollector(context),
};
