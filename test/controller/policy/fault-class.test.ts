import { describe, expect, it } from 'vitest';
import type { Signal } from '../../../core/signal.js';
import { signal } from '../../support/signal.js';
import { classifySignal, type Classification } from '../../../controller/policy/fault-class.js';
import { faultEventFromSignal } from '../../../controller/policy/ladder/index.js';
import { ALERT_CATALOGUE } from '../../../rules/catalogue.js';
import { T0 } from './ladder/support.js';

function alert(alertname: string, extra: Signal['evidence'] = {}): Signal {
  return signal({ kind: 'alert', source: 'alertmanager', evidence: { alertname, status: 'firing', ...extra } });
}

function classOf(result: Classification): string {
  return result.verdict === 'fault' ? result.faultClass : 'ignore';
}

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
    expect(classOf(classifySignal(signal({ kind: 'worker_failed', evidence: { message: 'RuntimeError: CUDA error: an illegal memory access' } })))).toBe(
      'crash',
    );
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

  it("classifies every alert of the catalogue as its rule means it: its fault class and citation, by its Xid, or ignored as steadfast's own", () => {
    expect(ALERT_CATALOGUE.size).toBeGreaterThan(25);
    for (const { alert: name, meaning } of ALERT_CATALOGUE.values()) {
      const result = classifySignal(alert(name, { xid: 48 }));
      const ignored = { verdict: 'ignore', reason: `${name} concerns steadfast itself, not a training job` };
      if (meaning.role === 'self-monitoring') expect(result, name).toEqual(ignored);
      else if (meaning.role === 'fault') expect(result, name).toMatchObject({ verdict: 'fault', faultClass: meaning.faultClass, citation: meaning.citation });
      // Xid 48 is fatal by its code: a machine fault whichever way the rule reads it.
      else expect(result, name).toMatchObject({ verdict: 'fault', faultClass: 'machine', xid: { code: 48 } });
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
      signature: 'gpu-lost',
    });
  });

  it('carries the catalogue remedy of a machine fault and the Xid an alert counts, for the ladders to act on', () => {
    const dbe = classifySignal(signal({ kind: 'xid', node: 'n1', gpu: '0000:3a:00', severity: 'critical', evidence: { xid: 48, message: '' } }));
    expect(dbe).toMatchObject({ faultClass: 'machine', remedy: 'reset_gpu', xid: { code: 48, meaning: 'uncorrectable double-bit ECC error' } });
    expect(classifySignal(signal({ kind: 'gpu_lost', node: 'n1', gpu: '0000:3a:00' }))).toMatchObject({ faultClass: 'machine', remedy: 'reboot_node' });
    // No culprit, no cure: a crash carries no remedy.
    expect(classifySignal(signal({ kind: 'gpu_lost', node: undefined, gpu: '0000:3a:00' }))).toMatchObject({ faultClass: 'crash' });
    expect(classifySignal(signal({ kind: 'gpu_lost', node: undefined, gpu: '0000:3a:00' }))).not.toHaveProperty('remedy');
    const reboot = classifySignal(alert('SteadfastXidNodeRebootRequired', { 'label.xid': '79', 'label.xid_severity': 'fatal' }));
    expect(reboot).toMatchObject({ faultClass: 'machine', xid: { code: 79 } });
  });
});
