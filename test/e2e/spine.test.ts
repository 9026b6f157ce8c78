import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SimEnvironment } from '../../tryit/environment.js';
import { runFallenOffBus } from '../../tryit/scenario.js';

/**
 * The whole spine on the real parts: agents, Prometheus, Alertmanager, Redis, the controller and
 * slurmctld. One fatal Xid must end in exactly one Slurm drain whose reason names the Xid.
 */
describe('one fatal Xid travels end to end', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 4 });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('drains the node once in Slurm, with the Xid, GPU and audit id in the reason, and matches the later alert to the same fault', async () => {
    const result = await runFallenOffBus(env, { node: 'node-2', gpuIndex: 5, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
    expect(result.slurmState).toMatch(/^drain/);
    expect(result.slurmReason).toMatch(/^steadfast: fatal Xid 79 \(GPU has fallen off the bus\) on GPU 0000:ab:00 audit=d-[0-9a-f]{24}$/);
    expect(result.slurmDrains).toBe(1);
    const audit = await env.audit('node-2');
    // The fatal-Xid alert; the node-reboot alert for the same Xid arrives alongside it and is only recorded.
    const alert = audit.find((entry) => {
      const signal = entry.data.signal as { source: string; kind: string };
      return entry.type === 'signal' && signal.source === 'alertmanager' && signal.kind === 'xid';
    });
    expect(alert?.data.sameFault).toBe(true);
    expect(audit.filter((entry) => entry.type === 'decision')).toHaveLength(1);
  }, 60_000);

  it('leaves the other nodes in service', async () => {
    for (const node of ['node-1', 'node-3', 'node-4']) {
      const state = await env.controller.backend.nodeState(node);
      expect(state.drained, node).toBe(false);
    }
  });
});

describe('without the agent fast path', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 2, fastPath: false });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('still drains the node once, from the Prometheus alert alone', async () => {
    const result = await runFallenOffBus(env, { node: 'node-1', gpuIndex: 0, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
    const audit = await env.audit('node-1');
    const signals = audit.filter((entry) => entry.type === 'signal');
    expect(signals.every((entry) => (entry.data.signal as { source: string }).source === 'alertmanager')).toBe(true);
    expect(result.slurmDrains).toBe(1);
  }, 60_000);
});

describe('agents reading their GPUs through NVML', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 2, gpuSource: 'nvml' });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('drains the node once for an Xid that only NVML reports (an agent without kernel-log rights), and the alert matches it', async () => {
    const result = await runFallenOffBus(env, { node: 'node-1', gpuIndex: 0, timeoutMs: 40_000, via: 'nvml' });
    expect(result.problems).toEqual([]);
    // Nothing was written to the kernel log: the drain came from the NVML event.
    expect(result.slurmReason).toMatch(/^steadfast: fatal Xid 79 \(GPU has fallen off the bus\) on GPU 0000:18:00 audit=d-[0-9a-f]{24}$/);
    const sources = await (await fetch(`${env.prometheus.url}/api/v1/query?query=${encodeURIComponent('steadfast_gpu_source_info')}`)).json();
    expect(JSON.stringify(sources)).toContain('"source":"nvml"');
  }, 60_000);

  it('drains once for an Xid both the kernel log and NVML report, counting it once', async () => {
    const result = await runFallenOffBus(env, { node: 'node-2', gpuIndex: 3, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
    const query = encodeURIComponent('sum(steadfast_xid_errors_total{node="node-2",xid="79"})');
    const body = (await (await fetch(`${env.prometheus.url}/api/v1/query?query=${query}`)).json()) as { data: { result: { value: [number, string] }[] } };
    expect(body.data.result[0]?.value[1]).toBe('1');
  }, 60_000);
});
