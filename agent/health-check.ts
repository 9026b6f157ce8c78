import { Registry } from 'prom-client';
import type { FastPathEvent } from '../core/fast-path-event.js';
import { errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import type { CollectorContext } from './collector.js';
import type { CollectorSettings } from './flags.js';
import type { CollectorPaths } from './paths.js';
import type { FastPathOutcomeHandler } from './fast-path-client.js';
import { gpuCollectorFactory } from './collectors/gpu/collector.js';
import { XID_STATE_FILE_FLAG, kernelLogCollectorFactory } from './collectors/kernel-log/collector.js';

/**
 * A one-shot check of a node for the conditions that make it unfit for work, for a scheduler's
 * node health check (Slurm's HealthCheckProgram): the agent's own xid and gpu collectors run
 * once, and what they would have sent the controller on the fast path becomes the verdict.
 *
 * - a fatal Xid in the kernel log since the last boot that this check has not reported before
 *   (its own state file, as the agent keeps one): reported once, so a node a person resumed is
 *   not drained again for the same Xid;
 * - fewer GPUs listed than the node should have (`expectGpus`): one fell off the bus;
 * - with `expectGpus`, a GPU source that cannot be read at all (nvidia-smi failing is how a lost
 *   GPU often shows).
 */

export interface HealthCheckOptions {
  readonly node: string;
  readonly paths: CollectorPaths;
  /** Where reported fatal Xids are remembered; keep it apart from the agent's own. */
  readonly xidStateFile: string;
  /** The gpu collector's source settings (`gpu.source`, `gpu.nvml-library`); auto where absent. */
  readonly gpuSettings?: CollectorSettings | undefined;
  /** GPUs the node has; none: the GPU count is not checked. */
  readonly expectGpus?: number | undefined;
  readonly logger: Logger;
  /**
   * Called with the faults of an unhealthy node (to drain it, or print why). When it resolves,
   * the fatal Xids among them count as reported; when it throws, they stay news for the next check.
   */
  readonly report: (faults: readonly string[]) => Promise<void>;
}

export interface HealthVerdict {
  readonly healthy: boolean;
  /** One line per fault, for the drain reason and the operator. */
  readonly faults: readonly string[];
}

async function gaugeValue(registry: Registry, name: string): Promise<number | undefined> {
  const metric = registry.getSingleMetric(name);
  if (!metric) return undefined;
  return (await metric.get()).values[0]?.value;
}

export async function checkNodeHealth(options: HealthCheckOptions): Promise<HealthVerdict> {
  const registry = new Registry();
  const events: Array<{ event: FastPathEvent; onOutcome: FastPathOutcomeHandler | undefined }> = [];
  const settings: CollectorSettings = { ...options.gpuSettings, [XID_STATE_FILE_FLAG]: options.xidStateFile };
  const context: CollectorContext = {
    registry,
    paths: options.paths,
    logger: options.logger,
    node: options.node,
    fastPath: (event, onOutcome) => events.push({ event, onOutcome }),
    pollIntervalSeconds: 3600,
    settings,
  };
  const xid = kernelLogCollectorFactory.create(context);
  const gpu = options.expectGpus === undefined ? undefined : gpuCollectorFactory.create(context);
  const faults: string[] = [];
  try {
    await xid.start();
    await xid.update();
    if (gpu && options.expectGpus !== undefined) {
      try {
        await gpu.start();
        await gpu.update();
        const listed = (await gaugeValue(registry, 'steadfast_gpu_attached')) ?? 0;
        if (listed < options.expectGpus) faults.push(`GPU lost: ${listed} of ${options.expectGpus} GPUs listed`);
      } catch (error) {
        faults.push(`GPUs unreadable: ${errorMessage(error)}`);
      }
    }
    const xids = events.filter(({ event }) => event.kind === 'xid');
    faults.unshift(...xids.map(({ event }) => `fatal Xid ${event.xid} on GPU ${event.gpu}`));
    if (faults.length > 0) {
      await options.report(faults);
      for (const { onOutcome } of xids) onOutcome?.('delivered');
    }
    return { healthy: faults.length === 0, faults };
  } finally {
    await gpu?.close();
    // Closing the xid collector finishes writing its state file.
    await xid.close();
  }
}
