import { InputError } from '../core/errors.js';

/**
 * Warm standby pool size (ByteRobust §6.2): machine failures are independent, so the number of
 * machines failing on one day is Binomial(N, p) with p the per-machine daily failure rate; the
 * pool holds that distribution's P99 (or another quantile), which covers the needs of most days
 * without keeping many GPUs idle.
 */

export interface StandbySizing {
  readonly standby: number;
  readonly nodes: number;
  readonly dailyFailureRate: number;
  readonly quantile: number;
  /** N·p, the mean number of failures per day. */
  readonly expectedDailyFailures: number;
  /** P(failures on one day ≤ standby): at least `quantile`. */
  readonly coverage: number;
}

/** log of n choose k, by summing logs (exact enough for n up to millions, no overflow). */
function logChoose(n: number, k: number, logFactorial: (m: number) => number): number {
  return logFactorial(n) - logFactorial(k) - logFactorial(n - k);
}

export function standbyPoolSize(nodes: number, dailyFailureRate: number, quantile = 0.99): StandbySizing {
  if (!Number.isInteger(nodes) || nodes < 1) throw new InputError('nodes must be a whole number of at least 1', 'nodes');
  if (!(dailyFailureRate >= 0 && dailyFailureRate <= 1)) throw new InputError('daily failure rate must be a probability between 0 and 1', 'dailyFailureRate');
  if (!(quantile > 0 && quantile < 1)) throw new InputError('quantile must be strictly between 0 and 1', 'quantile');
  const expectedDailyFailures = nodes * dailyFailureRate;
  if (dailyFailureRate === 0) return { standby: 0, nodes, dailyFailureRate, quantile, expectedDailyFailures, coverage: 1 };
  if (dailyFailureRate === 1) return { standby: nodes, nodes, dailyFailureRate, quantile, expectedDailyFailures, coverage: 1 };

  const logs: number[] = [0];
  const logFactorial = (m: number): number => {
    for (let i = logs.length; i <= m; i += 1) logs.push((logs[i - 1] as number) + Math.log(i));
    return logs[m] as number;
  };
  const logP = Math.log(dailyFailureRate);
  const logQ = Math.log1p(-dailyFailureRate);
  let cumulative = 0;
  for (let k = 0; k <= nodes; k += 1) {
    cumulative += Math.exp(logChoose(nodes, k, logFactorial) + k * logP + (nodes - k) * logQ);
    // A tiny tolerance keeps float rounding from pushing an exact quantile one step up.
    if (cumulative >= quantile - 1e-12) return { standby: k, nodes, dailyFailureRate, quantile, expectedDailyFailures, coverage: Math.min(1, cumulative) };
  }
  return { standby: nodes, nodes, dailyFailureRate, quantile, expectedDailyFailures, coverage: 1 };
}
