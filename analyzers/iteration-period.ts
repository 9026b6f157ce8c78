import { InputError } from '../core/errors.js';

/**
 * Iteration time from one rank's communication calls, without knowing the framework
 * (Greyhound §4.2, "Iteration time analysis").
 *
 * Training repeats the same sequence of collectives every iteration, so the gaps between
 * consecutive calls form a periodic series whose period is the number of calls per iteration.
 * Greyhound finds it as the first lag k whose autocorrelation reaches M = 0.95, then reads the
 * iteration time as the time from a call to the same call one period later.
 *
 * Two deliberate departures, both for short windows:
 * - The ACF is taken over the gaps between call start times, not the raw timestamps (which only
 *   ever increase and so correlate at every lag).
 * - Each lag's covariance is averaged over its n − k products instead of summed and divided by
 *   the n-term variance sum as in the paper's formula. The summed form shrinks by (n − k)/n, so
 *   with only three or four periods in the window the true lag could never reach 0.95.
 * When the gaps barely vary (one call per iteration, or k evenly spaced calls) the ACF is
 * undefined or pure noise; the smallest consistent period, one call, is then reported with basis
 * `uniform-gaps` — k evenly spaced calls per iteration cannot be told apart from one.
 */

export interface IterationPeriodOptions {
  /** ACF level the period's lag must reach: Greyhound's M = 0.95 (§4.2). */
  readonly threshold?: number;
  /** Longest period tried, in calls per iteration. */
  readonly maxCallsPerIteration?: number;
  /** A lag is tried only if the window holds at least this many whole periods. */
  readonly minIterations?: number;
  /** Gaps whose coefficient of variation is at most this count as evenly spaced. */
  readonly uniformGapTolerance?: number;
}

export type PeriodBasis = 'acf' | 'uniform-gaps' | 'too-few-calls' | 'no-period';

export interface IterationPeriod {
  /** Communication calls per iteration (the ACF lag), or null when none was found. */
  readonly callsPerIteration: number | null;
  /** Median time from a call to the same call one period later, in seconds, or null. */
  readonly periodSeconds: number | null;
  /**
   * In [0, 1]. Basis `acf`: the ACF at the chosen lag. `uniform-gaps`: the share of gaps within
   * 10 % of the median gap. Otherwise: the best ACF seen (0 when none could be computed).
   */
  readonly confidence: number;
  readonly basis: PeriodBasis;
  /** Finite timestamps used; non-finite ones are skipped and counted in `callsIgnored`. */
  readonly callsUsed: number;
  readonly callsIgnored: number;
}

export interface IterationDuration {
  /** Start time of the call that closes the iteration. */
  readonly time: number;
  readonly seconds: number;
}

export const ITERATION_PERIOD_DEFAULTS = {
  threshold: 0.95,
  maxCallsPerIteration: 256,
  minIterations: 3,
  uniformGapTolerance: 0.1,
} as const;

/** Minimum gaps for any verdict: three whole periods of the shortest period, one call. */
const MIN_GAPS = 3;

export function estimateIterationPeriod(timestamps: readonly number[], options: IterationPeriodOptions = {}): IterationPeriod {
  const threshold = options.threshold ?? ITERATION_PERIOD_DEFAULTS.threshold;
  const maxLag = options.maxCallsPerIteration ?? ITERATION_PERIOD_DEFAULTS.maxCallsPerIteration;
  const minIterations = options.minIterations ?? ITERATION_PERIOD_DEFAULTS.minIterations;
  const tolerance = options.uniformGapTolerance ?? ITERATION_PERIOD_DEFAULTS.uniformGapTolerance;
  if (!(threshold > 0 && threshold <= 1)) throw new InputError('threshold must be in (0, 1]', 'threshold');
  if (!Number.isInteger(maxLag) || maxLag < 1) throw new InputError('maxCallsPerIteration must be a whole number ≥ 1', 'maxCallsPerIteration');
  if (!Number.isInteger(minIterations) || minIterations < 2) throw new InputError('minIterations must be a whole number ≥ 2', 'minIterations');
  if (!(tolerance >= 0)) throw new InputError('uniformGapTolerance must be ≥ 0', 'uniformGapTolerance');

  const times = timestamps.filter((time) => Number.isFinite(time)).sort((a, b) => a - b);
  const counts = { callsUsed: times.length, callsIgnored: timestamps.length - times.length };
  const gaps = new Float64Array(Math.max(0, times.length - 1));
  for (let index = 0; index < gaps.length; index += 1) gaps[index] = (times[index + 1] as number) - (times[index] as number);
  if (gaps.length < MIN_GAPS) return { callsPerIteration: null, periodSeconds: null, confidence: 0, basis: 'too-few-calls', ...counts };

  let mean = 0;
  for (const gap of gaps) mean += gap;
  mean /= gaps.length;
  let variance = 0;
  for (const gap of gaps) variance += (gap - mean) * (gap - mean);
  variance /= gaps.length;

  const spread = mean > 0 ? Math.sqrt(variance) / mean : Number.POSITIVE_INFINITY;
  const lagLimit = Math.min(maxLag, Math.floor(gaps.length / minIterations));
  let bestAcf = 0;
  if (variance > 0 && spread > tolerance) {
    for (let lag = 1; lag <= lagLimit; lag += 1) {
      const acf = autocorrelation(gaps, mean, variance, lag);
      if (acf >= threshold) {
        return { callsPerIteration: lag, periodSeconds: medianSpan(times, lag), confidence: Math.min(1, acf), basis: 'acf', ...counts };
      }
      bestAcf = Math.max(bestAcf, acf);
    }
    return { callsPerIteration: null, periodSeconds: null, confidence: Math.max(0, bestAcf), basis: 'no-period', ...counts };
  }
  if (!(mean > 0)) return { callsPerIteration: null, periodSeconds: null, confidence: 0, basis: 'no-period', ...counts };
  const typical = medianSpan(times, 1);
  const close = Array.from(gaps).filter((gap) => Math.abs(gap - typical) <= 0.1 * typical).length;
  return { callsPerIteration: 1, periodSeconds: typical, confidence: close / gaps.length, basis: 'uniform-gaps', ...counts };
}

/**
 * The iteration-time stream that period implies: one duration per whole period, measured
 * between calls k apart (k = callsPerIteration). This is what the BOCD tracker consumes.
 */
export function iterationDurations(timestamps: readonly number[], callsPerIteration: number): IterationDuration[] {
  if (!Number.isInteger(callsPerIteration) || callsPerIteration < 1) {
    throw new InputError('callsPerIteration must be a whole number ≥ 1', 'callsPerIteration');
  }
  const times = timestamps.filter((time) => Number.isFinite(time)).sort((a, b) => a - b);
  const durations: IterationDuration[] = [];
  for (let index = callsPerIteration; index < times.length; index += callsPerIteration) {
    durations.push({ time: times[index] as number, seconds: (times[index] as number) - (times[index - callsPerIteration] as number) });
  }
  return durations;
}

function autocorrelation(gaps: Float64Array, mean: number, variance: number, lag: number): number {
  let covariance = 0;
  for (let index = 0; index + lag < gaps.length; index += 1) {
    covariance += ((gaps[index] as number) - mean) * ((gaps[index + lag] as number) - mean);
  }
  return covariance / (gaps.length - lag) / variance;
}

/** Median over every call of the time to the call `lag` places later. */
function medianSpan(times: readonly number[], lag: number): number {
  const spans: number[] = [];
  for (let index = lag; index < times.length; index += 1) spans.push((times[index] as number) - (times[index - lag] as number));
  spans.sort((a, b) => a - b);
  const middle = spans.length >> 1;
  return spans.length % 2 === 1 ? (spans[middle] as number) : ((spans[middle - 1] as number) + (spans[middle] as number)) / 2;
}
