import type { LadderEvent } from '../../core/ladder.js';
import { advance, initialLadderState, type LadderConfig, type LadderState } from '../../controller/policy/ladder/index.js';
import { DAY_MS, SIM_START_MS } from './params.js';

/**
 * The simulated job's ladder as the window opens: it has been training a while, on v0 and then
 * v1, both proven good, so the first rollback has a target (ByteRobust §4.2 Rollback needs an
 * earlier good version).
 */
export function ladderHistory(job: string, config: LadderConfig): LadderState {
  const day = SIM_START_MS - 2 * DAY_MS;
  let state = initialLadderState(job, { time: day, version: 'v0' });
  const apply = (event: LadderEvent): void => {
    state = advance(state, event, config).state;
  };
  apply({ type: 'restart_succeeded', time: day });
  apply({ type: 'code_update', time: day + 1, version: 'v1', urgent: true });
  apply({ type: 'restart_succeeded', time: day + 2 });
  return state;
}
