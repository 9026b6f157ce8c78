import { afterEach, describe, expect, it } from 'vitest';
import { remediesSchema } from '../../../core/remedy-config.js';
import type { Signal } from '../../../core/signal.js';
import { configurationLayers, xidPolicyLayerSchema, type PolicyLayer } from '../../../core/xid-policy.js';
import { classifySignal } from '../../../controller/policy/fault-class.js';
import { climbNodeLadder } from '../../../controller/policy/node-ladder.js';
import { applyXidPolicy, xidReportOf } from '../../../controller/policy/xid-rule.js';
import { XidOccurrences } from '../../../controller/policy/xid-occurrences.js';
import { signal } from '../../support/signal.js';
import { testRedis } from '../../support/redis.js';

const NOW = Date.parse('2026-11-20T12:00:00Z');
const OFF = remediesSchema.parse({});
const ON = remediesSchema.parse({ gpuReset: { enabled: true }, reboot: { enabled: true } });

const layers = (policy: unknown): PolicyLayer[] => configurationLayers(xidPolicyLayerSchema.parse(policy));

function xid(code: number, overrides: Partial<Signal> = {}): Signal {
  return signal({
    kind: 'xid',
    node: 'node-1',
    gpu: '0000:3a:00',
    severity: 'warning',
    time: new Date(NOW - 1000).toISOString(),
    evidence: { xid: code, message: '' },
    ...overrides,
  });
}

describe('the configured Xid policy over a signal', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    for (const store of stores.splice(0)) await store.cleanup();
  });
  function occurrences(now = NOW): XidOccurrences {
    const store = testRedis();
    stores.push(store);
    return new XidOccurrences(store.redis, store.keys, () => now);
  }

  it('reads the code of an Xid signal, an SXid signal, and an alert labelled with either', () => {
    expect(xidReportOf(xid(13))).toEqual({ kind: 'xid', code: 13 });
    expect(xidReportOf(signal({ kind: 'sxid', evidence: { sxid: 20034 } }))).toEqual({ kind: 'sxid', code: 20034 });
    expect(xidReportOf(signal({ kind: 'alert', evidence: { alertname: 'SteadfastNvswitchFatal', 'label.sxid': '20034' } }))).toEqual({
      kind: 'sxid',
      code: 20034,
    });
    expect(xidReportOf(signal({ kind: 'alert', evidence: { alertname: 'SteadfastXidGpuResetRequired', 'label.xid': '63', xid: 63 } }))).toEqual({
      kind: 'xid',
      code: 63,
    });
    expect(xidReportOf(signal({ kind: 'nccl_timeout', evidence: { xid: 13 } }))).toBeUndefined();
  });

  it('leaves every classification as it was where no layer names the code', async () => {
    const fault = xid(48, { severity: 'critical' });
    const verdict = classifySignal(fault);
    expect(await applyXidPolicy(fault, verdict, { layers: layers({ xid: { '13': { action: 'drain' } } }), occurrences: occurrences() })).toBe(verdict);
    expect(await applyXidPolicy(fault, verdict, { layers: [], occurrences: occurrences() })).toBe(verdict);
  });

  it('ignores and observes as configured, saying which layer said so', async () => {
    const deps = { layers: layers({ xid: { '48': { action: 'ignore' }, '79': { action: 'observe' } } }), occurrences: occurrences() };
    const fatal48 = xid(48, { severity: 'critical' });
    expect(await applyXidPolicy(fatal48, classifySignal(fatal48), deps)).toEqual({ verdict: 'ignore', reason: 'Xid 48 is ignored by the configuration' });
    const fatal79 = xid(79, { severity: 'critical' });
    expect(await applyXidPolicy(fatal79, classifySignal(fatal79), deps)).toEqual({ verdict: 'ignore', reason: 'Xid 79 is observed only (configuration)' });
  });

  it('hands a node off at once, drains instead of a reset while resets are off and says so, and resets where they are on', async () => {
    const deps = {
      layers: layers({ xid: { '13': { action: 'hand_off' }, '31': { action: 'reset' }, '43': { action: 'reboot' } } }),
      occurrences: occurrences(),
    };
    const rung = async (fault: Signal, config = OFF) => {
      const choice = climbNodeLadder(fault, await applyXidPolicy(fault, classifySignal(fault), deps), [], config, NOW);
      if (!('rung' in choice)) throw new Error(`observed: ${choice.observe}`);
      return choice.rung;
    };
    expect(await rung(xid(13))).toEqual({
      verb: 'hand_off',
      reason: 'Xid 13 (graphics engine exception, usually the application) on GPU 0000:3a:00: configuration says hand_off: needs hands',
    });
    expect(await rung(xid(31))).toEqual({
      verb: 'drain',
      reason:
        'Xid 31 (GPU memory page fault, usually the application) on GPU 0000:3a:00: configuration says reset; GPU resets are off (remedies.gpuReset.enabled): drain',
    });
    expect(await rung(xid(31), ON)).toMatchObject({ verb: 'reset_gpu', gpu: '0000:3a:00' });
    expect((await rung(xid(43))).reason).toContain('node reboots are off (remedies.reboot.enabled): drain');
    expect((await rung(xid(43), ON)).verb).toBe('reboot');
  });

  it('counts each occurrence once: a redelivered signal does not count again', async () => {
    const counter = occurrences();
    const first = xid(13, { id: 's-1' });
    expect(await counter.count(first, 'node-1', 'xid', 13, 600)).toEqual({ seen: 1, counted: 'new' });
    expect(await counter.count(first, 'node-1', 'xid', 13, 600)).toEqual({ seen: 1, counted: 'again' });
    expect(await counter.count(xid(13, { id: 's-2' }), 'node-1', 'xid', 13, 600)).toEqual({ seen: 2, counted: 'new' });
    // Another node, another code: counted apart.
    expect((await counter.count(xid(13, { id: 's-3' }), 'node-2', 'xid', 13, 600)).seen).toBe(1);
    expect((await counter.count(xid(31, { id: 's-4' }), 'node-1', 'xid', 31, 600)).seen).toBe(1);
  });

  it("counts Alertmanager's report only while no agent report of the node and code was counted within the window", async () => {
    const counter = occurrences();
    const alert = (id: string): Signal => xid(13, { id, source: 'alertmanager' });
    // An older agent that does not send the code: Prometheus' view is all there is.
    expect(await counter.count(alert('a-1'), 'node-1', 'xid', 13, 600)).toEqual({ seen: 1, counted: 'new' });
    expect(await counter.count(xid(13, { id: 'g-1' }), 'node-1', 'xid', 13, 600)).toEqual({ seen: 2, counted: 'new' });
    expect(await counter.count(alert('a-2'), 'node-1', 'xid', 13, 600)).toEqual({ seen: 2, counted: 'agent-counted' });
  });

  it('forgets occurrences older than the window', async () => {
    const store = testRedis();
    stores.push(store);
    let now = NOW;
    const counter = new XidOccurrences(store.redis, store.keys, () => now);
    await counter.count(xid(13, { id: 's-1' }), 'node-1', 'xid', 13, 600);
    now += 601_000;
    expect(await counter.count(xid(13, { id: 's-2', time: new Date(now - 1000).toISOString() }), 'node-1', 'xid', 13, 600)).toEqual({
      seen: 1,
      counted: 'new',
    });
    expect(await store.redis.pttl(store.keys.xidOccurrences('node-1', 'xid', 13))).toBeLessThanOrEqual(600_000);
  });

  it('observes below the count and acts at it', async () => {
    const deps = { layers: layers({ sxid: { '20034': { action: 'drain', count: 2, windowSeconds: 60 } } }), occurrences: occurrences() };
    const sxid = (id: string): Signal =>
      signal({
        kind: 'sxid',
        id,
        node: 'node-1',
        severity: 'warning',
        time: new Date(NOW - 1000).toISOString(),
        evidence: { sxid: 20034, nvswitch: '0000:05:00.0' },
      });
    expect(await applyXidPolicy(sxid('s-1'), classifySignal(sxid('s-1')), deps)).toEqual({
      verdict: 'ignore',
      reason: 'SXid 20034 on node-1: 1 of 2 within 60 s (configuration): no action yet',
    });
    const acted = await applyXidPolicy(sxid('s-2'), classifySignal(sxid('s-2')), deps);
    const choice = climbNodeLadder(sxid('s-2'), acted, [], OFF, NOW);
    expect(choice).toEqual({
      node: 'node-1',
      rung: { verb: 'drain', reason: 'SXid 20034 (NVSwitch error) on NVSwitch 0000:05:00.0: configuration says drain' },
    });
  });
});
