import { describe, expect, it } from 'vitest';
import type { FaultEvent } from '../../../../core/ladder.js';
import { advance, failureSignature, ladderStateSchema, type LadderState } from '../../../../controller/policy/ladder/index.js';
import { T0, MINUTE, NO_BACKOFF, fault, run, shape, jobOnV2 } from './support.js';

// ByteRobust §4.2 step ⑦: roll back when training crashes *again* after an eviction — when the
// evidence says the eviction did not help, not for any crash that happens to fall in the window.

const NCCL = 'nccl:ncclRemoteError';
const OOM = 'exception:OutOfMemoryError';

/**
 * A job on v2 (v1 good) that crashed with an NCCL error, had node-4 found by diagnostics and
 * evicted onto spare-1, and trains again since T0 + 8 min.
 */
function recoveredFromDiagnosedEviction(): LadderState {
  return run(jobOnV2(), [
    fault('crash', T0 + 5 * MINUTE, ['node-2'], 'worker failed', NCCL),
    { type: 'diagnostics_result', time: T0 + 6 * MINUTE, suspects: ['node-4'] },
    { type: 'standby_activated', time: T0 + 6 * MINUTE, replaced: 'node-4', by: 'spare-1' },
    { type: 'restart_succeeded', time: T0 + 8 * MINUTE },
  ]).state;
}

describe('ladder: a crash after an eviction', () => {
  it('keeps what the eviction acted on after the incident closes', () => {
    const state = recoveredFromDiagnosedEviction();
    expect(state.phase).toBe('running');
    expect(state.lastEvictionAt).toBe(T0 + 6 * MINUTE);
    expect(state.lastEviction).toEqual({ at: T0 + 6 * MINUTE, nodes: ['node-4'], signatures: [`crash:${NCCL}`] });
    expect(state.replacements).toEqual([{ node: 'spare-1', replaced: 'node-4', at: T0 + 6 * MINUTE }]);
  });

  it('rolls back when the same failure comes back within the window, wherever it is reported', () => {
    const { state, steps } = run(recoveredFromDiagnosedEviction(), [fault('crash', T0 + 20 * MINUTE, ['node-7'], 'worker failed again', NCCL)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    expect(steps[1]?.citation).toContain('step ⑦');
    expect(steps[1]?.reason).toContain(`the same failure (crash:${NCCL})`);
  });

  it('rolls back when a different failure strikes the standby that replaced the evicted node', () => {
    const { steps } = run(recoveredFromDiagnosedEviction(), [fault('crash', T0 + 20 * MINUTE, ['spare-1'], 'worker failed', OOM)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(steps[1]?.reason).toContain('on spare-1, the standby that replaced node-4');
  });

  it('treats an unrelated crash within the window as a new incident for the stop-time checks', () => {
    const { state, steps } = run(recoveredFromDiagnosedEviction(), [fault('crash', T0 + 20 * MINUTE, ['node-7'], 'worker failed', OOM)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics', nodes: ['node-7'] }]);
    expect(state.phase).toBe('diagnosing');
    expect(state.incident).toMatchObject({ trigger: 'crash', rung: 'diagnose', signatures: [`crash:${OOM}`] });
    expect(steps[1]?.reason).toContain('a different failure and not on a standby that replaced an evicted node');
    expect(steps[1]?.citation).toContain('step ③');
    // The version the job runs is not blamed.
    expect(state.codeVersions.find((entry) => entry.version === 'v2')?.verdict).toBe('good');
  });

  it('compares classes too: a NaN loss after an eviction for a crash is a new incident', () => {
    const { steps } = run(recoveredFromDiagnosedEviction(), [fault('numerical', T0 + 20 * MINUTE, [], 'NaN loss', NCCL)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics' }]);
  });

  it('diagnoses the same failure once the window has passed', () => {
    const { steps } = run(recoveredFromDiagnosedEviction(), [fault('crash', T0 + 6 * MINUTE + 31 * MINUTE, ['spare-1'], 'worker failed', NCCL)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics', nodes: ['spare-1'] }]);
  });

  it('keeps every failure the evicting incident saw, not only the one that opened it', () => {
    // A crash opens the incident; a fatal Xid on node-5 during diagnostics evicts it.
    const recovered = run(jobOnV2(), [
      fault('crash', T0 + 5 * MINUTE, ['node-2'], 'worker failed', OOM),
      fault('machine', T0 + 6 * MINUTE, ['node-5'], 'fatal Xid 79', 'xid:79'),
      { type: 'restart_succeeded', time: T0 + 8 * MINUTE },
    ]).state;
    expect(recovered.lastEviction?.signatures).toEqual([`crash:${OOM}`, 'machine:xid:79']);
    expect(shape(run(recovered, [fault('crash', T0 + 15 * MINUTE, ['node-1'], 'worker failed', OOM)]).steps)).toEqual([
      { verb: 'stop' },
      { verb: 'rollback', version: 'v1' },
      { verb: 'restart' },
    ]);
  });

  it('records a standby activation once, emits nothing for it, and forgets it after the window', () => {
    const state = recoveredFromDiagnosedEviction();
    const again = advance(state, { type: 'standby_activated', time: T0 + 9 * MINUTE, replaced: 'node-4', by: 'spare-1' }, NO_BACKOFF);
    expect(again.steps).toEqual([]);
    expect(again.state.replacements).toEqual(state.replacements);
    const later = advance(state, { type: 'tick', time: T0 + 6 * MINUTE + 31 * MINUTE }, NO_BACKOFF);
    expect(later.state.replacements).toEqual([]);
  });

  it('keeps the old rule for a state stored before the evidence was kept, and still parses it', () => {
    const current = run(jobOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3']), { type: 'restart_succeeded', time: T0 + 6 * MINUTE }]).state;
    // What an older controller stored: no signatures, no eviction record, no replacements.
    const { lastEviction: _record, replacements: _replacements, ...stored } = JSON.parse(JSON.stringify(current)) as LadderState;
    const old = ladderStateSchema.parse(stored) as LadderState;
    expect(old.lastEviction).toBeNull();
    expect(old.replacements).toEqual([]);
    expect(old.lastEvictionAt).toBe(T0 + 5 * MINUTE);
    const { steps } = run(old, [fault('crash', T0 + 10 * MINUTE, ['node-7'], 'worker failed', OOM)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(steps[1]?.reason).toContain('no record of what the eviction was for');

    const incidentWithoutSignatures = { ...JSON.parse(JSON.stringify(run(jobOnV2(), [fault('crash', T0)]).state)) };
    delete incidentWithoutSignatures.incident.signatures;
    expect((ladderStateSchema.parse(incidentWithoutSignatures) as LadderState).incident?.signatures).toEqual([]);
  });
});

describe('failureSignature', () => {
  const event = (overrides: Partial<FaultEvent>): FaultEvent => ({
    type: 'fault',
    time: T0,
    signalId: 's',
    faultClass: 'crash',
    nodes: [],
    detail: '',
    ...overrides,
  });

  it('is the fault class and the kind the classifier named', () => {
    expect(failureSignature(event({ signature: 'xid:79', faultClass: 'machine', detail: 'fatal Xid 79 on node-3' }))).toBe('machine:xid:79');
  });

  it('without a kind, normalises the detail so the same failure from two nodes is one signature', () => {
    const a = failureSignature(event({ nodes: ['node-00012'], detail: 'CUDA Error reported by node-00012 at 0x7f3a pid 123456' }));
    const b = failureSignature(event({ nodes: ['node-00344'], detail: 'CUDA error reported by node-00344 at 0x55e0 pid 99999' }));
    expect(a).toBe('crash:cuda error reported by at # pid #');
    expect(b).toBe(a);
    expect(failureSignature(event({ faultClass: 'numerical', detail: 'CUDA Error' }))).not.toBe(failureSignature(event({ detail: 'CUDA Error' })));
  });
});
