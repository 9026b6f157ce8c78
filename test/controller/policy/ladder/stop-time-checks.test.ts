import { describe, expect, it } from 'vitest';
import { type LadderState } from '../../../../controller/policy/ladder/index.js';
import { T0, SECOND, MINUTE, fault, run, shape, jobOnV2, running } from './support.js';

// Stop-time checks (ByteRobust §4.2)

describe('ladder: stop-time checks', () => {
  const diagnosing = (): LadderState => run(running(), [fault('crash', T0)]).state;

  it('evicts the suspects diagnostics found and restarts on standbys', () => {
    const { state, steps } = run(diagnosing(), [{ type: 'diagnostics_result', time: T0 + MINUTE, suspects: ['node-4', 'node-4'] }]);
    expect(shape(steps)).toEqual([{ verb: 'evict', nodes: ['node-4'] }, { verb: 'restart' }]);
    expect(state.phase).toBe('stopped');
    expect(state.incident?.rung).toBe('evict');
  });

  it('reattempts in place when diagnostics find nothing', () => {
    const { state, steps } = run(diagnosing(), [{ type: 'diagnostics_result', time: T0 + MINUTE, suspects: [] }]);
    expect(shape(steps)).toEqual([{ verb: 'reattempt' }]);
    expect(state.phase).toBe('reattempting');
  });

  it('reattempts in place when diagnostics name only quarantined nodes', () => {
    const base = diagnosing();
    const state = { ...base, quarantined: ['node-4'] };
    const { steps } = run(state, [{ type: 'diagnostics_result', time: T0 + MINUTE, suspects: ['node-4'] }]);
    expect(shape(steps)).toEqual([{ verb: 'reattempt' }]);
  });

  it('rolls back when the reattempt fails', () => {
    const reattempting = run(jobOnV2(), [fault('crash', T0 + 5 * MINUTE), { type: 'diagnostics_result', time: T0 + 6 * MINUTE, suspects: [] }]).state;
    const { state, steps } = run(reattempting, [{ type: 'restart_failed', time: T0 + 7 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    expect(steps[0]?.citation).toContain('step ⑥');
  });

  it('goes straight to dual-phase replay when the reattempt fails and no earlier version is good', () => {
    const reattempting = run(running(), [fault('crash', T0), { type: 'diagnostics_result', time: T0 + MINUTE, suspects: [] }]).state;
    const { state, steps } = run(reattempting, [{ type: 'restart_failed', time: T0 + 2 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'run_replay' }]);
    expect(state.phase).toBe('replaying');
  });

  it('treats a crash reported while a reattempt is being awaited as the reattempt failing', () => {
    const reattempting = run(jobOnV2(), [fault('crash', T0 + 5 * MINUTE), { type: 'diagnostics_result', time: T0 + 6 * MINUTE, suspects: [] }]).state;
    const { steps } = run(reattempting, [fault('crash', T0 + 7 * MINUTE)]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
  });

  it('rolls back when the job crashes again after an eviction', () => {
    const relaunching = run(jobOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3'])]).state;
    const { state, steps } = run(relaunching, [fault('crash', T0 + 6 * MINUTE)]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    expect(steps[0]?.citation).toContain('step ⑦');
  });

  it('rolls back when a restart after an eviction fails', () => {
    const relaunching = run(jobOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3'])]).state;
    const { steps } = run(relaunching, [{ type: 'restart_failed', time: T0 + 6 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
  });

  it('enters the stop-time checks when a restart after an eviction fails and there is nothing to roll back to', () => {
    const relaunching = run(running(), [fault('machine', T0, ['node-3'])]).state;
    const { state, steps } = run(relaunching, [{ type: 'restart_failed', time: T0 + MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'run_diagnostics' }]);
    expect(state.phase).toBe('diagnosing');
  });

  it('rolls back when the job crashes on the replacement soon after an eviction whose restart had succeeded', () => {
    const recovered = run(jobOnV2(), [
      fault('machine', T0 + 5 * MINUTE, ['node-3']),
      { type: 'restart_failed', time: T0 + 6 * MINUTE },
      { type: 'restart_succeeded', time: T0 + 7 * MINUTE },
      { type: 'code_update', time: T0 + 8 * MINUTE, version: 'v4', urgent: true },
      { type: 'restart_succeeded', time: T0 + 9 * MINUTE },
      fault('machine', T0 + 10 * MINUTE, ['node-8']),
      { type: 'standby_activated', time: T0 + 10 * MINUTE, replaced: 'node-8', by: 'spare-1' },
      { type: 'restart_succeeded', time: T0 + 11 * MINUTE },
    ]).state;
    const { state, steps } = run(recovered, [fault('crash', T0 + 20 * MINUTE, ['spare-1'])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    const later = run(recovered, [fault('crash', T0 + 11 * MINUTE + 31 * MINUTE, ['spare-1'])]);
    expect(shape(later.steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics', nodes: ['spare-1'] }]);
  });

  it('runs dual-phase replay when the rollback fails', () => {
    const rolling = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE)]).state;
    const { state, steps } = run(rolling, [{ type: 'restart_failed', time: T0 + 6 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'run_replay' }]);
    expect(state.phase).toBe('replaying');
    expect(steps[0]?.citation).toContain('step ⑧');
  });

  it('evicts the machines replay isolates and restarts', () => {
    const replaying = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE), { type: 'restart_failed', time: T0 + 6 * MINUTE }]).state;
    const { state, steps } = run(replaying, [{ type: 'replay_result', time: T0 + 30 * MINUTE, culprits: ['node-13'] }]);
    expect(shape(steps)).toEqual([{ verb: 'evict', nodes: ['node-13'] }, { verb: 'restart' }]);
    expect(state.phase).toBe('stopped');
    expect(steps[0]?.citation).toContain('step ⑨');
  });

  it('pages a human when replay isolates no machine', () => {
    const replaying = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE), { type: 'restart_failed', time: T0 + 6 * MINUTE }]).state;
    const { state, steps } = run(replaying, [{ type: 'replay_result', time: T0 + 30 * MINUTE, culprits: [] }]);
    expect(shape(steps)).toEqual([{ verb: 'page_human' }]);
    expect(state.phase).toBe('waiting_for_human');
  });

  it('says that no replay ran, and why, when it pages a human for a replay that could not run', () => {
    const replaying = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE), { type: 'restart_failed', time: T0 + 6 * MINUTE }]).state;
    const unrun = 'launcher "srun" has no replay command';
    const { state, steps } = run(replaying, [{ type: 'replay_result', time: T0 + 30 * MINUTE, culprits: [], unrun }]);
    expect(shape(steps)).toEqual([{ verb: 'page_human' }]);
    expect(steps[0]?.reason).toContain(`no dual-phase replay ran: ${unrun}`);
    expect(steps[0]?.reason).not.toContain('isolated no machine');
    expect(state.phase).toBe('waiting_for_human');
  });

  it('says that no diagnostics ran, and why, when it reattempts after diagnostics that could not run', () => {
    const { steps } = run(diagnosing(), [
      { type: 'diagnostics_result', time: T0 + MINUTE, suspects: [], unrun: 'the diagnostics analysis failed after 3 attempts' },
    ]);
    expect(shape(steps)).toEqual([{ verb: 'reattempt' }]);
    expect(steps[0]?.reason).toContain('no diagnostics ran: the diagnostics analysis failed after 3 attempts');
  });

  it('pages a human when the restart after replay fails and every rung was tried', () => {
    const afterReplay = run(running(), [
      fault('crash', T0),
      { type: 'diagnostics_result', time: T0 + MINUTE, suspects: [] },
      { type: 'restart_failed', time: T0 + 2 * MINUTE },
      { type: 'replay_result', time: T0 + 3 * MINUTE, culprits: ['node-13'] },
    ]).state;
    const { state, steps } = run(afterReplay, [{ type: 'restart_failed', time: T0 + 4 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'page_human' }]);
    expect(state.phase).toBe('waiting_for_human');
  });

  it('only records crashes while the job is stopped for diagnostics', () => {
    const { state, steps } = run(running(), [fault('crash', T0), fault('crash', T0 + SECOND)]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate' }]);
    expect(state.phase).toBe('diagnosing');
  });

  it('only records test results and restart failures that arrive when nothing awaits them', () => {
    expect(shape(run(running(), [{ type: 'diagnostics_result', time: T0, suspects: ['node-1'] }]).steps)).toEqual([{ verb: 'tolerate', nodes: ['node-1'] }]);
    expect(shape(run(running(), [{ type: 'replay_result', time: T0, culprits: [] }]).steps)).toEqual([{ verb: 'tolerate' }]);
    const stale = run(running(), [{ type: 'restart_failed', time: T0 }]);
    expect(shape(stale.steps)).toEqual([{ verb: 'tolerate' }]);
    expect(stale.state.phase).toBe('running');
  });
});
