import { InputError } from '../core/errors.js';
import { Bocd, type BocdOptions } from './bocd.js';

/**
 * One rank's iteration-time stream → verified change points (Greyhound §4.2): BOCD proposes,
 * the ≥ 10 % verification decides.
 *
 * BOCD (analyzers/bocd.ts) runs on ln(seconds). Greyhound reports a change when "the likelihood
 * of r_t = 0" passes 0.9; in Adams & MacKay's recursion P(r_t = 0 | data) is always exactly the
 * hazard rate, so we read it as "the current run began within the last few iterations":
 * P(1 ≤ r_t ≤ 2·verifyAfter | data) ≥ 0.9. The most probable such run names the candidate: its
 * first iteration is where the new level starts.
 *
 * A candidate is verified once `verifyAfter` iterations at the new level exist: the level after
 * (those iterations) is compared with the level before (up to `beforeWindow` iterations since
 * the previous verified change); a difference under 10 % is jitter and is dropped (§4.2,
 * "Change-point verification"). Greyhound compares averages; we compare medians, so that one
 * garbage-collection pause among the few iterations after a candidate cannot pass for a
 * slow-down. On a genuine level shift the two agree.
 *
 * A verified slow-down marks the rank slow and remembers the level before it as the healthy
 * level; a verified drop back to within 10 % of that level clears it.
 */

export interface SlowdownTrackerOptions {
  /** BOCD settings, on ln(iteration seconds): priorSigma is a relative jitter (0.05 ≈ 5 %). */
  readonly bocd?: BocdOptions;
  /** Smallest relative change that is a fail-slow rather than jitter: 10 % (§4.2). */
  readonly threshold?: number;
  /** Posterior probability of a recent change that makes a candidate: 0.9 (§4.2). */
  readonly changeProbability?: number;
  /** Iterations at the new level before a candidate is verified. */
  readonly verifyAfter?: number;
  /** At most this many iterations before a candidate form its "before" level. */
  readonly beforeWindow?: number;
}

export type ChangeDirection = 'slowdown' | 'recovery';

export interface ChangePoint {
  readonly rank: number;
  /** Time of the first iteration at the new level. */
  readonly time: number;
  /** Position of that iteration in the rank's stream, from 0. */
  readonly iteration: number;
  /** Median iteration seconds before and after the change. */
  readonly beforeSeconds: number;
  readonly afterSeconds: number;
  /** afterSeconds / beforeSeconds. */
  readonly ratio: number;
  readonly direction: ChangeDirection;
}

export const TRACKER_DEFAULTS = {
  threshold: 0.1,
  changeProbability: 0.9,
  verifyAfter: 8,
  beforeWindow: 50,
} as const;

export class RankSlowdownTracker {
  private readonly bocd: Bocd;
  private readonly threshold: number;
  private readonly changeProbability: number;
  private readonly verifyAfter: number;
  private readonly beforeWindow: number;
  /** Candidates are looked for among runs up to this long. */
  private readonly candidateWithin: number;
  /** The last iterations, enough to reach `beforeWindow` behind the oldest possible candidate. */
  private readonly recentSeconds: Float64Array;
  private readonly recentTimes: Float64Array;
  private iterations = 0;
  private segmentStart = 0;
  private lastDecided = 0;
  private pending: number | null = null;
  private healthy: number | null = null;

  constructor(
    readonly rank: number,
    options: SlowdownTrackerOptions = {},
  ) {
    this.threshold = options.threshold ?? TRACKER_DEFAULTS.threshold;
    this.changeProbability = options.changeProbability ?? TRACKER_DEFAULTS.changeProbability;
    this.verifyAfter = options.verifyAfter ?? TRACKER_DEFAULTS.verifyAfter;
    this.beforeWindow = options.beforeWindow ?? TRACKER_DEFAULTS.beforeWindow;
    if (!(this.threshold > 0 && this.threshold < 1)) throw new InputError('threshold must be in (0, 1)', 'threshold');
    if (!(this.changeProbability > 0 && this.changeProbability < 1)) throw new InputError('changeProbability must be in (0, 1)', 'changeProbability');
    if (!Number.isInteger(this.verifyAfter) || this.verifyAfter < 1) throw new InputError('verifyAfter must be a whole number ≥ 1', 'verifyAfter');
    if (!Number.isInteger(this.beforeWindow) || this.beforeWindow < 1) throw new InputError('beforeWindow must be a whole number ≥ 1', 'beforeWindow');
    this.candidateWithin = 2 * this.verifyAfter;
    this.bocd = new Bocd(options.bocd);
    const history = this.beforeWindow + this.candidateWithin + 2;
    this.recentSeconds = new Float64Array(history);
    this.recentTimes = new Float64Array(history);
  }

  /** Whether the rank is in a verified slow-down that has not yet recovered. */
  get slow(): boolean {
    return this.healthy !== null;
  }

  /** The level before the ongoing slow-down, or null when the rank is not slow. */
  get healthySeconds(): number | null {
    return this.healthy;
  }

  /** Iterations absorbed so far. */
  get count(): number {
    return this.iterations;
  }

  /** Absorbs one iteration; returns a change point when one is verified now. */
  update(time: number, seconds: number): ChangePoint | null {
    if (!Number.isFinite(time)) throw new InputError(`rank ${this.rank}: time ${String(time)} is not finite`, 'time');
    if (!(seconds > 0) || !Number.isFinite(seconds)) {
      throw new InputError(`rank ${this.rank}: iteration seconds must be a positive finite number, got ${String(seconds)}`, 'iterationSeconds');
    }
    const now = this.iterations;
    const slot = now % this.recentSeconds.length;
    this.recentSeconds[slot] = seconds;
    this.recentTimes[slot] = time;
    this.iterations += 1;
    this.bocd.update(Math.log(seconds));

    // The first candidate stands until it is decided: a pause shortly after a real change makes
    // BOCD restart its run after the pause, which must not move the change point there.
    const recent = this.bocd.recentChange(this.candidateWithin);
    if (this.pending === null && recent.runLength >= 1 && recent.probability >= this.changeProbability) {
      const start = now - recent.runLength + 1;
      if (start > this.lastDecided) this.pending = start;
    }
    if (this.pending === null || now - this.pending + 1 < this.verifyAfter) return null;
    const candidate = this.pending;
    this.pending = null;
    this.lastDecided = candidate;
    return this.verify(candidate, now);
  }

  private verify(start: number, now: number): ChangePoint | null {
    const before = this.window(Math.max(this.segmentStart, start - this.beforeWindow), start);
    // Too little history since the previous level to tell a change from a jitter.
    if (before.length < this.verifyAfter) return null;
    const beforeSeconds = median(before);
    const afterSeconds = median(this.window(start, now + 1));
    const ratio = afterSeconds / beforeSeconds;
    // Greyhound §4.2: a difference under 10 % is a jitter, not a change.
    if (Math.abs(ratio - 1) < this.threshold) return null;
    this.segmentStart = start;
    const direction: ChangeDirection = ratio > 1 ? 'slowdown' : 'recovery';
    if (direction === 'slowdown' && this.healthy === null) this.healthy = beforeSeconds;
    if (direction === 'recovery' && this.healthy !== null && afterSeconds < this.healthy * (1 + this.threshold)) this.healthy = null;
    const time = this.recentTimes[start % this.recentTimes.length] as number;
    return { rank: this.rank, time, iteration: start, beforeSeconds, afterSeconds, ratio, direction };
  }

  /** Iteration seconds for positions [from, to), all still inside the history ring. */
  private window(from: number, to: number): number[] {
    const values: number[] = [];
    for (let position = from; position < to; position += 1) values.push(this.recentSeconds[position % this.recentSeconds.length] as number);
    return values;
  }
}

export function median(values: readonly number[]): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}
