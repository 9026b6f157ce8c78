import type { HotSwapUsage } from './hot-swap.js';
import type { LedgerSummary } from './ledger.js';

export const STRATEGIES = ['steadfast', 'reschedule', 'requeue'] as const;
export type StrategyName = (typeof STRATEGIES)[number];
/** steadfast with hot swap (tryit/ettr/hot-swap.ts): shown beside steadfast when it is on. */
export type ResultName = StrategyName | 'hot_swap';

export interface StandbyUsage {
  readonly poolSize: number;
  /** Standbys woken to replace evicted machines. */
  readonly activations: number;
  /** Evictions that found the pool short and waited for a cold node. */
  readonly poolShortEvictions: number;
  /** Machines that came cold because the pool was empty. */
  readonly coldNodes: number;
  /** Times an activation left the pool empty. */
  readonly depletions: number;
  /** GPU-hours held idle in the pool (size × GPUs per node × wall time): what the standbys cost. */
  readonly reservedGpuHours: number;
}

/** One scheduling sample per machine replacement: from the decision to replace to the relaunched job (no reload, no lost work). */
export interface ReplacementScheduling {
  readonly count: number;
  readonly meanSeconds: number | null;
}

export interface StrategyResult extends LedgerSummary {
  readonly strategy: ResultName;
  readonly incidents: number;
  readonly incidentsBySymptom: Record<string, number>;
  readonly replacementScheduling: ReplacementScheduling;
  readonly standby?: StandbyUsage;
  /** Steps the recovery ladder (controller/policy/ladder/) emitted, by verb. */
  readonly ladderSteps?: Record<string, number>;
  /** How each closed incident was finally resolved (compare ByteRobust §4.2 Lesson and Table 4). */
  readonly resolvedBy?: Record<string, number>;
  /** Swaps, fallbacks and the spares' cost, for the run with hot swap. */
  readonly hotSwap?: HotSwapUsage;
}

export function schedulingSummary(samples: readonly number[]): ReplacementScheduling {
  if (samples.length === 0) return { count: 0, meanSeconds: null };
  return { count: samples.length, meanSeconds: samples.reduce((sum, value) => sum + value, 0) / samples.length };
}

export function increment(counts: Record<string, number>, key: string, by = 1): void {
  counts[key] = (counts[key] ?? 0) + by;
}
