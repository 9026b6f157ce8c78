import type { GpuWork } from './gpu-work.js';
import { performance } from 'node:perf_hooks';
import type { FastPathCodes } from './xid-policy-client.js';
import { Gauge, type Registry } from 'prom-client';
import type { FastPathEvent } from '../core/fast-path-event.js';
import type { Logger } from '../core/log.js';
import { encodeExposition } from './exposition.js';
import type { FastPathOutcomeHandler } from './fast-path-client.js';
import type { GpuProcessBoard } from './gpu-processes.js';
import type { CollectorFlag, CollectorSettings } from './flags.js';
import type { GpuSourceChoice } from './gpu-source.js';
import type { CollectorPaths } from './paths.js';
import type { XidLedger } from './xid-ledger.js';

/**
 * The agent's collector framework, after prometheus/node_exporter: one collector per file (or
 * folder, collectors/<name>/), each enabled by name, each reading its source when asked, none able to fail the scrape.
 */

/** An HTTP request to one of a collector's agent endpoints, body already parsed as JSON. */
export interface AgentRequest {
  readonly method: string;
  readonly path: string;
  readonly query: URLSearchParams;
  readonly body: unknown;
}

export interface AgentResponse {
  readonly status: number;
  /** Sent as JSON, or as text when a string. */
  readonly body: unknown;
}

/** An endpoint a collector adds to the agent (`POST /api/v1/training`, `POST /api/v1/trace`). */
export interface AgentRoute {
  readonly method: 'GET' | 'POST';
  readonly path: string;
  handle(request: AgentRequest): Promise<AgentResponse>;
}

export interface CollectorContext {
  readonly registry: Registry;
  readonly paths: CollectorPaths;
  readonly logger: Logger;
  /** This node's name, as the controller and the cluster backend know it. */
  readonly node: string;
  /**
   * Sends an event on the fast path to the controller (a no-op when none is configured);
   * `onOutcome` learns whether the controller took it (see FastPathOutcome).
   */
  readonly fastPath: (event: FastPathEvent, onOutcome?: FastPathOutcomeHandler) => void;
  /** Background poll interval for collectors that poll (seconds). */
  readonly pollIntervalSeconds: number;
  /** Which processes hold which GPU, written by the gpu collector, read by the process collector. */
  readonly gpuProcesses?: GpuProcessBoard | undefined;
  /** Where the gpu and nvlink collectors read the GPUs (--gpu.source); made from the settings where absent. */
  readonly gpuSource?: GpuSourceChoice | undefined;
  /** Codes the controller asked for on the fast path beyond the fatal Xids (agent/xid-policy-client.ts); none where absent. */
  readonly fastPathCodes?: FastPathCodes | undefined;
  /** Xids counted once across the kernel log and NVML events; each collector makes its own where absent. */
  readonly xids?: XidLedger | undefined;
  /** One heavy job on the GPUs at a time across the validate and diagnose collectors (gpu-work.ts); absent: no such bound. */
  readonly gpuWork?: GpuWork | undefined;
  /** Values of the collector flags (see CollectorFactory.flags); absent keys mean the default. */
  readonly settings: CollectorSettings;
}

export interface CollectorStartOptions {
  /**
   * Whether start() waits for a background poll's first read (`--once`), or leaves it running so
   * that the agent serves scrapes at once (a first nvidia-smi costs 0.1 s and more on real GPUs).
   */
  readonly waitForFirstRead: boolean;
}

export interface Collector {
  readonly name: string;
  /** Starts background work (a poll loop, a file follower). Resolves once the first read is done, or started (see options). */
  start(options?: CollectorStartOptions): Promise<void>;
  /** Brings the collector's metrics up to date for a scrape. Throws when its source cannot be read. */
  update(): Promise<void>;
  /** Stops background work. Safe to call more than once. */
  close(): Promise<void>;
  /** HTTP endpoints this collector serves on the agent, if any. */
  readonly routes?: readonly AgentRoute[];
}

export interface CollectorFactory {
  readonly name: string;
  readonly defaultEnabled: boolean;
  readonly help: string;
  /** Settings this collector takes on the command line. */
  readonly flags?: readonly CollectorFlag[];
  create(context: CollectorContext): Collector;
}

/** Runs the enabled collectors for each scrape and records their success and duration. */
export class CollectorSet {
  private readonly success: Gauge<'collector'>;
  private readonly duration: Gauge<'collector'>;

  constructor(
    private readonly collectors: readonly Collector[],
    private readonly registry: Registry,
    private readonly logger: Logger,
  ) {
    this.success = new Gauge({
      name: 'steadfast_collector_success',
      help: 'Whether the collector succeeded at the last scrape (1) or failed (0).',
      labelNames: ['collector'],
      registers: [registry],
    });
    this.duration = new Gauge({
      name: 'steadfast_collector_duration_seconds',
      help: 'How long the collector took at the last scrape.',
      labelNames: ['collector'],
      registers: [registry],
    });
  }

  /** Every HTTP endpoint the collectors add to the agent. */
  get routes(): AgentRoute[] {
    return this.collectors.flatMap((collector) => collector.routes ?? []);
  }

  get names(): string[] {
    return this.collectors.map((collector) => collector.name);
  }

  async start(options: CollectorStartOptions = { waitForFirstRead: true }): Promise<void> {
    await Promise.all(
      this.collectors.map(async (collector) => {
        try {
          await collector.start(options);
        } catch (error) {
          // A collector that cannot start shows as failed at every scrape; the agent keeps running.
          this.logger.error({ collector: collector.name, err: error }, 'collector failed to start');
        }
      }),
    );
  }

  /** Updates every collector, then returns the exposition text. Never throws for a collector's failure. */
  async scrape(): Promise<string> {
    const results = await Promise.all(
      this.collectors.map(async (collector) => {
        const started = performance.now();
        let ok = 1;
        try {
          await collector.update();
        } catch (error) {
          ok = 0;
          this.logger.warn({ collector: collector.name, err: error }, 'collector failed');
        }
        return { name: collector.name, ok, seconds: (performance.now() - started) / 1000 };
      }),
    );
    // Set in collector order, not completion order, so the exposition is stable.
    for (const { name, ok, seconds } of results) {
      this.success.set({ collector: name }, ok);
      this.duration.set({ collector: name }, seconds);
    }
    return encodeExposition(this.registry);
  }

  async close(): Promise<void> {
    await Promise.all(this.collectors.map((collector) => collector.close()));
  }
}
