import { spawn } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import type { RemediationEntry } from '../../core/remedy.js';
import { SimEnvironment } from '../../tryit/environment.js';
import { until } from '../support/until.js';

/**
 * The reset rung and its escalation on the simulated cluster: real agents (their gpu-reset
 * endpoint, behind node-bound tokens, running the simulated nodes' nvidia-smi), Prometheus,
 * Alertmanager, Redis, the controller and slurmctld.
 */
const REJOIN_SECONDS = 6;

describe('remedies short of a drain, end to end', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({
      nodes: 2,
      remedies: {
        gpuReset: { enabled: true, busyRetries: 1, busyRetryDelaySeconds: 0.2, rejoinSeconds: REJOIN_SECONDS },
        reboot: { enabled: true },
        escalation: { resetsBeforeReboot: 2 },
      },
    });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  /** The first action on `node` of `verb` that settled after `since` (ms). */
  async function settled(node: string, verb: string, since: number): Promise<AuditEntry> {
    const entries = await until(
      `a settled ${verb} on ${node}`,
      () => env.audit(node),
      (all) => all.some((entry) => isSettled(entry, verb, since)),
      40_000,
    );
    return entries.find((entry) => isSettled(entry, verb, since)) as AuditEntry;
  }

  function isSettled(entry: AuditEntry, verb: string, since: number): boolean {
    return (
      entry.type === 'action' &&
      entry.data.verb === verb &&
      ['done', 'refused', 'failed'].includes(String(entry.data.state)) &&
      Date.parse(String(entry.data.time)) >= since
    );
  }

  async function history(node: string): Promise<RemediationEntry[]> {
    const response = await fetch(`${env.controllerUrl}/api/v1/nodes/${node}/remediations`, {
      headers: { authorization: `Bearer ${env.credentials.operator}` },
    });
    expect(response.status).toBe(200);
    return ((await response.json()) as { remediations: RemediationEntry[] }).remediations;
  }

  it('resets only the faulted GPU through its agent and returns the node to service', async () => {
    const since = Date.now();
    env.node('node-1').needsReset(2, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    const action = await settled('node-1', 'reset_gpu', since);
    expect(action.data.state).toBe('done');
    expect(String(action.data.detail)).toMatch(/^GPU 0000:3a:00 \(index 2\) reset and listed again in [\d.]+ s; node returned to service$/);
    expect(env.node('node-1').resets()).toEqual([2]);
    expect(env.node('node-1').gpuNeedsReset(2)).toBe(false);
    expect((await env.controller.backend.nodeState('node-1')).drained).toBe(false);
    expect((await history('node-1')).map((entry) => `${entry.action} ${entry.outcome} ${entry.gpu ?? ''}`)).toEqual(['reset_gpu done 0000:3a:00']);
    // The fast path and the later alert are one fault: one decision.
    const decisions = (await env.audit('node-1')).filter((entry) => entry.type === 'decision');
    expect(decisions).toHaveLength(1);
  }, 60_000);

  it('drains the node instead when processes still hold the GPU, without resetting it', async () => {
    const since = Date.now();
    const node = env.node('node-2');
    // A live process on GPU 3, as nvidia-smi would list it.
    const holder = spawn('sleep', ['600'], { stdio: 'ignore' });
    const pid = holder.pid ?? 0;
    node.holdGpu(3, [pid]);
    node.needsReset(3, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    const action = await settled('node-2', 'reset_gpu', since);
    expect(action.data.state).toBe('done');
    holder.kill('SIGKILL');
    expect(String(action.data.detail)).toBe(`GPU reset refused (processes ${pid} still use GPU 3); node drained instead`);
    expect(node.resets()).toEqual([]);
    expect((await env.controller.backend.nodeState('node-2')).drained).toBe(true);
    expect((await history('node-2')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual(['drain done', 'reset_gpu fell_back']);
  }, 60_000);

  it('escalates repeated resets on one node to a reboot', async () => {
    // A fault after the rejoin window is a new decision, which counts towards escalation.
    await sleep((REJOIN_SECONDS + 1) * 1000);
    const node = env.node('node-1');
    let since = Date.now();
    node.needsReset(2, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    expect((await settled('node-1', 'reset_gpu', since)).data.state).toBe('done');
    expect(node.resets()).toEqual([2, 2]);

    await sleep((REJOIN_SECONDS + 1) * 1000);
    since = Date.now();
    node.needsReset(2, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    const reboot = await settled('node-1', 'reboot', since);
    expect(reboot.data.state).toBe('done');
    // The simulated Slurm nodes are powered-down CLOUD nodes: slurmctld takes no reboot for them,
    // and the actuator sees it and drains the node instead.
    expect(String(reboot.data.detail)).toMatch(/after the reboot request; node drained instead$/);
    expect(node.resets()).toEqual([2, 2]);
    const decision = (await env.audit('node-1')).filter((entry) => entry.type === 'decision').at(-1);
    expect(decision?.summary).toMatch(/^reboot node-1: .*; 2 GPU resets within 604800 s: reboot$/);
    expect((await history('node-1')).map((entry) => `${entry.action} ${entry.outcome}`)).toEqual([
      'drain done',
      'reboot fell_back',
      'reset_gpu done',
      'reset_gpu done',
    ]);
  }, 90_000);
});
