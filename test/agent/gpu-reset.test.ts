import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { GPU_RESET_PATH } from '../../core/remedy.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { GPU_RESET_STOP_GRACE_FLAG, gpuResetCollectorFactory, shortPciBusId } from '../../agent/collectors/gpu-reset.js';
import { createSimulatedNodes, type SimulatedNode } from '../../tryit/cluster.js';

const TOKEN = 'node-1.0123456789abcdef0123456789abcdef';

/** A simulated 4-GPU node (tryit/fake-nvidia-smi.sh) and an agent serving the gpu-reset endpoint on it. */
async function resetAgent(root: string, settings: Record<string, string> = {}): Promise<{ node: SimulatedNode; agent: Agent; url: string }> {
  const [node] = createSimulatedNodes(root, 1, 4) as [SimulatedNode];
  const agent = createAgent({
    node: 'node-1',
    listen: { host: '127.0.0.1', port: 0 },
    paths: { sysfs: join(root, 'sys'), procfs: node.procfs, kmsg: node.kmsgPath, nvidiaSmiXml: node.xmlPath, nvidiaSmi: node.nvidiaSmi },
    pollIntervalSeconds: 1,
    collectors: [gpuResetCollectorFactory],
    settings,
    apiToken: TOKEN,
    logger: silentLogger(),
  });
  return { node, agent, url: `http://127.0.0.1:${(await agent.start()).port}${GPU_RESET_PATH}` };
}

/**
 * The agent's gpu-reset endpoint running a simulated node's nvidia-smi (tryit/fake-nvidia-smi.sh):
 * what it resets, what it refuses, and who may ask.
 */
describe('POST /api/v1/gpu-reset on the agent', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-gpu-reset-'));
  const token = TOKEN;
  let node: SimulatedNode;
  let agent: Agent;
  let url: string;

  beforeAll(async () => {
    ({ node, agent, url } = await resetAgent(root));
  });
  afterAll(async () => {
    await agent.close();
    rmSync(root, { recursive: true, force: true });
  });

  const sleepers: ChildProcess[] = [];
  /** A live process, to be listed on a GPU. */
  function sleeper(): ChildProcess {
    const child = spawn('sleep', ['600'], { stdio: 'ignore' });
    sleepers.push(child);
    return child;
  }
  afterAll(() => {
    for (const child of sleepers) child.kill('SIGKILL');
  });

  async function reset(body: unknown, bearer = token): Promise<{ status: number; body: Record<string, unknown> }> {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${bearer}` },
      body: JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  }

  it('resets the GPU named by PCI bus id by its index and reports it listed again', async () => {
    node.needsReset(1, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    const answer = await reset({ gpu: '0000:2a:00' });
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ node: 'node-1', gpu: '0000:2a:00', index: 1, outcome: 'reset', processes: [], reason: 'GPU 1 reset and listed again' });
    expect(node.resets()).toEqual([1]);
    expect(node.gpuNeedsReset(1)).toBe(false);
  });

  it('refuses while processes use the GPU or persistence mode is on, and for a GPU nvidia-smi does not list', async () => {
    const [a, b] = [sleeper(), sleeper()] as [ChildProcess, ChildProcess];
    node.holdGpu(2, [a.pid ?? 0, b.pid ?? 0]);
    expect(await reset({ gpu: '0000:3a:00' })).toEqual({
      status: 409,
      body: expect.objectContaining({
        outcome: 'refused',
        index: 2,
        processes: [a.pid, b.pid],
        stopped: [],
        reason: `processes ${a.pid}, ${b.pid} still use GPU 2`,
      }),
    });
    // Without --gpu-reset.stop-grace-seconds the agent signals nothing.
    expect([a.exitCode, a.signalCode, b.exitCode, b.signalCode]).toEqual([null, null, null, null]);
    node.holdGpu(2, []);
    node.setPersistence(3, true);
    expect((await reset({ gpu: '0000:5d:00' })).body).toMatchObject({
      outcome: 'refused',
      reason: 'persistence mode is on for GPU 3: the persistence daemon holds it open',
    });
    node.setPersistence(3, false);
    expect((await reset({ gpu: '0000:9a:00' })).body).toMatchObject({
      outcome: 'refused',
      index: null,
      reason: 'nvidia-smi does not list GPU 0000:9a:00: a reset cannot reach it (the node needs a reboot)',
    });
    expect(node.resets()).toEqual([1]);
  });

  it('reports a reset that nvidia-smi could not do as failed', async () => {
    node.needsReset(0, 79, 'GPU has fallen off the bus.', { stuck: true });
    const answer = await reset({ gpu: '0000:18:00' });
    expect(answer.status).toBe(500);
    expect(answer.body).toMatchObject({
      outcome: 'failed',
      index: 0,
      reason: 'nvidia-smi --gpu-reset -i 0 failed: GPU 0: Unable to reset this GPU: Unknown Error',
    });
  });

  it('answers 400 naming the field for anything but a PCI bus id, and 401 without its token', async () => {
    for (const gpu of ['0', '--all', '0000:18:00 -i 1', '../../x']) {
      const answer = await reset({ gpu });
      expect(answer.status, gpu).toBe(400);
      expect(String(answer.body.error)).toContain('gpu: must be a PCI bus id like 0000:3b:00');
    }
    expect((await reset({ gpu: '0000:18:00', binary: '/bin/sh' })).status).toBe(400);
    expect((await reset({ gpu: '0000:18:00' }, 'node-2.0123456789abcdef0123456789abcdef')).status).toBe(401);
  });

  it('reads nvidia-smi bus ids in both widths', () => {
    expect(shortPciBusId('00000000:3A:00.0')).toBe('0000:3a:00');
    expect(shortPciBusId('0000:3a:00')).toBe('0000:3a:00');
    expect(shortPciBusId('3a:00.0')).toBeUndefined();
  });
});

describe('POST /api/v1/gpu-reset with --gpu-reset.stop-grace-seconds', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-gpu-reset-stop-'));
  const token = TOKEN;
  const children: ChildProcess[] = [];
  let node: SimulatedNode;
  let agent: Agent;
  let url: string;

  beforeAll(async () => {
    ({ node, agent, url } = await resetAgent(root, { [GPU_RESET_STOP_GRACE_FLAG]: '1' }));
  });
  afterAll(async () => {
    for (const child of children) child.kill('SIGKILL');
    await agent.close();
    rmSync(root, { recursive: true, force: true });
  });

  /** A live process; `ignoreTerm` makes it one that needs SIGKILL. */
  function start(ignoreTerm: boolean): { child: ChildProcess; exited: Promise<NodeJS.Signals | null> } {
    const child = ignoreTerm
      ? spawn('sh', ['-c', "trap '' TERM; while :; do sleep 1; done"], { stdio: 'ignore' })
      : spawn('sleep', ['600'], { stdio: 'ignore' });
    children.push(child);
    return { child, exited: new Promise((resolve) => child.once('exit', (_code, signal) => resolve(signal))) };
  }

  it("stops only the processes on that GPU (SIGTERM, then SIGKILL for one that ignores it), then resets it; another GPU's process lives on", async () => {
    const polite = start(false);
    const stubborn = start(true);
    const elsewhere = start(false);
    node.holdGpu(1, [polite.child.pid ?? 0, stubborn.child.pid ?? 0]);
    node.holdGpu(2, [elsewhere.child.pid ?? 0]);
    node.needsReset(1, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
      body: JSON.stringify({ gpu: '0000:2a:00' }),
    });
    const body = (await response.json()) as Record<string, unknown>;
    expect(response.status).toBe(200);
    expect(body).toMatchObject({
      outcome: 'reset',
      index: 1,
      stopped: [polite.child.pid, stubborn.child.pid],
      reason: `stopped processes ${polite.child.pid}, ${stubborn.child.pid} on GPU 1; GPU 1 reset and listed again`,
    });
    expect(await polite.exited).toBe('SIGTERM');
    expect(await stubborn.exited).toBe('SIGKILL');
    expect(elsewhere.child.exitCode).toBeNull();
    expect(elsewhere.child.signalCode).toBeNull();
    expect(node.resets()).toEqual([1]);
  }, 30_000);
});
