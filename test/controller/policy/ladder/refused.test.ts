import { describe, expect, it } from 'vitest';
import type { LadderEvent } from '../../../../core/ladder.js';
import { ACTING_VERBS } from '../../../../core/steps.js';
import { T0, SECOND, MINUTE, HOUR, DAY, fault, run, shape, running } from './support.js';

// What the safety gates refused did not happen: the ladder waits for no outcome of it.

const refused = (time: number, detail = 'actions are paused: maintenance'): LadderEvent => ({
  type: 'recovery_refused',
  time,
  transitionId: 't-refused',
  detail,
});

describe('ladder: a transition the step processor refused', () => {
  it('closes the incident it opened, says so, and leaves the job running', () => {
    const evicting = run(running(), [fault('machine', T0, ['node-3'], 'Xid 79')]).state;
    expect(evicting.phase).toBe('stopped');
    const { state, steps } = run(evicting, [refused(T0 + SECOND)]);
    expect(shape(steps)).toEqual([{ verb: 'notify' }]);
    expect(steps[0]?.reason).toContain('recovery refused (actions are paused: maintenance): nothing was done and the incident opened at');
    expect(state.phase).toBe('running');
    expect(state.incident).toBeNull();
    expect(state.scheduled).toBeNull();
  });

  it('starts the next report of the fault at the first rung instead of counting it as a failed restart', () => {
    const afterRefusal = run(running(), [fault('machine', T0, ['node-3'], 'Xid 79'), refused(T0 + SECOND)]).state;
    const { state, steps } = run(afterRefusal, [fault('machine', T0 + MINUTE, ['node-3'], 'Xid 79')]);
    expect(shape(steps).map((step) => step.verb)).toContain('evict');
    expect(state.phase).toBe('stopped');
    expect(state.incident?.rung).toBe('evict');
  });

  it('only records a refusal that finds no incident open (its transition already undone)', () => {
    const { state, steps } = run(running(), [refused(T0, 'automatic recovery is off for job llm-70b')]);
    expect(shape(steps)).toEqual([{ verb: 'notify' }]);
    expect(steps[0]?.reason).toBe(
      'recovery refused (automatic recovery is off for job llm-70b): nothing was done; the next report of the fault starts recovery again',
    );
    expect(state.phase).toBe('running');
  });

  it('does not ask again at every tick for a code update whose refused transition was undone', () => {
    // A lazy update whose window ran out: the tick applies it, the actuator refuses (paused), and
    // the controller hands the refusal the ladder as it stood before that tick.
    const due = run(running(), [{ type: 'code_update', time: T0, version: 'v2', urgent: false }]).state;
    const applying = run(due, [{ type: 'tick', time: T0 + DAY + MINUTE }]);
    expect(applying.steps.some((step) => ACTING_VERBS.has(step.verb))).toBe(true);
    const undone = run(due, [refused(T0 + DAY + MINUTE + SECOND)]);
    expect(undone.steps[0]?.reason).toContain('the code update to v2 waits for the next restart or 1 d');
    for (const later of [5 * SECOND, 10 * SECOND, HOUR]) {
      expect(run(undone.state, [{ type: 'tick', time: T0 + DAY + MINUTE + later }]).steps).toEqual([]);
    }
    expect(undone.state.pendingUpdate?.version).toBe('v2');
  });
});
