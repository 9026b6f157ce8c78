import type { FaultClass, LadderEvent } from '../../../../core/ladder.js';
import type { Step } from '../../../../core/steps.js';
import {
  advance,
  DEFAULT_LADDER_CONFIG,
  initialLadderState,
  type LadderConfig,
  type LadderState,
  type LadderTransition,
} from '../../../../controller/policy/ladder/index.js';

/** Shared by the ladder's tests: a clock, events, and the steps without their free text. */

export const T0 = Date.parse('2026-03-02T08:00:00.000Z');
export const SECOND = 1000;
export const MINUTE = 60 * SECOND;
export const HOUR = 60 * MINUTE;
export const DAY = 24 * HOUR;
export const JOB = 'llm-70b';

/** Transition tests pin the rungs; the retry chain's backoff has tests of its own. */
export const NO_BACKOFF: LadderConfig = { ...DEFAULT_LADDER_CONFIG, retryInitialBackoffMs: 0 };

let signalCounter = 0;
export function fault(faultClass: FaultClass, at: number, nodes: string[] = [], detail = 'test fault', signature?: string): LadderEvent {
  signalCounter += 1;
  return { type: 'fault', time: at, signalId: `s-${signalCounter}`, faultClass, nodes, detail, ...(signature === undefined ? {} : { signature }) };
}

/** Feeds the events in order and returns the last transition. */
export function run(state: LadderState, events: LadderEvent[], config: LadderConfig = NO_BACKOFF): LadderTransition {
  let current: LadderTransition = { state, steps: [] };
  for (const event of events) current = advance(current.state, event, config);
  return current;
}

/** The steps without their free-text reason and citation. */
export function shape(steps: Step[]): Array<{ verb: string; nodes?: string[]; version?: string }> {
  return steps.map((step) => ({
    verb: step.verb,
    ...(step.nodes === undefined ? {} : { nodes: step.nodes }),
    ...(step.version === undefined ? {} : { version: step.version }),
  }));
}

/** A job that trained on v1, was hot-updated to v2 and is relaunching on it. */
export function relaunchingOnV2(): LadderState {
  const start = initialLadderState(JOB, { time: T0, version: 'v1' });
  return run(start, [
    { type: 'restart_succeeded', time: T0 + MINUTE },
    { type: 'code_update', time: T0 + 2 * MINUTE, version: 'v2', urgent: true },
  ]).state;
}

/** A job that trained on v1 and now trains on v2. */
export function jobOnV2(): LadderState {
  return run(relaunchingOnV2(), [{ type: 'restart_succeeded', time: T0 + 3 * MINUTE }]).state;
}

export function running(version = 'v1'): LadderState {
  return initialLadderState(JOB, { time: T0, version });
}
