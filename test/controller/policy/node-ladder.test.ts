import { describe, expect, it } from 'vitest';
import type { RemediationEntry } from '../../../core/remedy.js';
import { remediesSchema } from '../../../core/remedy-config.js';
import type { Signal } from '../../../core/signal.js';
import { classifySignal, type FaultVerdict } from '../../../controller/policy/fault-class.js';
import { climbNodeLadder, climbNodeLadderReading, nodeLadderNeedsHistory, nodeRung } from '../../../controller/policy/node-ladder.js';
import { signal } from '../../support/signal.js';

/** The rung for a machine fault, its drain reason replaced by `reason` to keep the expectations short. */
function chooseRemedy(fault: Signal, reason: string, history: RemediationEntry[], config: typeof ON, now: number) {
  const verdict = classifySignal(fault) as FaultVerdict;
  const rung = nodeRung(fault, verdict, history, config, now);
  const drainReason = nodeRung(fault, verdict, [], remediesSchema.parse({}), now).reason;
  return { ...rung, reason: rung.reason.replace(drainReason, reason) };
}

const NOW = Date.parse('2026-11-20T12:00:00Z');
const ON = remediesSchema.parse({
  gpuReset: { enabled: true },
  reboot: { enabled: true },
  escalation: { resetsBeforeReboot: 2, rebootsBeforeHandOff: 1, windowSeconds: 3600 },
});

function xid(code: number, gpu = '0000:3a:00') {
  return signal({ kind: 'xid', node: 'node-1', gpu, severity: 'critical', evidence: { xid: code, message: '' } });
}

function past(action: RemediationEntry['action'], minutesAgo: number, gpu?: string, outcome: RemediationEntry['outcome'] = 'done'): RemediationEntry {
  return { time: new Date(NOW - minutesAgo * 60_000).toISOString(), action, outcome, detail: '', decisionId: `d-${minutesAgo}`, ...(gpu ? { gpu } : {}) };
}

describe('the node ladder: the rung for a machine fault on a node outside any job', () => {
  it('drains, as before, while every rung is off', () => {
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [], remediesSchema.parse({}), NOW)).toEqual({ verb: 'drain', reason: 'fatal Xid 48' });
  });

  it('resets the GPU the catalogue says a reset fixes, and reboots for a GPU off the bus', () => {
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [], ON, NOW)).toMatchObject({ verb: 'reset_gpu', gpu: '0000:3a:00' });
    expect(chooseRemedy(xid(79), 'fatal Xid 79', [], ON, NOW).verb).toBe('reboot');
    expect(chooseRemedy(signal({ kind: 'gpu_lost', node: 'node-1', gpu: '0000:3a:00' }), 'GPU lost', [], ON, NOW).verb).toBe('reboot');
  });

  it('drains instead of resetting when another GPU of the node needed a reset within the window', () => {
    const choice = chooseRemedy(xid(48), 'fatal Xid 48', [past('reset_gpu', 10, '0000:18:00')], ON, NOW);
    expect(choice).toEqual({ verb: 'drain', reason: "fatal Xid 48; GPU 0000:18:00 of this node needed a reset too within 3600 s: not one GPU's fault" });
  });

  it('escalates resets to a reboot and reboots to a hand-off, counting only the window and not refusals', () => {
    const resets = [past('reset_gpu', 10, '0000:3a:00'), past('reset_gpu', 20, '0000:3a:00')];
    expect(chooseRemedy(xid(48), 'fatal Xid 48', resets, ON, NOW).verb).toBe('reboot');
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [past('reset_gpu', 10, '0000:3a:00'), past('reset_gpu', 120, '0000:3a:00')], ON, NOW).verb).toBe('reset_gpu');
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [past('reset_gpu', 10, '0000:3a:00'), past('reset_gpu', 20, '0000:3a:00', 'refused')], ON, NOW).verb).toBe(
      'reset_gpu',
    );
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [...resets, past('reboot', 30)], ON, NOW).verb).toBe('hand_off');
    expect(chooseRemedy(xid(79), 'fatal Xid 79', [past('reboot', 30)], ON, NOW)).toEqual({
      verb: 'hand_off',
      reason: 'fatal Xid 79; 1 reboots within 3600 s did not hold: needs hands',
    });
  });

  it('hands repeated resets off when reboots are off', () => {
    const noReboot = remediesSchema.parse({ gpuReset: { enabled: true }, escalation: { resetsBeforeReboot: 1 } });
    expect(chooseRemedy(xid(48), 'fatal Xid 48', [past('reset_gpu', 10, '0000:3a:00')], noReboot, NOW).verb).toBe('hand_off');
    expect(chooseRemedy(xid(79), 'fatal Xid 79', [], noReboot, NOW).verb).toBe('drain');
  });

  it('takes a machine fault out of service, with the reason the drained node carries, and observes every other fault', () => {
    const off = remediesSchema.parse({});
    const lost = signal({ kind: 'xid', node: 'node-1', gpu: '0000:3a:00', severity: 'critical', evidence: { xid: 79, meaning: 'GPU has fallen off the bus' } });
    expect(climbNodeLadder(lost, classifySignal(lost), [], off, NOW)).toEqual({
      node: 'node-1',
      rung: { verb: 'drain', reason: 'fatal Xid 79 (GPU has fallen off the bus) on GPU 0000:3a:00' },
    });
    const nvswitch = signal({ kind: 'alert', node: 'node-1', evidence: { alertname: 'SteadfastNvswitchFatal' } });
    expect(climbNodeLadder(nvswitch, classifySignal(nvswitch), [], off, NOW)).toEqual({
      node: 'node-1',
      rung: { verb: 'drain', reason: 'fatal NVSwitch error (SXid): SteadfastNvswitchFatal' },
    });
    const warning = signal({ kind: 'xid', node: 'node-1', gpu: '0000:3a:00', severity: 'warning', evidence: { xid: 13 } });
    expect(climbNodeLadder(warning, classifySignal(warning), [], off, NOW)).toEqual({
      observe: expect.stringContaining('no automatic action for xid signals of severity warning'),
    });
    const resolved = signal({ kind: 'alert', node: 'node-1', evidence: { alertname: 'SteadfastNvswitchFatal', status: 'resolved' } });
    expect(climbNodeLadder(resolved, classifySignal(resolved), [], off, NOW)).toEqual({
      observe: 'alert resolved; a drained node stays drained until an operator resumes it',
    });
  });

  it('reads the history only when the choice depends on it, and chooses the same either way', async () => {
    const configs = [
      remediesSchema.parse({}),
      ON,
      remediesSchema.parse({ gpuReset: { enabled: true }, escalation: { resetsBeforeReboot: 1 } }),
      remediesSchema.parse({ reboot: { enabled: true }, escalation: { rebootsBeforeHandOff: 1 } }),
    ];
    const signals = [
      xid(48),
      xid(79),
      xid(13),
      xid(48, 'not-a-bus-id'),
      signal({ kind: 'gpu_lost', node: 'node-1', gpu: '0000:3a:00' }),
      signal({ kind: 'alert', node: 'node-1', evidence: { alertname: 'NodeDown' } }),
    ];
    const histories = [
      [],
      [past('reset_gpu', 10, '0000:3a:00'), past('reset_gpu', 20, '0000:3a:00')],
      [past('reboot', 30)],
      [past('reset_gpu', 10, '0000:18:00')],
    ];
    let reads = 0;
    for (const config of configs) {
      for (const fault of signals) {
        const verdict = classifySignal(fault);
        const needs = nodeLadderNeedsHistory(fault, verdict, config);
        for (const history of histories) {
          const direct = climbNodeLadder(fault, verdict, history, config, NOW);
          if (!needs) expect(direct).toEqual(climbNodeLadder(fault, verdict, [], config, NOW));
          const before = reads;
          const lazy = await climbNodeLadderReading(
            fault,
            verdict,
            async () => ((reads += 1), history),
            config,
            () => NOW,
          );
          expect(lazy).toEqual(direct);
          expect(reads - before).toBe(needs ? 1 : 0);
        }
      }
    }
    // Every rung off (the default): no fault reads the history.
    expect(signals.some((fault) => nodeLadderNeedsHistory(fault, classifySignal(fault), configs[0] as typeof ON))).toBe(false);
    expect(reads).toBeGreaterThan(0);
  });
});
