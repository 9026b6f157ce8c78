import { describe, expect, it } from 'vitest';
import { T0, SECOND, MINUTE, fault, run, shape, running } from './support.js';

// ByteRobust §6.2: evicted machines are replaced by warm standbys; with none left, a person decides.

describe('ladder: an eviction no warm standby was left for', () => {
  it('hands the job to a person, naming the nodes that left it, and schedules no relaunch', () => {
    const evicting = run(running(), [fault('machine', T0, ['node-3'], 'Xid 79')]).state;
    const { state, steps } = run(evicting, [{ type: 'standby_missing', time: T0 + SECOND, nodes: ['node-3'] }]);
    expect(shape(steps)).toEqual([{ verb: 'page_human' }]);
    expect(steps[0]?.reason).toMatch(/^no warm standby left to replace node-3: it has left the job, which is not relaunched without it/);
    expect(state.phase).toBe('waiting_for_human');
    expect(state.incident?.rung).toBe('human');
    expect(state.scheduled).toBeNull();
  });

  it('does not call the stopped transition "nothing was done" when it is refused back, and later faults are only recorded', () => {
    const waiting = run(running(), [fault('machine', T0, ['node-3'], 'Xid 79'), { type: 'standby_missing', time: T0 + SECOND, nodes: ['node-3'] }]).state;
    const refusal = run(waiting, [
      {
        type: 'recovery_refused',
        time: T0 + 2 * SECOND,
        transitionId: 't-evict',
        detail: 'evict stopped the transition: no warm standby left to replace node-3',
      },
    ]);
    expect(shape(refusal.steps)).toEqual([{ verb: 'notify' }]);
    expect(refusal.steps[0]?.reason).toBe(
      'recovery stopped (evict stopped the transition: no warm standby left to replace node-3); a person handles the incident',
    );
    expect(refusal.state.phase).toBe('waiting_for_human');
    const later = run(refusal.state, [fault('machine', T0 + MINUTE, ['node-5'], 'Xid 79')]);
    expect(shape(later.steps)).toEqual([{ verb: 'tolerate', nodes: ['node-5'] }]);
  });
});
