import { InputError } from '../../core/errors.js';
import type { Topology } from '../../core/topology.js';
import { compareGroups, type SlowGroup } from '../cross-group.js';
import { RankSlowdownTracker, median, type ChangePoint, type SlowdownTrackerOptions } from '../slowdown-tracker.js';

/**
 * Fail-slow detection over recorded per-rank iteration times (Greyhound §4):
 * 1. every rank's stream goes through BOCD plus the ≥ 10 % verification (§4.2) —
 *    analyzers/slowdown-tracker.ts, on analyzers/bocd.ts;
 * 2. the ranks' current times are compared across comparable groups (§4.3) —
 *    analyzers/cross-group.ts.
 * Iteration times come from the training exporter, or from communication-call timestamps via
 * the ACF period method (§4.2) — analyzers/iteration-period.ts.
 *
 * The report's field names are a CLI contract (`steadfast detect failslow`).
 */

export { Bocd, type BocdOptions } from '../bocd.js';
export { compareGroups, type CrossGroupOptions, type GroupKind, type SlowGroup } from '../cross-group.js';
export { estimateIterationPeriod, iterationDurations, type IterationPeriod, type IterationPeriodOptions } from '../iteration-period.js';
export { RankSlowdownTracker, type ChangeDirection, type ChangePoint, type SlowdownTrackerOptions } from '../slowdown-tracker.js';

export interface FailSlowSample {
  /** Seconds (unix or relative) at which the iteration ended. */
  readonly time: number;
  readonly rank: number;
  readonly iterationSeconds: number;
}

export interface FailSlowOptions {
  /** Enables the cross-group comparison by parallel group; without it ranks are compared. */
  readonly topology?: Topology;
  /** Verification and cross-group threshold: 10 % (§4.2, §4.3). */
  readonly threshold?: number;
  /** Each rank's latest this-many iterations give its current time for the comparison. */
  readonly window?: number;
  /** BOCD and verification settings for every rank's tracker. */
  readonly tracker?: Omit<SlowdownTrackerOptions, 'threshold'>;
}

export interface RankLevel {
  readonly rank: number;
  readonly samples: number;
  /** Median of the rank's latest `window` iterations. */
  readonly currentSeconds: number;
  /** The level before its ongoing verified slow-down, or null when it is not slow. */
  readonly healthySeconds: number | null;
}

export interface FailSlowReport {
  readonly rankCount: number;
  readonly sampleCount: number;
  /** Verified change points, by time then rank. */
  readonly changePoints: ChangePoint[];
  /** Ranks whose latest verified change left them slower than before (and not yet recovered). */
  readonly slowRanks: number[];
  /** Groups slower than their comparable cluster's median by more than the threshold. */
  readonly slowGroups: SlowGroup[];
  /** Every rank's current and healthy level, by rank. */
  readonly ranks: RankLevel[];
}

export const DEFAULT_WINDOW = 20;

export function detectFailSlow(samples: readonly FailSlowSample[], options: FailSlowOptions = {}): FailSlowReport {
  const threshold = options.threshold ?? 0.1;
  const window = options.window ?? DEFAULT_WINDOW;
  if (!(threshold > 0 && threshold < 1)) throw new InputError('threshold must be in (0, 1)', 'threshold');
  if (!Number.isInteger(window) || window < 1) throw new InputError('window must be a whole number ≥ 1', 'window');
  const byRank = groupByRank(samples, options.topology);

  const changePoints: ChangePoint[] = [];
  const slowRanks: number[] = [];
  const current = new Map<number, number>();
  const ranks: RankLevel[] = [];
  for (const [rank, stream] of [...byRank].sort(([a], [b]) => a - b)) {
    const tracker = new RankSlowdownTracker(rank, { ...options.tracker, threshold });
    for (const sample of stream) {
      const change = tracker.update(sample.time, sample.iterationSeconds);
      if (change) changePoints.push(change);
    }
    if (tracker.slow) slowRanks.push(rank);
    const currentSeconds = median(stream.slice(-window).map((sample) => sample.iterationSeconds));
    current.set(rank, currentSeconds);
    ranks.push({ rank, samples: stream.length, currentSeconds, healthySeconds: tracker.healthySeconds });
  }
  changePoints.sort((a, b) => a.time - b.time || a.rank - b.rank);
  return {
    rankCount: byRank.size,
    sampleCount: samples.length,
    changePoints,
    slowRanks,
    slowGroups: compareGroups(current, options.topology, { threshold }),
    ranks,
  };
}

/** Validates every sample (naming the first bad one) and orders each rank's stream by time. */
function groupByRank(samples: readonly FailSlowSample[], topology: Topology | undefined): Map<number, FailSlowSample[]> {
  if (!Array.isArray(samples)) throw new InputError('samples must be an array', 'samples');
  const byRank = new Map<number, FailSlowSample[]>();
  samples.forEach((sample, index) => {
    const field = `samples.${index}`;
    if (typeof sample !== 'object' || sample === null) throw new InputError(`${field} must be an object`, field);
    const { time, rank, iterationSeconds } = sample;
    if (typeof time !== 'number' || !Number.isFinite(time) || time < 0)
      throw new InputError(`${field}.time must be a finite number ≥ 0, got ${String(time)}`, `${field}.time`);
    if (!Number.isSafeInteger(rank) || rank < 0) throw new InputError(`${field}.rank must be a whole number ≥ 0, got ${String(rank)}`, `${field}.rank`);
    if (typeof iterationSeconds !== 'number' || !Number.isFinite(iterationSeconds) || iterationSeconds <= 0) {
      throw new InputError(`${field}.iterationSeconds must be a finite number > 0, got ${String(iterationSeconds)}`, `${field}.iterationSeconds`);
    }
    if (topology && rank >= topology.ranks.length)
      throw new InputError(`${field}.rank: rank ${rank} is not in the topology (${topology.ranks.length} ranks)`, `${field}.rank`);
    const stream = byRank.get(rank) ?? [];
    stream.push(sample);
    byRank.set(rank, stream);
  });
  // Array.prototype.sort is stable: iterations recorded at the same time keep their order.
  for (const stream of byRank.values()) stream.sort((a, b) => a.time - b.time);
  return byRank;
}
