import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Job } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import { configSchema } from '../../../core/config.js';
import { silentLogger } from '../../../core/log.js';
import { AgentDirectory } from '../../../controller/agents.js';
import { createAnalysisProcessor, type AnalysisDeps } from '../../../analyzers/workers/analysis.js';
import { JobStore } from '../../../controller/job-store.js';
import { replayCommandOf } from '../../../controller/workers.js';
import type { AnalysisJob, LadderEventJob } from '../../../core/queues.js';
import { createAgent, type Agent } from '../../../agent/agent.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../../agent/collectors/diagnose.js';
import type { Launchers } from '../../../core/launcher.js';
import { testRedis } from '../../support/redis.js';

const NODES = ['a0', 'a1', 'a2', 'a3'];

// 4 nodes × 2 ranks: TP 2 inside a node, PP 2, DP 2 (Megatron order tp-dp-pp).
/** The operator's launchers: one without a replay, and one whose replay "fails" on any group that contains a1 (its silent data corruption). */
const LAUNCHERS: Launchers = {
  accept: { kind: 'slurm', command: ['true'] },
  'replay-a1': { kind: 'slurm', command: ['true'], replay: ['sh', '-c', 'case ",$0," in *,a1,*) exit 1;; esac', '{nodes}'] },
};

function jobSpec(name: string, launcher = 'accept'): unknown {
  return {
    name,
    nodes: NODES,
    ranksPerNode: 2,
    topology: { tp: 2, pp: 2, dp: 2, order: 'tp-dp-pp' },
    launcher,
    codeVersion: 'v1',
  };
}

function analysisJob(data: AnalysisJob, attemptsMade = 0): Job<AnalysisJob> {
  return { data, attemptsMade, opts: { attempts: 3 } } as unknown as Job<AnalysisJob>;
}

const HEALTHY_STACK = (rank: number): string => `Process ${1000 + rank}: python train.py
Python v3.10.12 (/usr/bin/python3.10)

Thread ${1000 + rank} (active): "MainThread"
    all_reduce (torch/distributed/distributed_c10d.py:2050)
    reduce_gradients (megatron/core/distributed/grad_buffer.py:210)
    train_step (megatron/training.py:740)
    train (megatron/training.py:1120)
    pretrain (megatron/training.py:300)
    <module> (pretrain_gpt.py:240)
`;

const STUCK_STACK = (rank: number): string => `Process ${1000 + rank}: python train.py
Python v3.10.12 (/usr/bin/python3.10)

Thread ${1000 + rank} (active): "MainThread"
    recv (torch/distributed/distributed_c10d.py:1630)
    recv_forward (megatron/core/pipeline_parallel/p2p_communication.py:380)
    forward_backward_pipelining (megatron/core/pipeline_parallel/schedules.py:1200)
    train_step (megatron/training.py:740)
    train (megatron/training.py:1120)
    pretrain (megatron/training.py:300)
    <module> (pretrain_gpt.py:240)
`;

describe('analysis worker', () => {
  const store = testRedis();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-analysis-'));
  const agents: Agent[] = [];
  const servers: Server[] = [];
  let jobs: JobStore;
  let audit: AuditLog;
  let feedback: LadderEventJob[];

  beforeAll(() => {
    jobs = new JobStore(store.redis, store.keys);
    audit = new AuditLog(store.redis, store.keys, 10_000);
  });
  afterEach(async () => {
    await Promise.all(agents.splice(0).map((agent) => agent.close()));
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
  afterAll(async () => {
    rmSync(dir, { recursive: true, force: true });
    await store.cleanup();
  });

  function processor(urls: Record<string, string>, overrides: Partial<AnalysisDeps> = {}): (job: Job<AnalysisJob>) => Promise<{ evict: string[] }> {
    feedback = [];
    const config = configSchema.parse({ agents: { urls, diagnoseTimeoutSeconds: 20, traceTimeoutSeconds: 5 } });
    return createAnalysisProcessor({
      jobs,
      audit,
      // The dry-run backend knows every node: the agents of the job's nodes are asked.
      agents: new AgentDirectory(config.agents, async () => true),
      replayCommand: replayCommandOf(LAUNCHERS),
      feedback: async (event) => {
        feedback.push(event);
      },
      logger: silentLogger(),
      stackRounds: 3,
      stackRoundSeconds: 0,
      replayTimeoutSeconds: 30,
      ...overrides,
    });
  }

  async function auditSummaries(ref: string): Promise<string[]> {
    return (await audit.read({ limit: 1000 })).filter((entry) => entry.ref === ref).map((entry) => entry.summary);
  }

  /** A real agent per node, each with the diagnostics file `checksOf(node)`; returns their URLs. */
  async function startAgents(prefix: string, checksOf: (node: string) => unknown[]): Promise<Record<string, string>> {
    const urls: Record<string, string> = {};
    for (const node of NODES) {
      const file = join(dir, `${prefix}-${node}.json`);
      writeFileSync(file, JSON.stringify({ checks: checksOf(node) }));
      const agent = createAgent({
        node,
        listen: { host: '127.0.0.1', port: 0 },
        paths: { sysfs: '/nonexistent', procfs: '/nonexistent', kmsg: '/nonexistent', nvidiaSmiXml: undefined, nvidiaSmi: '/nonexistent' },
        pollIntervalSeconds: 5,
        collectors: [diagnoseCollectorFactory],
        settings: { [DIAGNOSE_CONFIG_FLAG]: file },
        logger: silentLogger(),
      });
      agents.push(agent);
      urls[node] = `http://127.0.0.1:${(await agent.start()).port}`;
    }
    return urls;
  }

  /** Registers a job on the test's machines, once the job before it there has finished (a node serves one job at a time). */
  async function registerAlone(spec: unknown): Promise<void> {
    for (const record of await jobs.list()) if (record.state !== 'finished') await jobs.finish(record.spec.name, "the next test's job takes its machines");
    await jobs.create(spec);
  }

  it('runs stop-time diagnostics on every node through the real agents and reports the failing node to the ladder', async () => {
    await registerAlone(jobSpec('diag-job'));
    // a2's GPU check fails; the others pass.
    const urls = await startAgents('diag', (node) => [
      { name: 'eud', command: ['sh', '-c', node === 'a2' ? 'echo "GPU 3: fail" >&2; exit 1' : 'exit 0'], timeoutSeconds: 10 },
    ]);
    const evict = await processor(urls)(analysisJob({ kind: 'diagnostics', job: 'diag-job', ref: 't1:0', reason: 'crash without culprit' }));
    expect(evict).toEqual({ evict: ['a2'] });
    expect(feedback).toEqual([
      { job: 'diag-job', event: { type: 'diagnostics_result', time: expect.any(Number), suspects: ['a2'] }, eventId: 't1:0:diagnostics' },
    ]);
    expect((await auditSummaries('t1:0'))[0]).toMatch(/^diag-job: diagnostics: evict a2; a2 failed eud: .*GPU 3: fail/);
  });

  // ByteRobust §4.2's hierarchy: EUD on each machine, NCCL inside it, NCCL with the neighbours.
  const STAGES = [
    { name: 'machine', checks: ['eud'] },
    { name: 'intra-machine', checks: ['nccl-all-to-all'] },
    { name: 'inter-machine', checks: ['nccl-all-gather-neighbours'] },
  ];
  /** A check that leaves a file behind saying it ran, and with which peers; fails on `failOn`. */
  const marking = (name: string, node: string, failOn?: string): unknown => ({
    name,
    command: [
      'sh',
      '-c',
      `echo "$STEADFAST_DIAGNOSE_PEERS" > "$0"; [ "$STEADFAST_NODE" != "${failOn ?? ''}" ] || { echo "${name} broke" >&2; exit 1; }`,
      join(dir, `ran-${name}-${node}`),
    ],
    timeoutSeconds: 10,
  });
  const ran = (name: string): string[] => NODES.filter((node) => existsSync(join(dir, `ran-${name}-${node}`)));
  const peersSeen = (name: string, node: string): string => readFileSync(join(dir, `ran-${name}-${node}`), 'utf8').trim();

  it('walks the stages and stops at the first that finds a suspect, with every stage on the audit trail', async () => {
    await registerAlone(jobSpec('staged-job'));
    const urls = await startAgents('staged', (node) => [
      { name: 'eud', command: ['sh', '-c', node === 'a2' ? 'echo "GPU 3: fail" >&2; exit 1' : 'exit 0'], timeoutSeconds: 10 },
      marking('nccl-all-to-all', node),
      marking('nccl-all-gather-neighbours', node),
    ]);
    const evict = await processor(urls, { diagnoseStages: STAGES })(
      analysisJob({ kind: 'diagnostics', job: 'staged-job', ref: 't7:0', reason: 'crash without culprit' }),
    );
    expect(evict).toEqual({ evict: ['a2'] });
    expect(feedback.map((entry) => entry.event)).toEqual([{ type: 'diagnostics_result', time: expect.any(Number), suspects: ['a2'] }]);
    // The NCCL stages never ran: EUD had localised the failure.
    expect(ran('nccl-all-to-all')).toEqual([]);
    expect(ran('nccl-all-gather-neighbours')).toEqual([]);
    const summaries = await auditSummaries('t7:0');
    expect(summaries).toHaveLength(2);
    expect(summaries[0]).toMatch(/^staged-job: diagnostics: stage 1\/3 machine \(eud\) on 4 nodes: evict a2; a2 failed eud: .*GPU 3: fail/);
    expect(summaries[1]).toMatch(
      /^staged-job: diagnostics: evict a2; a2 failed eud: .*; stages run: machine; skipped intra-machine, inter-machine: stage machine found suspects$/,
    );
  });

  it('takes only the nodes a stage cleared to the next, drawing the neighbour ring over them', async () => {
    await registerAlone(jobSpec('ring-job'));
    // a3's agent has no EUD configured: it answers 400, is not cleared and goes no further.
    // The inter-machine all-gather fails on a1.
    const urls = await startAgents('ring', (node) => [
      ...(node === 'a3' ? [] : [{ name: 'eud', command: ['true'], timeoutSeconds: 10 }]),
      marking('nccl-all-to-all', node),
      marking('nccl-all-gather-neighbours', node, 'a1'),
    ]);
    const evict = await processor(urls, { diagnoseStages: STAGES })(
      analysisJob({ kind: 'diagnostics', job: 'ring-job', ref: 't8:0', reason: 'crash without culprit' }),
    );
    expect(evict).toEqual({ evict: ['a1'] });
    expect(ran('nccl-all-to-all')).toEqual(['a0', 'a1', 'a2']);
    expect(ran('nccl-all-gather-neighbours')).toEqual(['a0', 'a1', 'a2']);
    // The ring over a0, a1, a2: the next one first, then the one before; a3 is no one's peer.
    expect(['a0', 'a1', 'a2'].map((node) => peersSeen('nccl-all-gather-neighbours', node))).toEqual(['a1,a2', 'a2,a0', 'a0,a1']);
    const summaries = await auditSummaries('t8:0');
    expect(summaries).toHaveLength(4);
    expect(summaries[0]).toMatch(
      /^ring-job: diagnostics: stage 1\/3 machine \(eud\) on 4 nodes: no suspect; a3 inconclusive: agent answered 400: unknown check "eud".*; not cleared, not tested further: a3$/,
    );
    expect(summaries[1]).toBe('ring-job: diagnostics: stage 2/3 intra-machine (nccl-all-to-all) on 3 nodes: no suspect');
    expect(summaries[2]).toMatch(
      /^ring-job: diagnostics: stage 3\/3 inter-machine \(nccl-all-gather-neighbours\) on 3 nodes: evict a1; a1 failed nccl-all-gather-neighbours: .*nccl-all-gather-neighbours broke$/,
    );
    expect(summaries[3]).toMatch(
      /^ring-job: diagnostics: evict a1; a1 failed nccl-all-gather-neighbours: .*; stages run: machine, intra-machine, inter-machine$/,
    );
  });

  it("runs dual-phase replay with the job's replay command and names the one machine in both failing groups", async () => {
    await registerAlone(jobSpec('replay-job', 'replay-a1'));
    const evict = await processor({})(analysisJob({ kind: 'replay', job: 'replay-job', ref: 't2:0', reason: 'restarts keep failing' }));
    expect(evict).toEqual({ evict: ['a1'] });
    expect(feedback.map((entry) => entry.event)).toEqual([{ type: 'replay_result', time: expect.any(Number), culprits: ['a1'] }]);
    expect((await auditSummaries('t2:0'))[0]).toContain('suspects a1');
  });

  it('skips replay when the job has no replay command, says so, and lets the ladder go on', async () => {
    await registerAlone(jobSpec('no-replay'));
    await processor({})(analysisJob({ kind: 'replay', job: 'no-replay', ref: 't3:0', reason: 'x' }));
    expect(feedback.map((entry) => entry.event)).toEqual([
      { type: 'replay_result', time: expect.any(Number), culprits: [], unrun: expect.stringContaining('has no replay command') },
    ]);
    expect((await auditSummaries('t3:0'))[0]).toContain('has no replay command');
  });

  it('aggregates stack dumps from every node over the rounds and over-evicts the machines of the group whose ranks are stuck', async () => {
    await registerAlone(jobSpec('hang-job'));
    // Ranks 6 and 7 (one TP group, on a3) wait in a pipeline receive; the other six in all-reduce.
    const urls: Record<string, string> = {};
    for (const [index, node] of NODES.entries()) {
      const ranks = [index * 2, index * 2 + 1];
      const server = createServer((request, response) => {
        response.setHeader('content-type', 'application/json');
        response.end(
          JSON.stringify({
            node,
            capturedAt: new Date().toISOString(),
            dumps: ranks.map((rank) => ({ pid: 1000 + rank, role: 'rank', rank, ok: true, dump: rank >= 6 ? STUCK_STACK(rank) : HEALTHY_STACK(rank) })),
            flightRecorder: [],
          }),
        );
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      servers.push(server);
      urls[node] = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    }
    const evict = await processor(urls)(analysisJob({ kind: 'stacks', job: 'hang-job', ref: 't4:0', reason: 'no progress' }));
    expect(evict).toEqual({ evict: ['a3'] });
    expect(feedback).toHaveLength(1);
    expect(feedback[0]?.event).toMatchObject({ type: 'fault', faultClass: 'machine', nodes: ['a3'], signalId: 'analysis:t4:0' });
    expect((await auditSummaries('t4:0'))[0]).toBe('hang-job: stacks: node a3 flagged in 3 of 3 rounds; evicting its machines');
  });

  it('runs one stack aggregation per job at a time: a second request while one runs is recorded, not traced', async () => {
    await registerAlone(jobSpec('busy-job'));
    let traces = 0;
    const urls: Record<string, string> = {};
    for (const [index, node] of NODES.entries()) {
      const server = createServer((request, response) => {
        traces += 1;
        response.setHeader('content-type', 'application/json');
        const ranks = [index * 2, index * 2 + 1];
        const body = JSON.stringify({
          node,
          capturedAt: new Date().toISOString(),
          dumps: ranks.map((rank) => ({ pid: 1000 + rank, role: 'rank', rank, ok: true, dump: rank >= 6 ? STUCK_STACK(rank) : HEALTHY_STACK(rank) })),
          flightRecorder: [],
        });
        setTimeout(() => response.end(body), 50);
      });
      await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
      servers.push(server);
      urls[node] = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    }
    const run = processor(urls);
    const [first, second] = await Promise.all([
      run(analysisJob({ kind: 'stacks', job: 'busy-job', ref: 't6:0', reason: 'stalled on a0' })),
      run(analysisJob({ kind: 'stacks', job: 'busy-job', ref: 't6:1', reason: 'stalled on a1' })),
    ]);
    expect(first).toEqual({ evict: ['a3'] });
    expect(second).toEqual({ evict: [] });
    expect(traces).toBe(NODES.length * 3);
    expect((await auditSummaries('t6:1'))[0]).toBe(
      'busy-job: stacks: a stack aggregation of this job is already running; its verdict stands for this request too',
    );
    // Once it has finished, the next request aggregates again.
    expect(await run(analysisJob({ kind: 'stacks', job: 'busy-job', ref: 't6:2', reason: 'stalled again' }))).toEqual({ evict: ['a3'] });
  });

  it('takes no decision when no agent gives a stack, instead of blaming every machine', async () => {
    await registerAlone(jobSpec('dark-job'));
    const evict = await processor({ a0: 'http://127.0.0.1:9', a1: 'http://127.0.0.1:9', a2: 'http://127.0.0.1:9', a3: 'http://127.0.0.1:9' })(
      analysisJob({ kind: 'stacks', job: 'dark-job', ref: 't5:0', reason: 'no progress' }),
    );
    expect(evict).toEqual({ evict: [] });
    expect(feedback).toEqual([]);
    expect((await auditSummaries('t5:0'))[0]).toContain('no stack dumps could be taken');
    // The record says why: each agent's trace error, by node.
    expect((await auditSummaries('t5:0'))[0]).toMatch(/no stack dumps could be taken \(a0: .+; a1: /);
  });

  it('reports diagnostics as finding nothing after the last attempt fails, so the ladder is never left waiting', async () => {
    const run = processor({});
    const request = { kind: 'diagnostics', job: 'gone-job', ref: 't6:0', reason: 'x' } as const;
    await expect(run(analysisJob(request, 0))).rejects.toThrow(/gone-job/);
    expect(feedback).toEqual([]);
    await expect(run(analysisJob(request, 2))).resolves.toEqual({ evict: [] });
    expect(feedback.map((entry) => entry.event)).toEqual([
      { type: 'diagnostics_result', time: expect.any(Number), suspects: [], unrun: 'the diagnostics analysis failed after 3 attempts' },
    ]);
  });
});
