import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Job } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { RemediationHistory } from '../../../actuators/remediation-history.js';
import { AgentDirectory, AgentGpuResetter } from '../../../controller/agents.js';
import { JobStore } from '../../../controller/job-store.js';
import { AuditLog } from '../../../core/audit.js';
import { configSchema } from '../../../core/config.js';
import type { Step } from '../../../core/steps.js';
import { silentLogger } from '../../../core/log.js';
import { remediesSchema } from '../../../core/remedy-config.js';
import type { StepsJob } from '../../../core/queues.js';
import { createAgent, type Agent } from '../../../agent/agent.js';
import { gpuResetCollectorFactory } from '../../../agent/collectors/gpu-reset.js';
import { createSimulatedNodes, type SimulatedNode } from '../../../tryit/cluster.js';
import { recordingBackend, testStepProcessor } from '../../support/steps.js';
import { testRedis } from '../../support/redis.js';

/**
 * The reset_gpu step for a node of a registered job: the node's real agent
 * (its gpu-reset endpoint on a simulated node's nvidia-smi) resets the GPU and the job keeps its
 * nodes; a reset the agent refuses turns the step into an eviction onto a warm standby.
 */
describe('the reset_gpu step of a job', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-recovery-reset-'));
  const token = 'agents-token-0123456789abcdef';
  const store = testRedis();
  const holders: ChildProcess[] = [];
  let node: SimulatedNode;
  let agent: Agent;
  let agents: AgentDirectory;

  beforeAll(async () => {
    [node] = createSimulatedNodes(root, 1, 4) as [SimulatedNode];
    agent = createAgent({
      node: 'n01',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: join(root, 'sys'), procfs: node.procfs, kmsg: node.kmsgPath, nvidiaSmiXml: node.xmlPath, nvidiaSmi: node.nvidiaSmi },
      pollIntervalSeconds: 1,
      collectors: [gpuResetCollectorFactory],
      apiToken: token,
      logger: silentLogger(),
    });
    const url = `http://127.0.0.1:${(await agent.start()).port}`;
    agents = new AgentDirectory(configSchema.parse({ agents: { urls: { n01: url }, token } }).agents, async (name) => name === 'n01');
  });
  afterAll(async () => {
    for (const child of holders) child.kill('SIGKILL');
    await agent.close();
    rmSync(root, { recursive: true, force: true });
    await store.cleanup();
  });

  /** A fresh job (the one before it on these nodes finished), the dry-run backend holding one standby, and the processor with the agent's reset. */
  async function setUp(job: string) {
    const jobs = new JobStore(store.redis, store.keys);
    for (const record of await jobs.list()) if (record.state !== 'finished') await jobs.finish(record.spec.name, 'the next test takes its nodes');
    await jobs.create({ name: job, nodes: ['n00', 'n01', 'n02', 'n03'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' });
    const backend = recordingBackend(store);
    await backend.holdStandby(`spare-${job}`);
    const audit = new AuditLog(store.redis, store.keys);
    const history = new RemediationHistory(store.redis, store.keys, 20);
    const process = testStepProcessor(
      store,
      { backend, jobs, audit },
      { resetter: new AgentGpuResetter(agents), history, remedies: remediesSchema.parse({ gpuReset: { timeoutSeconds: 30, busyRetries: 0 } }) },
    );
    const steps: Step[] = [
      { verb: 'reset_gpu', job, nodes: ['n01'], gpu: '0000:2a:00', reason: 'fatal Xid 48 on n01', citation: 'test' },
      { verb: 'restart', job, reason: 'relaunch after the reset', citation: 'test' },
    ];
    const run = () =>
      process({ id: `t-${job}`, data: { v: 2, transitionId: `t-${job}`, job, steps }, attemptsMade: 0, opts: { attempts: 5 } } as unknown as Job<StepsJob>);
    return { jobs, backend, audit, history, run };
  }

  it('resets the GPU through the agent and relaunches on the same nodes, no standby taken', async () => {
    const { jobs, backend, audit, history, run } = await setUp('reset-holds');
    node.needsReset(1, 48, 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.');
    await run();
    expect(node.resets()).toEqual([1]);
    expect((await jobs.get('reset-holds')).spec.nodes).toEqual(['n00', 'n01', 'n02', 'n03']);
    expect(await backend.standbys()).toContain('spare-reset-holds');
    expect((await backend.nodeState('n01')).drained).toBe(false);
    const summaries = (await audit.read({ node: 'n01', type: 'action' })).map((entry) => entry.summary);
    expect(summaries.some((summary) => /GPU 0000:2a:00 of n01 reset through its agent/.test(summary))).toBe(true);
    expect((await history.read('n01'))[0]).toMatchObject({ action: 'reset_gpu', outcome: 'done', gpu: '0000:2a:00' });
  });

  it('evicts the node onto a standby when the agent refuses the reset (a process still holds the GPU)', async () => {
    const { jobs, backend, history, run } = await setUp('reset-refused');
    const holder = spawn('sleep', ['600'], { stdio: 'ignore' });
    holders.push(holder);
    node.holdGpu(1, [holder.pid ?? 0]);
    try {
      await run();
    } finally {
      node.holdGpu(1, []);
    }
    expect(node.resets()).toEqual([1]);
    const nodes = (await jobs.get('reset-refused')).spec.nodes;
    expect(nodes).not.toContain('n01');
    expect(nodes[1]).toMatch(/^spare-reset-/);
    expect((await backend.nodeState('n01')).drained).toBe(true);
    expect((await history.read('n01'))[0]).toMatchObject({
      action: 'reset_gpu',
      outcome: 'fell_back',
      gpu: '0000:2a:00',
      detail: expect.stringContaining(`processes ${holder.pid} still use GPU 1`),
    });
  });
});
