import { describe, expect, it } from 'vitest';
import { advance, type LadderConfig } from '../../../../controller/policy/ladder/index.js';
import type { LadderEvent } from '../../../../core/ladder.js';
import { T0, SECOND, MINUTE, JOB, NO_BACKOFF, fault, run, shape, jobOnV2, running } from './support.js';

// Real-time checks (ByteRobust §4.1)

describe('ladder: real-time checks', () => {
  it('stops the job, evicts the named node and restarts on standbys for a machine fault, without diagnostics', () => {
    const { state, steps } = run(running(), [fault('machine', T0, ['node-3'])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-3'] }, { verb: 'restart' }]);
    expect(steps.every((step) => step.job === JOB && step.reason.length > 0 && step.citation.length > 0)).toBe(true);
    expect(state.phase).toBe('stopped');
    expect(state.incident).toMatchObject({ trigger: 'machine', rung: 'evict', evictedNodes: ['node-3'], retry: { attempts: 1 } });
    expect(state.lastEvictionAt).toBe(T0);
    expect(state.exclusions).toEqual([{ node: 'node-3', times: [T0] }]);
  });

  it('resets the GPU in place and restarts on the same nodes for a machine fault a GPU reset may cure', () => {
    const event = { ...fault('machine', T0, ['node-3'], 'fatal Xid 48', 'xid:48'), resetGpu: '0000:3a:00' } as LadderEvent;
    const { state, steps } = run(running(), [event]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'reset_gpu', nodes: ['node-3'] }, { verb: 'restart' }]);
    expect(steps[1]?.gpu).toBe('0000:3a:00');
    expect(state.phase).toBe('stopped');
    // No standby taken, no exclusion counted: the node stays in the job if the reset holds.
    expect(state.incident?.evictedNodes).toEqual([]);
    expect(state.exclusions).toEqual([]);
    // The same fault reported again (the alert after the fast path) joins the reset; another later is a new one.
    const again = run(state, [{ ...event, signalId: 'alert-copy', time: T0 + 30 * SECOND } as LadderEvent]);
    expect(shape(again.steps)).toEqual([{ verb: 'tolerate', nodes: ['node-3'] }]);
    expect(again.steps[0]?.reason).toMatch(/joins that reset/);
    const later = run({ ...again.state, phase: 'running', incident: null }, [{ ...event, signalId: 'later', time: T0 + 11 * MINUTE } as LadderEvent]);
    expect(shape(later.steps).map((step) => step.verb)).toEqual(['stop', 'reset_gpu', 'restart']);
    // Without a GPU to reset the same fault evicts, as before.
    expect(shape(run(running(), [fault('machine', T0, ['node-3'], 'fatal Xid 48', 'xid:48')]).steps).map((step) => step.verb)).toEqual([
      'stop',
      'evict',
      'restart',
    ]);
  });

  it('handles a machine fault that names no node as a crash and runs diagnostics', () => {
    const { state, steps } = run(running(), [fault('machine', T0, [])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics' }]);
    expect(state.phase).toBe('diagnosing');
  });

  it('evicts a second node that fails while the job is relaunching, with one more restart', () => {
    const { state, steps } = run(running(), [fault('machine', T0, ['node-3']), fault('machine', T0 + SECOND, ['node-4'])]);
    expect(shape(steps)).toEqual([{ verb: 'evict', nodes: ['node-4'] }, { verb: 'restart' }]);
    expect(state.incident?.evictedNodes).toEqual(['node-3', 'node-4']);
    expect(state.incident?.retry.attempts).toBe(2);
  });

  it('records without acting a machine fault on a node already evicted in this incident', () => {
    const { state, steps } = run(running(), [fault('machine', T0, ['node-3']), fault('machine', T0 + SECOND, ['node-3'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-3'] }]);
    expect(state.incident?.retry.attempts).toBe(1);
  });

  it('tolerates the first network alert on a node and keeps the job running', () => {
    const { state, steps } = run(running(), [fault('network', T0, ['node-5'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-5'] }]);
    expect(state.phase).toBe('running');
    expect(state.incident).toBeNull();
    expect(state.networkAlerts).toEqual([{ node: 'node-5', times: [T0] }]);
  });

  it('evicts a node on its second network alert within 5 minutes', () => {
    const { state, steps } = run(running(), [fault('network', T0, ['node-5']), fault('network', T0 + 4 * MINUTE, ['node-5'])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-5'] }, { verb: 'restart' }]);
    expect(state.phase).toBe('stopped');
    expect(state.networkAlerts).toEqual([]);
  });

  it('tolerates a second network alert that comes more than 5 minutes after the first', () => {
    const { state, steps } = run(running(), [fault('network', T0, ['node-5']), fault('network', T0 + 6 * MINUTE, ['node-5'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-5'] }]);
    expect(state.phase).toBe('running');
  });

  it('counts network alerts per node, so alerts on two nodes evict neither', () => {
    const { steps } = run(running(), [fault('network', T0, ['node-5']), fault('network', T0 + MINUTE, ['node-6'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-6'] }]);
  });

  it('takes the network threshold from the config', () => {
    const config: LadderConfig = { ...NO_BACKOFF, networkAlertsBeforeEviction: 3 };
    const events = [fault('network', T0, ['node-5']), fault('network', T0 + MINUTE, ['node-5'])];
    expect(shape(run(running(), events, config).steps)).toEqual([{ verb: 'tolerate', nodes: ['node-5'] }]);
    expect(shape(run(running(), [...events, fault('network', T0 + 2 * MINUTE, ['node-5'])], config).steps)).toEqual([
      { verb: 'stop' },
      { verb: 'evict', nodes: ['node-5'] },
      { verb: 'restart' },
    ]);
  });

  it('rolls a user-code error back to the last good version and restarts, marking the failing version bad', () => {
    const onV3 = run(jobOnV2(), [
      { type: 'code_update', time: T0 + 4 * MINUTE, version: 'v3', urgent: true },
      { type: 'restart_succeeded', time: T0 + 4 * MINUTE + SECOND },
    ]).state;
    const { state, steps } = run(onV3, [fault('user_code', T0 + 5 * MINUTE)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v2' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    expect(state.runningVersion).toBe('v2');
    expect(state.codeVersions.find((entry) => entry.version === 'v3')).toMatchObject({ verdict: 'bad', verdictAt: T0 + 5 * MINUTE });
    expect(state.incident).toMatchObject({ trigger: 'user_code', rung: 'rollback', rolledBackFrom: 'v3' });
  });

  it('pages a human for a user-code error when no earlier version is known to be good', () => {
    const { state, steps } = run(running(), [fault('user_code', T0)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'page_human' }]);
    expect(state.phase).toBe('waiting_for_human');
    expect(state.incident?.rung).toBe('human');
  });

  it('rolls back further when the rolled-back version raises a user-code error too', () => {
    const start = run(running('v1'), [
      { type: 'restart_succeeded', time: T0 + MINUTE },
      { type: 'code_update', time: T0 + 2 * MINUTE, version: 'v2', urgent: true },
      { type: 'restart_succeeded', time: T0 + 3 * MINUTE },
      { type: 'code_update', time: T0 + 4 * MINUTE, version: 'v3', urgent: true },
    ]).state;
    const { state, steps } = run(start, [fault('user_code', T0 + 5 * MINUTE), fault('user_code', T0 + 6 * MINUTE)]);
    expect(shape(steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.codeVersions.map((entry) => [entry.version, entry.verdict])).toEqual([
      ['v1', 'good'],
      ['v2', 'bad'],
      ['v3', 'bad'],
    ]);
  });

  it('stops the job and runs diagnostics for a crash without a culprit', () => {
    const { state, steps } = run(running(), [fault('crash', T0, ['node-2'])]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics', nodes: ['node-2'] }]);
    expect(state.phase).toBe('diagnosing');
    expect(state.incident).toMatchObject({ trigger: 'crash', rung: 'diagnose', tried: { diagnose: 1 } });
  });

  it('stops the job and runs diagnostics for a NaN loss', () => {
    const { state, steps } = run(running(), [fault('numerical', T0)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics' }]);
    expect(state.incident?.trigger).toBe('numerical');
  });

  it('asks for stack aggregation on a performance anomaly and leaves the job running', () => {
    const { state, steps } = run(running(), [fault('performance', T0, ['node-9'])]);
    expect(shape(steps)).toEqual([{ verb: 'analyze_stacks', nodes: ['node-9'] }]);
    expect(state.phase).toBe('running');
    expect(state.incident).toBeNull();
  });

  it('only records a performance anomaly while the job is stopped for recovery', () => {
    const { steps } = run(running(), [fault('crash', T0), fault('performance', T0 + SECOND, ['node-9'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-9'] }]);
  });

  it('only records a transient fault', () => {
    const { state, steps } = run(running(), [fault('transient', T0, ['node-1'])]);
    expect(shape(steps)).toEqual([{ verb: 'tolerate', nodes: ['node-1'] }]);
    expect(state.phase).toBe('running');
  });

  it('ignores a fault whose signal id it has already handled', () => {
    const first = fault('machine', T0, ['node-3']);
    const after = run(running(), [first]);
    const again = advance(after.state, first, NO_BACKOFF);
    expect(again.steps).toEqual([]);
    expect(again.state).toEqual(after.state);
  });
});
