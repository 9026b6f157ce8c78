import { runBaseline } from './baselines.js';
import { IncidentStream } from './incidents.js';
import type { EttrParams } from './params.js';
import { runSteadfast } from './run.js';

/**
 * How ETTR moves with the warm standby pool (§6.2) and the checkpoint interval. Each point is the
 * mean over a few seeds; within a seed every point meets the same incidents, so the curves show
 * the knob and not the draw.
 */

export interface StandbyRow {
  readonly standby: number;
  readonly steadfast: number;
  /** Evictions that found the pool short, summed over the seeds. */
  readonly poolShortEvictions: number;
  readonly isDefault: boolean;
}

export interface CheckpointRow {
  readonly minutes: number;
  readonly steadfast: number;
  readonly reschedule: number;
  readonly requeue: number;
  readonly isDefault: boolean;
}

export interface Sensitivity {
  readonly seeds: readonly number[];
  readonly standby: readonly StandbyRow[];
  readonly checkpoint: readonly CheckpointRow[];
  /** The baselines at the default checkpoint interval (they have no standbys). */
  readonly baselines: { readonly reschedule: number; readonly requeue: number };
}

export interface SensitivityOptions {
  readonly standbySizes?: readonly number[];
  readonly checkpointMinutes?: readonly number[];
  /** Default: the run's seed and the four after it. */
  readonly seeds?: readonly number[];
  readonly onProgress?: (fraction: number) => void;
}

export const DEFAULT_STANDBY_SIZES = [0, 1, 2, 3, 4, 6, 8] as const;
export const DEFAULT_CHECKPOINT_MINUTES = [1, 5, 10, 30, 60, 120] as const;

function mean(values: readonly number[]): number {
  return values.reduce((sum, value) => sum + value, 0) / Math.max(1, values.length);
}

function withDefault(values: readonly number[], value: number): number[] {
  return [...new Set([...values, value])].sort((a, b) => a - b);
}

export function sensitivity(params: EttrParams, options: SensitivityOptions = {}): Sensitivity {
  const seeds = options.seeds ?? [0, 1, 2, 3, 4].map((offset) => (params.seed + offset) >>> 0);
  const defaultMinutes = params.checkpointIntervalSeconds / 60;
  const sizes = withDefault(options.standbySizes ?? DEFAULT_STANDBY_SIZES, params.standby);
  const minutes = withDefault(options.checkpointMinutes ?? DEFAULT_CHECKPOINT_MINUTES, defaultMinutes);
  const total = (sizes.length + minutes.length) * seeds.length;
  let done = 0;
  const tick = (): void => {
    done += 1;
    options.onProgress?.(done / total);
  };

  const standby = sizes.map((size): StandbyRow => {
    const runs = seeds.map((seed) => {
      const variant = { ...params, seed, standby: size };
      const result = runSteadfast(variant, new IncidentStream(variant));
      tick();
      return result;
    });
    return {
      standby: size,
      steadfast: mean(runs.map((run) => run.ettr)),
      poolShortEvictions: runs.reduce((sum, run) => sum + (run.standby?.poolShortEvictions ?? 0), 0),
      isDefault: size === params.standby,
    };
  });

  const checkpoint = minutes.map((value): CheckpointRow => {
    const runs = seeds.map((seed) => {
      const variant = { ...params, seed, checkpointIntervalSeconds: value * 60 };
      const result = {
        steadfast: runSteadfast(variant, new IncidentStream(variant)).ettr,
        reschedule: runBaseline('reschedule', variant, new IncidentStream(variant)).ettr,
        requeue: runBaseline('requeue', variant, new IncidentStream(variant)).ettr,
      };
      tick();
      return result;
    });
    return {
      minutes: value,
      steadfast: mean(runs.map((run) => run.steadfast)),
      reschedule: mean(runs.map((run) => run.reschedule)),
      requeue: mean(runs.map((run) => run.requeue)),
      isDefault: value === defaultMinutes,
    };
  });

  const atDefault = checkpoint.find((row) => row.isDefault) as CheckpointRow;
  return { seeds, standby, checkpoint, baselines: { reschedule: atDefault.reschedule, requeue: atDefault.requeue } };
}
