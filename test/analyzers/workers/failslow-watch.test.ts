import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import { parseJobSpec, type JobSpec } from '../../../core/job.js';
import { FailSlowWatch } from '../../../analyzers/workers/failslow-watch.js';
import { JobStore } from '../../../controller/job-store.js';
import { MicrobatchBoard } from '../../../controller/microbatches.js';
import type { LadderEventJob } from '../../../core/queues.js';
import { testRedis } from '../../support/redis.js';

const NODES = Array.from({ length: 8 }, (_, index) => `fs${index}`);
// tp 1, pp 2, dp 4, order tp-dp-pp: rank = dp + 4·pp, one rank per node. Rank 5 is DP group 1, stage 1.
const SPEC = {
  name: 'fs-job',
  nodes: NODES,
  ranksPerNode: 1,
  topology: { tp: 1, pp: 2, dp: 4, order: 'tp-dp-pp' },
  launcher: 'accept',
  codeVersion: 'v1',
  microbatches: { perIteration: 16 },
};

/**
 * A stand-in for Prometheus' query API serving the training collector's two per-rank series,
 * so a test can step a job through hundreds of iterations in a second.
 */
async function trainingPrometheus(state: { iteration: number; seconds: (rank: number) => number }): Promise<{ url: string; server: Server }> {
  const server = createServer((request, response) => {
    const query = new URL(request.url ?? '/', 'http://x').searchParams.get('query') ?? '';
    const name = query.startsWith('steadfast_training_iteration_seconds')
      ? 'seconds'
      : query.startsWith('steadfast_training_iteration{')
        ? 'iteration'
        : undefined;
    const result = name
      ? NODES.map((_, rank) => ({
          metric: { __name__: `steadfast_training_${name}`, job: 'steadfast-agent', training_job: 'fs-job', rank: String(rank) },
          value: [Date.now() / 1000, String(name === 'seconds' ? state.seconds(rank) : state.iteration)],
        }))
      : [];
    response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'success', data: { resultType: 'vector', result } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

describe('online fail-slow detection and mitigation (Greyhound §4-5)', () => {
  const store = testRedis();
  const state = { iteration: 0, seconds: (_rank: number): number => 1 };
  let server: Server;
  let watch: FailSlowWatch;
  let board: MicrobatchBoard;
  let audit: AuditLog;
  const dispatched: LadderEventJob[] = [];
  let spec: JobSpec;

  beforeAll(async () => {
    const prometheus = await trainingPrometheus(state);
    server = prometheus.server;
    const jobs = new JobStore(store.redis, store.keys);
    spec = (await jobs.create(SPEC)).spec;
    board = new MicrobatchBoard(store.redis, store.keys, jobs);
    audit = new AuditLog(store.redis, store.keys, 100_000);
    watch = new FailSlowWatch({
      redis: store.redis,
      keys: store.keys,
      audit,
      board,
      prometheusUrl: prometheus.url,
      costSeconds: { S2: 5, S3: 20, S4: 40 },
      dispatch: async (event) => {
        dispatched.push(event);
      },
    });
  });
  afterAll(async () => {
    server.close();
    await store.cleanup();
  });

  /**
   * One training iteration: like a training loop, read the micro-batch share of each DP group
   * first; a rank's iteration takes its seconds per micro-batch times its group's share.
   */
  let perMicrobatch = (_rank: number): number => 0.25;
  async function iterate(): Promise<string | undefined> {
    const { assignment } = await board.get('fs-job');
    state.iteration += 1;
    state.seconds = (rank) => perMicrobatch(rank) * (assignment[rank % 4] as number) * (1 + 0.02 * Math.sin(rank * 7 + state.iteration * 3));
    return (await watch.check(spec, state.iteration * 1000))?.strategy;
  }

  it('ignores healthy jitter: no change point, no mitigation, the even split stays', async () => {
    // ±2 % jitter, deterministic; 0.25 s per micro-batch, 4 micro-batches each: 1 s iterations.
    for (let index = 0; index < 60; index += 1) await iterate();
    expect(dispatched).toEqual([]);
    expect(await board.get('fs-job')).toMatchObject({ strategy: 'even', assignment: [4, 4, 4, 4] });
    expect((await audit.read({ limit: 1000 })).filter((entry) => entry.data.verb === 'failslow_change')).toEqual([]);
  });

  it("detects one rank slowing by 50 %, rebalances its DP group's micro-batches, then escalates to S3 and S4 as the lost time pays for each", async () => {
    perMicrobatch = (rank) => (rank === 5 ? 0.375 : 0.25);
    const strategies: (string | undefined)[] = [];
    for (let index = 0; index < 500 && dispatched.length === 0; index += 1) strategies.push(await iterate());
    const changes = (await audit.read({ limit: 1000 })).filter((entry) => entry.data.verb === 'failslow_change');
    expect(changes).toHaveLength(1);
    expect(changes[0]?.summary).toMatch(/^fs-job: rank 5 slowed: 0\.2[45]\d s → 0\.3[78]\d s per micro-batch \(×1\.5\d\)$/);
    // S2 came first, with fewer micro-batches for DP group 1 (rank 5's).
    expect(strategies).toContain('S2');
    expect(strategies.indexOf('S2')).toBeLessThan(strategies.indexOf('S3'));
    const decisions = (await audit.read({ limit: 1000 })).filter((entry) => entry.data.verb === 'failslow_mitigation').map((entry) => entry.data.strategy);
    expect(decisions).toEqual(['S2', 'S3', 'S4']);
    // S4: the slow rank's machine goes to the recovery ladder as a machine fault (checkpoint, evict, restart).
    expect(dispatched).toHaveLength(1);
    expect(dispatched[0]?.event).toMatchObject({ type: 'fault', faultClass: 'machine', nodes: ['fs5'] });
  });

  it('puts the even split back the moment S4 hands the slow machine to the ladder, so the relaunched run does not start on a plan made for a straggler it no longer has', async () => {
    const served = await board.get('fs-job');
    expect(served).toMatchObject({ strategy: 'even', assignment: [4, 4, 4, 4] });
    expect(served.reason).toMatch(/^S4: /);
  });

  it('served the S2 assignment to the training loop while it was in force: the slow group got 3 of 16, the slowest iteration 1.25 s instead of 1.5 s', async () => {
    const entries = (await audit.read({ limit: 1000 })).filter((entry) => entry.data.verb === 'failslow_mitigation' && entry.data.strategy === 'S2');
    const planned = (entries[0]?.data.microbatches as { assignment: number[]; predictedSeconds: number }).assignment;
    expect(planned.reduce((sum, m) => sum + m, 0)).toBe(16);
    expect(planned[1]).toBe(3);
    expect(Math.max(...planned.map((m, group) => m * (group === 1 ? 0.375 : 0.25)))).toBe(1.25);
    const served = await board.get('fs-job');
    // The S2 plan, then the even split again at S4.
    expect(served.revision).toBeGreaterThanOrEqual(2);
  });

  it('undoes the mitigation when the slow-down is over', async () => {
    // The restarted job runs on healthy machines: every rank back to normal.
    perMicrobatch = () => 0.25;
    let strategy: string | undefined;
    for (let index = 0; index < 60; index += 1) strategy = (await iterate()) ?? strategy;
    expect(await board.get('fs-job')).toMatchObject({ strategy: 'even', assignment: [4, 4, 4, 4] });
    expect(parseJobSpec(spec).topology.ranks).toHaveLength(8);
  });
});

describe("fail-slow verification at the operator's threshold (analysis.failSlowThreshold)", () => {
  const store = testRedis();
  const state = { iteration: 0, seconds: (_rank: number): number => 1 };
  let server: Server;

  afterAll(async () => {
    server?.close();
    await store.cleanup();
  });

  it('lets a 50 % slow-down pass at a 60 % threshold, and verifies a doubling', async () => {
    const prometheus = await trainingPrometheus(state);
    server = prometheus.server;
    const jobs = new JobStore(store.redis, store.keys);
    const spec = (await jobs.create(SPEC)).spec;
    const audit = new AuditLog(store.redis, store.keys, 100_000);
    const watch = new FailSlowWatch({
      redis: store.redis,
      keys: store.keys,
      audit,
      board: new MicrobatchBoard(store.redis, store.keys, jobs),
      prometheusUrl: prometheus.url,
      costSeconds: { S2: 1e6, S3: 2e6, S4: 3e6 },
      threshold: 0.6,
      dispatch: async () => undefined,
    });
    const changes = async (): Promise<string[]> =>
      (await audit.read({ limit: 1000 })).filter((entry) => entry.data.verb === 'failslow_change').map((entry) => entry.summary);
    const train = async (iterations: number, factor: number): Promise<void> => {
      for (let index = 0; index < iterations; index += 1) {
        state.iteration += 1;
        state.seconds = (rank) => (rank === 5 ? factor : 1) * (1 + 0.02 * Math.sin(rank * 7 + state.iteration * 3));
        await watch.check(spec, state.iteration * 1000);
      }
    };
    await train(40, 1);
    await train(120, 1.5);
    expect(await changes()).toEqual([]);
    await train(60, 3);
    expect(await changes()).toEqual([expect.stringMatching(/^fs-job: rank 5 slowed: .* \(×2\.\d+\)$/)]);
  });
});
