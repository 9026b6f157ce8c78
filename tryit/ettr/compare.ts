import type { LadderConfig } from '../../controller/policy/ladder/index.js';
import { runBaseline } from './baselines.js';
import { IncidentStream, type IncidentSource } from './incidents.js';
import { FIG12 } from './model.js';
import { type EttrParams } from './params.js';
import type { StrategyName, StrategyResult } from './result.js';
import { runSteadfast } from './run.js';

/**
 * steadfast against ByteRobust's two baselines (§8.2.1), each meeting the same incidents.
 */

export interface WarmStandbyGain {
  /**
   * ByteRobust §8.2.1 compares the weighted-average scheduling time (WAS): from failure detection
   * to job resume, per eviction scenario, weighted by the binomial of §6.2. The simulation's
   * counterpart: per machine replacement, the time from the decision to replace (the ladder's
   * evict; the baseline's relaunch) until the job's processes run again — checkpoint reload and
   * lost work excluded — averaged over the replacements that actually happened, which weights
   * the scenarios by how often they occur. This is requeue's mean over steadfast's.
   */
  readonly overRequeue: number | null;
  /** The same against reschedule (paper: 5.36×). */
  readonly overReschedule: number | null;
  readonly paperOverRequeue: number;
  readonly paperOverReschedule: number;
  /** End to end: requeue's unproductive hours over steadfast's (detection, diagnosis, reload, lost work, people: everything). */
  readonly unproductiveHoursOverRequeue: number | null;
  readonly unproductiveHoursOverReschedule: number | null;
}

export interface EttrComparison {
  readonly params: EttrParams;
  readonly strategies: Record<StrategyName, StrategyResult>;
  readonly gain: WarmStandbyGain;
  /** steadfast again on the same incidents, with hot swap (params.hotSwap); absent when it is off. */
  readonly hotSwap?: StrategyResult;
}

export interface CompareOptions {
  /** Where incidents come from; each strategy gets a fresh source. Default: drawn from params.seed. */
  readonly incidents?: (params: EttrParams) => IncidentSource;
  readonly ladderConfig?: LadderConfig;
  readonly onProgress?: (fraction: number) => void;
}

export function compareStrategies(params: EttrParams, options: CompareOptions = {}): EttrComparison {
  const source = options.incidents ?? ((p: EttrParams) => new IncidentStream(p));
  const steadfast = runSteadfast(params, source(params), { ladderConfig: options.ladderConfig, onProgress: options.onProgress });
  const reschedule = runBaseline('reschedule', params, source(params));
  const requeue = runBaseline('requeue', params, source(params));
  const hotSwap = params.hotSwap === null ? undefined : runSteadfast(params, source(params), { ladderConfig: options.ladderConfig, hotSwap: params.hotSwap });
  return {
    params,
    strategies: { steadfast, reschedule, requeue },
    gain: warmStandbyGain(steadfast, reschedule, requeue),
    ...(hotSwap === undefined ? {} : { hotSwap }),
  };
}

function ratio(numerator: number | null, denominator: number | null): number | null {
  if (numerator === null || denominator === null || !(denominator > 0)) return null;
  return numerator / denominator;
}

function unproductive(result: StrategyResult): number {
  return result.wallHours - result.productiveHours;
}

export function warmStandbyGain(steadfast: StrategyResult, reschedule: StrategyResult, requeue: StrategyResult): WarmStandbyGain {
  const ours = steadfast.replacementScheduling.meanSeconds;
  return {
    overRequeue: ratio(requeue.replacementScheduling.meanSeconds, ours),
    overReschedule: ratio(reschedule.replacementScheduling.meanSeconds, ours),
    paperOverRequeue: FIG12.requeueRatio,
    paperOverReschedule: FIG12.rescheduleRatio,
    unproductiveHoursOverRequeue: ratio(unproductive(requeue), unproductive(steadfast)),
    unproductiveHoursOverReschedule: ratio(unproductive(reschedule), unproductive(steadfast)),
  };
}
