import { describe, expect, it } from 'vitest';
import { FAULT_CLASSES } from '../../../../core/ladder.js';
import { T0, SECOND, MINUTE, HOUR, DAY, fault, run, shape, relaunchingOnV2, jobOnV2, running } from './support.js';

// Closing an incident, and the human rung

describe('ladder: closing incidents', () => {
  it('closes the incident on a successful restart and marks the running version good', () => {
    const relaunching = run(relaunchingOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3'])]).state;
    expect(relaunching.codeVersions.find((entry) => entry.version === 'v2')?.verdict).toBe('unproven');
    const { state, steps } = run(relaunching, [{ type: 'restart_succeeded', time: T0 + 6 * MINUTE }]);
    expect(steps).toEqual([]);
    expect(state.phase).toBe('running');
    expect(state.incident).toBeNull();
    expect(state.codeVersions.find((entry) => entry.version === 'v2')).toMatchObject({ verdict: 'good', verdictAt: T0 + 6 * MINUTE });
  });

  it('tells the code owners which version stays bad when training progresses after a rollback', () => {
    const rolling = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE)]).state;
    const { state, steps } = run(rolling, [{ type: 'restart_succeeded', time: T0 + 6 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'notify', version: 'v2' }]);
    expect(state.runningVersion).toBe('v1');
    expect(state.codeVersions.map((entry) => [entry.version, entry.verdict])).toEqual([
      ['v1', 'good'],
      ['v2', 'bad'],
    ]);
  });

  it('only records faults while a human handles the incident, and returns to running when training progresses again', () => {
    const paged = run(running(), [fault('user_code', T0)]).state;
    for (const faultClass of FAULT_CLASSES) {
      const { state, steps } = run(paged, [fault(faultClass, T0 + MINUTE, ['node-1'])]);
      expect(shape(steps), faultClass).toEqual([{ verb: 'tolerate', nodes: ['node-1'] }]);
      expect(state.phase).toBe('waiting_for_human');
    }
    const { state } = run(paged, [{ type: 'restart_succeeded', time: T0 + HOUR }]);
    expect(state.phase).toBe('running');
    expect(state.incident).toBeNull();
  });
});

// Hot update (ByteRobust §6.1)

describe('ladder: code updates', () => {
  it('applies an urgent update at once: stop, apply the update, restart', () => {
    const { state, steps } = run(running(), [{ type: 'code_update', time: T0 + MINUTE, version: 'v2', urgent: true }]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'apply_update', version: 'v2' }, { verb: 'restart' }]);
    expect(state.phase).toBe('stopped');
    expect(state.runningVersion).toBe('v2');
    expect(state.pendingUpdate).toBeNull();
    expect(state.codeVersions.find((entry) => entry.version === 'v2')).toMatchObject({ urgent: true, appliedAt: T0 + MINUTE, verdict: 'unproven' });
    expect(state.incident).toMatchObject({ trigger: 'code_update', rung: 'update' });
  });

  it('holds a non-urgent update with a 24 h deadline and keeps training', () => {
    const { state, steps } = run(running(), [{ type: 'code_update', time: T0 + MINUTE, version: 'v2', urgent: false }]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', version: 'v2' }]);
    expect(state.phase).toBe('running');
    expect(state.pendingUpdate).toEqual({ version: 'v2', urgent: false, requestedAt: T0 + MINUTE, deadline: T0 + MINUTE + DAY });
    expect(state.codeVersions.find((entry) => entry.version === 'v2')).toMatchObject({ appliedAt: null, verdict: 'unproven' });
  });

  it('applies a held update with the restart that follows the next eviction', () => {
    const { state, steps } = run(running(), [{ type: 'code_update', time: T0, version: 'v2', urgent: false }, fault('machine', T0 + HOUR, ['node-3'])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-3'] }, { verb: 'apply_update', version: 'v2' }, { verb: 'restart' }]);
    expect(state.runningVersion).toBe('v2');
    expect(state.pendingUpdate).toBeNull();
  });

  it('applies a held update with a reattempt', () => {
    const { steps } = run(running(), [
      { type: 'code_update', time: T0, version: 'v2', urgent: false },
      fault('crash', T0 + HOUR),
      { type: 'diagnostics_result', time: T0 + HOUR + MINUTE, suspects: [] },
    ]);
    expect(shape(steps)).toEqual([{ verb: 'apply_update', version: 'v2' }, { verb: 'reattempt' }]);
  });

  it('keeps a held update pending through a rollback, which must not be undone by it', () => {
    const { state, steps } = run(jobOnV2(), [
      { type: 'code_update', time: T0 + 3 * MINUTE, version: 'v3', urgent: false },
      fault('user_code', T0 + 4 * MINUTE),
    ]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.pendingUpdate?.version).toBe('v3');
  });

  it('applies a held update on the first tick past its 24 h deadline', () => {
    const held = run(running(), [{ type: 'code_update', time: T0, version: 'v2', urgent: false }]).state;
    expect(run(held, [{ type: 'tick', time: T0 + DAY - SECOND }]).steps).toEqual([]);
    const { state, steps } = run(held, [{ type: 'tick', time: T0 + DAY }]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'apply_update', version: 'v2' }, { verb: 'restart' }]);
    expect(state.phase).toBe('stopped');
  });

  it('keeps the earlier deadline when a newer non-urgent update supersedes a held one', () => {
    const { state } = run(running(), [
      { type: 'code_update', time: T0, version: 'v2', urgent: false },
      { type: 'code_update', time: T0 + HOUR, version: 'v3', urgent: false },
    ]);
    expect(state.pendingUpdate).toEqual({ version: 'v3', urgent: false, requestedAt: T0 + HOUR, deadline: T0 + DAY });
    expect(state.codeVersions.map((entry) => entry.version)).toEqual(['v1', 'v2', 'v3']);
  });

  it('holds an urgent update that arrives during recovery for the next restart of the incident', () => {
    const { state, steps } = run(running(), [fault('crash', T0), { type: 'code_update', time: T0 + SECOND, version: 'v2', urgent: true }]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', version: 'v2' }]);
    expect(state.pendingUpdate).toMatchObject({ version: 'v2', urgent: true, deadline: T0 + SECOND });
    const next = run(state, [{ type: 'diagnostics_result', time: T0 + MINUTE, suspects: ['node-2'] }]);
    expect(shape(next.steps)).toEqual([{ verb: 'evict', nodes: ['node-2'] }, { verb: 'apply_update', version: 'v2' }, { verb: 'restart' }]);
  });

  it('rolls back to the last good version when the restart after an update fails', () => {
    const { state, steps } = run(relaunchingOnV2(), [{ type: 'restart_failed', time: T0 + 3 * MINUTE }]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(steps[0]?.citation).toContain('§6.1');
    expect(state.codeVersions.find((entry) => entry.version === 'v2')?.verdict).toBe('bad');
  });

  it('only records a request for the version already running', () => {
    const { state, steps } = run(running('v1'), [{ type: 'code_update', time: T0, version: 'v1', urgent: true }]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', version: 'v1' }]);
    expect(state.phase).toBe('running');
  });

  it('gives a version rolled back earlier a fresh chance when a person requests it again', () => {
    const rolledBack = run(jobOnV2(), [fault('user_code', T0 + 5 * MINUTE), { type: 'restart_succeeded', time: T0 + 6 * MINUTE }]).state;
    const { state, steps } = run(rolledBack, [{ type: 'code_update', time: T0 + HOUR, version: 'v2', urgent: true }]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'apply_update', version: 'v2' }, { verb: 'restart' }]);
    expect(state.codeVersions.find((entry) => entry.version === 'v2')).toMatchObject({ verdict: 'unproven', appliedAt: T0 + HOUR });
  });
});
