import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import type { Signal } from '../../core/signal.js';
import { FAULT_CLASSES, type FaultClass, type LadderEvent, type LadderStep } from '../../core/ladder.js';
import { classifySignal, type Classification } from '../../controller/fault-class.js';
import {
  advance,
  DEFAULT_LADDER_CONFIG,
  faultEventFromSignal,
  initialLadderState,
  ladderStateSchema,
  type LadderConfig,
  type LadderState,
  type LadderTransition,
} from '../../controller/ladder/index.js';

const T0 = Date.parse('2026-03-02T08:00:00.000Z');
const SECOND = 1000;
const MINUTE = 60 * SECOND;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const JOB = 'llm-70b';

/** Transition tests pin the rungs; the retry chain's backoff has tests of its own. */
const NO_BACKOFF: LadderConfig = { ...DEFAULT_LADDER_CONFIG, retryInitialBackoffMs: 0 };

// ---------------------------------------------------------------------------------------------
// Helpers

let signalCounter = 0;
function fault(faultClass: FaultClass, at: number, nodes: string[] = [], detail = 'test fault'): LadderEvent {
  signalCounter += 1;
  return { type: 'fault', time: at, signalId: `s-${signalCounter}`, faultClass, nodes, detail };
}

/** Feeds the events in order and returns the last transition. */
function run(state: LadderState, events: LadderEvent[], config: LadderConfig = NO_BACKOFF): LadderTransition {
  let current: LadderTransition = { state, steps: [] };
  for (const event of events) current = advance(current.state, event, config);
  return current;
}

/** The steps without their free-text reason and citation. */
function shape(steps: LadderStep[]): Array<{ verb: string; nodes?: string[]; version?: string }> {
  return steps.map((step) => ({
    verb: step.verb,
    ...(step.nodes === undefined ? {} : { nodes: step.nodes }),
    ...(step.version === undefined ? {} : { version: step.version }),
  }));
}

/** A job that trained on v1, was hot-updated to v2 and is relaunching on it. */
function relaunchingOnV2(): LadderState {
  const start = initialLadderState(JOB, { time: T0, version: 'v1' });
  return run(start, [
    { type: 'restart_succeeded', time: T0 + MINUTE },
    { type: 'code_update', time: T0 + 2 * MINUTE, version: 'v2', urgent: true },
  ]).state;
}

/** A job that trained on v1 and now trains on v2. */
function jobOnV2(): LadderState {
  return run(relaunchingOnV2(), [{ type: 'restart_succeeded', time: T0 + 3 * MINUTE }]).state;
}

function running(version = 'v1'): LadderState {
  return initialLadderState(JOB, { time: T0, version });
}

function signal(overrides: Partial<Signal> & Pick<Signal, 'kind'>): Signal {
  return {
    id: 's-test',
    node: 'node-7',
    severity: 'critical',
    time: '2026-03-02T08:00:00.000Z',
    receivedAt: '2026-03-02T08:00:01.000Z',
    fingerprint: 'fp',
    source: 'agent',
    evidence: {},
    ...overrides,
  };
}

function alert(alertname: string, extra: Signal['evidence'] = {}): Signal {
  return signal({ kind: 'alert', source: 'alertmanager', evidence: { alertname, status: 'firing', ...extra } });
}

function classOf(result: Classification): string {
  return result.verdict === 'fault' ? result.faultClass : 'ignore';
}

// ---------------------------------------------------------------------------------------------
// Classification

describe('classifySignal', () => {
  it('classifies a lost GPU as a machine fault on its node, and as a crash when no node is named', () => {
    expect(classifySignal(signal({ kind: 'gpu_lost', gpu: '0000:3b:00' }))).toMatchObject({ verdict: 'fault', faultClass: 'machine', node: 'node-7' });
    expect(classifySignal(signal({ kind: 'gpu_lost', node: undefined }))).toMatchObject({ verdict: 'fault', faultClass: 'crash' });
  });

  it.each([
    [48, '', 'warning', 'machine'],
    [79, '', 'critical', 'machine'],
    [95, '', 'warning', 'machine'],
    [13, '', 'warning', 'transient'],
    [31, '', 'warning', 'transient'],
    [45, '', 'info', 'transient'],
    [63, '', 'warning', 'transient'],
    [145, 'NVLink: Fatal XC0 i0 Link 00', 'warning', 'machine'],
    [145, 'NVLink: Nonfatal XC0 i0 Link 00', 'warning', 'transient'],
    [154, 'GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)', 'warning', 'machine'],
  ] as const)('classifies Xid %i (message "%s", severity %s) as %s', (xid, message, severity, expected) => {
    expect(classOf(classifySignal(signal({ kind: 'xid', severity, evidence: { xid, message } })))).toBe(expected);
  });

  it('trusts a fatal verdict the agent put in the severity or the xid_severity label for an Xid it cannot classify from the code', () => {
    expect(classOf(classifySignal(signal({ kind: 'xid', severity: 'critical', evidence: { xid: 144 } })))).toBe('machine');
    expect(classOf(classifySignal(signal({ kind: 'xid', severity: 'warning', evidence: { xid: 144, 'label.xid_severity': 'fatal' } })))).toBe('machine');
    expect(classOf(classifySignal(signal({ kind: 'xid', severity: 'warning', evidence: {} })))).toBe('transient');
  });

  it('classifies an NCCL timeout that names an RDMA port as a network fault, and one that does not as a crash', () => {
    const named = signal({ kind: 'nccl_timeout', evidence: { message: 'NET/IB : Got completion from peer with error 12 on mlx5_3:1' } });
    expect(classifySignal(named)).toMatchObject({ verdict: 'fault', faultClass: 'network', node: 'node-7' });
    const plain = signal({ kind: 'nccl_timeout', evidence: { message: 'rank 3: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)' } });
    expect(classOf(classifySignal(plain))).toBe('crash');
    const unplaced = signal({ kind: 'nccl_timeout', node: undefined, evidence: { message: 'error on mlx5_0' } });
    expect(classOf(classifySignal(unplaced))).toBe('crash');
  });

  it.each([
    'TypeError',
    'IndexError',
    'KeyError',
    'AttributeError',
    'ValueError',
    'AssertionError',
    'ImportError',
    'ModuleNotFoundError',
    'SyntaxError',
    'IndentationError',
    'NameError',
    'UnboundLocalError',
    'ZeroDivisionError',
    'NotImplementedError',
    'RecursionError',
  ])('classifies a worker failure raising %s as a user-code fault', (exception) => {
    const message = `ChildFailedError; root cause rank 3 exitcode 1 on node-7; Traceback (most recent call last):\n  File "train.py", line 4\n${exception}: bad input`;
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { message } })))).toBe('user_code');
  });

  it('classifies a worker failure with a RuntimeError or no exception as a crash, since PyTorch raises those for CUDA and NCCL too', () => {
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { message: 'RuntimeError: CUDA error: an illegal memory access' } })))).toBe('crash');
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { message: 'failed (exitcode: -9) local_rank: 0' } })))).toBe('crash');
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { message: 'MyTypeErrorHandler gave up' } })))).toBe('crash');
  });

  it('classifies a worker failure as user code when its exit code is one the job declares a user error', () => {
    const failed = signal({ kind: 'worker_failed', evidence: { message: 'root cause rank 0 exitcode 3 on node-7' } });
    expect(classOf(classifySignal(failed, { userErrorExitCodes: [3] }))).toBe('user_code');
    expect(classOf(classifySignal(failed, { userErrorExitCodes: [2] }))).toBe('crash');
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { exitCode: 2 } }), { userErrorExitCodes: [2] }))).toBe('user_code');
  });

  it.each([
    ['SteadfastGpuLost', 'machine'],
    ['SteadfastGpuEccUncorrectable', 'machine'],
    ['SteadfastGpuRowRemapFailed', 'machine'],
    ['SteadfastGpuRowRemapPending', 'transient'],
    ['SteadfastGpuTemperatureHigh', 'performance'],
    ['SteadfastGpuHardwareSlowdown', 'performance'],
    ['SteadfastRdmaPortDown', 'network'],
    ['SteadfastRdmaPortFlapping', 'network'],
    ['SteadfastRdmaPortErrors', 'network'],
    ['SteadfastRdmaZeroTraffic', 'performance'],
    ['SteadfastNfsRpcSlotsSaturated', 'transient'],
    ['SteadfastNfsRpcBacklog', 'transient'],
    ['SteadfastNfsMajorTimeouts', 'transient'],
    ['SteadfastTrainingLossSpike', 'numerical'],
    ['SteadfastTrainingGradNormSpike', 'numerical'],
    ['SteadfastTrainingLossNaN', 'numerical'],
    ['SteadfastTrainingNanIterations', 'numerical'],
    ['SteadfastTrainingSkippedIterations', 'transient'],
    ['SteadfastTrainingSlowdown', 'performance'],
    ['SteadfastTrainingStalled', 'performance'],
    ['SteadfastTrainingWorkerFailed', 'crash'],
    ['SteadfastXidApplicationRepeated', 'crash'],
    ['SteadfastXidNodeRebootRequired', 'machine'],
    ['SteadfastAgentDown', 'ignore'],
    ['SteadfastControllerDown', 'ignore'],
    ['SteadfastQueueBacklog', 'ignore'],
    ['SteadfastDecisionLag', 'ignore'],
    ['SteadfastActionsRefused', 'ignore'],
    ['SteadfastActionsFailing', 'ignore'],
    ['SomebodyElsesAlert', 'ignore'],
  ])('classifies the firing alert %s as %s', (alertname, expected) => {
    expect(classOf(classifySignal(alert(alertname)))).toBe(expected);
  });

  it('classifies SteadfastXidFatal as a machine fault and SteadfastXidGpuResetRequired by its Xid code', () => {
    expect(classOf(classifySignal(alert('SteadfastXidFatal', { xid: 74 })))).toBe('machine');
    expect(classOf(classifySignal(alert('SteadfastXidGpuResetRequired', { xid: 48 })))).toBe('machine');
    expect(classOf(classifySignal(alert('SteadfastXidGpuResetRequired', { xid: 63 })))).toBe('transient');
  });

  it('turns a machine or network alert that names no node into a crash, since there is no culprit to evict', () => {
    expect(classOf(classifySignal({ ...alert('SteadfastGpuEccUncorrectable'), node: undefined }))).toBe('crash');
    expect(classOf(classifySignal({ ...alert('SteadfastRdmaPortDown'), node: undefined }))).toBe('crash');
  });

  it('ignores every resolved alert', () => {
    expect(classifySignal(alert('SteadfastGpuLost', { status: 'resolved' }))).toEqual({ verdict: 'ignore', reason: 'the alert resolved' });
  });

  it('has a decision, fault class or deliberate ignore, for every alert the rules define', () => {
    const rulesDir = join(import.meta.dirname, '..', '..', 'rules');
    const names = readdirSync(rulesDir)
      .filter((file) => file.endsWith('.yml') && file !== 'alertmanager.yml')
      .flatMap((file) => [...readFileSync(join(rulesDir, file), 'utf8').matchAll(/- alert: (\w+)/g)].map((match) => match[1] ?? ''));
    expect(names.length).toBeGreaterThan(25);
    for (const name of names) {
      const result = classifySignal(alert(name, { xid: 48 }));
      expect(result.verdict === 'fault' || !result.reason.startsWith('no recovery rule'), name).toBe(true);
    }
  });

  it('turns a classified signal into a ladder fault event at the signal time', () => {
    const lost = signal({ kind: 'gpu_lost', id: 's-42' });
    const verdict = classifySignal(lost);
    if (verdict.verdict !== 'fault') throw new Error('expected a fault');
    expect(faultEventFromSignal(lost, verdict)).toEqual({
      type: 'fault',
      time: T0,
      signalId: 's-42',
      faultClass: 'machine',
      nodes: ['node-7'],
      detail: verdict.reason,
    });
  });
});

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
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

  it('rolls back when the job crashes soon after an eviction whose restart had succeeded', () => {
    const recovered = run(jobOnV2(), [
      fault('machine', T0 + 5 * MINUTE, ['node-3']),
      { type: 'restart_failed', time: T0 + 6 * MINUTE },
      { type: 'restart_succeeded', time: T0 + 7 * MINUTE },
      { type: 'code_update', time: T0 + 8 * MINUTE, version: 'v4', urgent: true },
      { type: 'restart_succeeded', time: T0 + 9 * MINUTE },
      fault('machine', T0 + 10 * MINUTE, ['node-8']),
      { type: 'restart_succeeded', time: T0 + 11 * MINUTE },
    ]).state;
    const { state, steps } = run(recovered, [fault('crash', T0 + 20 * MINUTE)]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(state.phase).toBe('rolling_back');
    const later = run(recovered, [fault('crash', T0 + 11 * MINUTE + 31 * MINUTE)]);
    expect(shape(later.steps)).toEqual([{ verb: 'stop' }, { verb: 'run_diagnostics' }]);
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

// ---------------------------------------------------------------------------------------------
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

// ---------------------------------------------------------------------------------------------
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
    const { state, steps } = run(jobOnV2(), [{ type: 'code_update', time: T0 + 3 * MINUTE, version: 'v3', urgent: false }, fault('user_code', T0 + 4 * MINUTE)]);
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

// ---------------------------------------------------------------------------------------------
// Retry chains and exclusion history (504-GPU report)

describe('ladder: retry chain and exclusions', () => {
  it('holds the second restart of an incident back 30 s and releases it on a tick', () => {
    const reattempting = run(running(), [fault('machine', T0, ['node-3']), { type: 'restart_failed', time: T0 + MINUTE }], DEFAULT_LADDER_CONFIG);
    // No good version: the failed restart after the eviction goes to diagnostics, which find nothing.
    const held = run(reattempting.state, [{ type: 'diagnostics_result', time: T0 + 2 * MINUTE, suspects: [] }], DEFAULT_LADDER_CONFIG);
    expect(shape(held.steps)).toEqual([{ verb: 'tolerate' }]);
    expect(held.state.scheduled?.notBefore).toBe(T0 + 2 * MINUTE + 30 * SECOND);
    expect(held.state.incident?.retry).toEqual({ attempts: 2, nextBackoffMs: 60 * SECOND });
    expect(run(held.state, [{ type: 'tick', time: T0 + 2 * MINUTE + 29 * SECOND }], DEFAULT_LADDER_CONFIG).steps).toEqual([]);
    const released = run(held.state, [{ type: 'tick', time: T0 + 2 * MINUTE + 30 * SECOND }], DEFAULT_LADDER_CONFIG);
    expect(shape(released.steps)).toEqual([{ verb: 'reattempt' }]);
    expect(released.state.scheduled).toBeNull();
  });

  it('doubles the backoff for each further restart up to the cap', () => {
    const config: LadderConfig = { ...DEFAULT_LADDER_CONFIG, retryLimit: 20, retryMaxBackoffMs: 2 * MINUTE };
    let state = run(running(), [fault('machine', T0, ['node-0'])], config).state;
    const waits: number[] = [];
    for (let i = 1; i <= 4; i += 1) {
      const at = T0 + i * HOUR;
      const next = run(state, [fault('machine', at, [`node-${i}`])], config);
      waits.push((next.state.scheduled?.notBefore ?? at) - at);
      state = run(next.state, [{ type: 'tick', time: at + 10 * MINUTE }], config).state;
    }
    expect(waits).toEqual([30 * SECOND, 60 * SECOND, 2 * MINUTE, 2 * MINUTE]);
  });

  it('only records a restart failure while the next restart is still held back', () => {
    const held = run(running(), [fault('machine', T0, ['node-3']), fault('machine', T0 + SECOND, ['node-4'])], DEFAULT_LADDER_CONFIG).state;
    expect(held.scheduled).not.toBeNull();
    const { state, steps } = run(held, [{ type: 'restart_failed', time: T0 + 2 * SECOND }], DEFAULT_LADDER_CONFIG);
    expect(shape(steps)).toEqual([{ verb: 'tolerate' }]);
    expect(state.phase).toBe('stopped');
  });

  it('keeps a held rollback when an eviction replaces the held restart', () => {
    const config: LadderConfig = { ...DEFAULT_LADDER_CONFIG };
    const rolling = run(jobOnV2(), [fault('machine', T0 + 5 * MINUTE, ['node-3']), { type: 'restart_failed', time: T0 + 6 * MINUTE }], config).state;
    expect(rolling.scheduled?.steps.map((step) => step.verb)).toEqual(['rollback', 'restart']);
    const evicted = run(rolling, [fault('machine', T0 + 6 * MINUTE + SECOND, ['node-4'])], config);
    expect(shape(evicted.steps)).toEqual([{ verb: 'evict', nodes: ['node-4'] }, { verb: 'tolerate' }]);
    const released = run(evicted.state, [{ type: 'tick', time: T0 + HOUR }], config);
    expect(shape(released.steps)).toEqual([{ verb: 'rollback', version: 'v1' }, { verb: 'restart' }]);
    expect(released.state.runningVersion).toBe('v1');
  });

  it('pages a human instead of restarting once the incident has used its retry chain', () => {
    const config: LadderConfig = { ...NO_BACKOFF, retryLimit: 2 };
    const { state, steps } = run(running(), [fault('machine', T0, ['node-1']), fault('machine', T0 + SECOND, ['node-2']), fault('machine', T0 + 2 * SECOND, ['node-3'])], config);
    expect(shape(steps)).toEqual([{ verb: 'evict', nodes: ['node-3'] }, { verb: 'page_human' }]);
    expect(state.phase).toBe('waiting_for_human');
    expect(state.scheduled).toBeNull();
  });

  it('starts a fresh retry chain with each incident', () => {
    const config: LadderConfig = { ...NO_BACKOFF, retryLimit: 1 };
    const { steps } = run(running(), [fault('machine', T0, ['node-1']), { type: 'restart_succeeded', time: T0 + MINUTE }, fault('machine', T0 + HOUR, ['node-2'])], config);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-2'] }, { verb: 'restart' }]);
  });

  it('quarantines a node on its third eviction within 7 days and never evicts it again', () => {
    const events: LadderEvent[] = [];
    for (let i = 0; i < 3; i += 1) events.push(fault('machine', T0 + i * DAY, ['node-bad']), { type: 'restart_succeeded', time: T0 + i * DAY + MINUTE });
    const third = run(running(), events.slice(0, 4));
    expect(third.state.quarantined).toEqual([]);
    const { state, steps } = run(third.state, [events[4] as LadderEvent]);
    expect(shape(steps)).toEqual([{ verb: 'stop' }, { verb: 'evict', nodes: ['node-bad'] }, { verb: 'quarantine', nodes: ['node-bad'] }, { verb: 'restart' }]);
    expect(state.quarantined).toEqual(['node-bad']);
    const later = run(run(state, [{ type: 'restart_succeeded', time: T0 + 3 * DAY }]).state, [fault('machine', T0 + 4 * DAY, ['node-bad'])]);
    expect(shape(later.steps)).toEqual([{ verb: 'tolerate', nodes: ['node-bad'] }]);
    expect(later.state.phase).toBe('running');
  });

  it('forgets evictions older than 7 days when counting towards quarantine', () => {
    const events: LadderEvent[] = [];
    for (let i = 0; i < 3; i += 1) events.push(fault('machine', T0 + i * 4 * DAY, ['node-old']), { type: 'restart_succeeded', time: T0 + i * 4 * DAY + MINUTE });
    const { state } = run(running(), events);
    expect(state.quarantined).toEqual([]);
    expect(state.exclusions).toEqual([{ node: 'node-old', times: [T0 + 4 * DAY, T0 + 8 * DAY] }]);
  });
});

// ---------------------------------------------------------------------------------------------
// Properties

const NODES = ['node-1', 'node-2', 'node-3', 'node-4'];
const nodeList = fc.subarray(NODES);
const eventBody = fc.oneof(
  fc.record({
    type: fc.constant('fault' as const),
    signalId: fc.constantFrom('a', 'b', 'c', 'd', 'e', 'f', 'g', 'h').chain((prefix) => fc.nat(40).map((n) => `${prefix}${n}`)),
    faultClass: fc.constantFrom(...FAULT_CLASSES),
    nodes: nodeList,
    detail: fc.string({ maxLength: 20 }),
  }),
  fc.record({ type: fc.constant('restart_succeeded' as const) }),
  fc.record({ type: fc.constant('restart_failed' as const) }),
  fc.record({ type: fc.constant('diagnostics_result' as const), suspects: nodeList }),
  fc.record({ type: fc.constant('replay_result' as const), culprits: nodeList }),
  fc.record({ type: fc.constant('code_update' as const), version: fc.constantFrom('v1', 'v2', 'v3', 'v4'), urgent: fc.boolean() }),
  fc.record({ type: fc.constant('tick' as const) }),
);
// Mostly forward in time, sometimes far (windows expire), sometimes backwards (late delivery).
const delay = fc.oneof(fc.integer({ min: 0, max: 10 * MINUTE }), fc.integer({ min: 0, max: 3 * DAY }), fc.integer({ min: -5 * MINUTE, max: 0 }));
const timedEvents = fc.array(fc.tuple(delay, eventBody), { maxLength: 60 });
const configs = fc.constantFrom<LadderConfig>(DEFAULT_LADDER_CONFIG, NO_BACKOFF, { ...NO_BACKOFF, retryLimit: 2, quarantineAfterEvictions: 2 });

describe('ladder: properties', () => {
  it('never throws, never evicts an empty or quarantined node list, keeps its invariants, and stays JSON-serialisable', () => {
    fc.assert(
      fc.property(timedEvents, configs, fc.boolean(), (events, config, withVersion) => {
        let state = initialLadderState(JOB, withVersion ? { time: T0, version: 'v1' } : { time: T0 });
        let now = T0;
        for (const [wait, body] of events) {
          now += wait;
          const event = { ...body, time: now } as LadderEvent;
          const before = structuredClone(state);
          const { state: next, steps } = advance(state, event, config);
          expect(state).toEqual(before);
          for (const step of steps) {
            expect(step.job).toBe(JOB);
            expect(step.reason.length).toBeGreaterThan(0);
            expect(step.citation.length).toBeGreaterThan(0);
            if (step.verb === 'evict') {
              expect(step.nodes?.length ?? 0).toBeGreaterThan(0);
              for (const node of step.nodes ?? []) expect(before.quarantined).not.toContain(node);
            }
          }
          expect(next.phase === 'running').toBe(next.incident === null);
          expect(JSON.parse(JSON.stringify(next))).toStrictEqual(next);
          expect(ladderStateSchema.parse(next)).toEqual(next);
          state = next;
        }
      }),
      { numRuns: 400 },
    );
  });
});
