import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../../controller/service.js';
import { READ_ONLY_TOKEN, agentToken, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * What a job's checkpoint reports may put into the controller: copies of the job's own ranks on
 * the job's own nodes, a bounded number a step and a bounded number of steps, so that a node's
 * agent cannot plant copies that make a restore plan take minutes (the planner was quadratic in
 * the copies of a step, and a report could carry 100,000 of any rank and holder).
 */

const NODES = Array.from({ length: 16 }, (_, index) => `n${String(index).padStart(2, '0')}`);
const RANKS_PER_NODE = 8;
const RANKS = NODES.length * RANKS_PER_NODE;
/** 128 ranks: TP 8 inside a node, PP 2, DP 8. */
const JOB = {
  name: 'gpt',
  nodes: NODES,
  ranksPerNode: RANKS_PER_NODE,
  topology: { tp: 8, pp: 2, dp: 8, order: 'tp-dp-pp' },
  launcher: 'accept',
  codeVersion: 'v1',
};
const AGENT = agentToken('n00');
/** The bounds the job store keeps (controller/job-store.ts). */
const STEPS_KEPT = 64;
const COPIES_PER_RANK = 4;
const SHARDS_PER_REPORT = 1000;

const nodeOf = (rank: number, offset = 0): string => NODES[(Math.floor(rank / RANKS_PER_NODE) + offset) % NODES.length] as string;

interface Shard {
  step: number;
  rank: number;
  tier: string;
  holder?: string;
}

/**
 * A step as a job with the most copies keeps it: each rank in host memory on its node and in
 * host memory of the next two nodes; the oldest step also remotely, the others on a third peer.
 */
function fullStep(step: number, remote: boolean): Shard[] {
  return Array.from({ length: RANKS }, (_, rank) => [
    { step, rank, tier: 'host', holder: nodeOf(rank) },
    { step, rank, tier: 'peer', holder: nodeOf(rank, 1) },
    { step, rank, tier: 'peer', holder: nodeOf(rank, 2) },
    remote ? { step, rank, tier: 'remote' } : { step, rank, tier: 'peer', holder: nodeOf(rank, 3) },
  ]).flat();
}

describe('checkpoint reports on the real controller', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  const get = async (path: string, token = READ_ONLY_TOKEN): Promise<{ status: number; body: Record<string, unknown> }> => {
    const response = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${token}` } });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  };

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0 } } }), {
      workers: false,
    }));
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'small', nodes: ['m00', 'm01'], ranksPerNode: 1, topology: { dp: 2 } })).status).toBe(201);
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('refuses a copy of a rank the job does not have, or held by a node outside the job, naming the field, and keeps nothing of that report', async () => {
    const rank = await post(
      `${url}/api/v1/jobs/small/checkpoints`,
      [
        { step: 1, rank: 0, tier: 'host', holder: 'm00' },
        { step: 1, rank: 2, tier: 'host', holder: 'm01' },
      ],
      agentToken('m00'),
    );
    expect(rank.status).toBe(400);
    expect(rank.body.error).toBe('invalid checkpoint shards: 1.rank: 2 is not a rank of job small, which has ranks 0-1');
    const holder = await post(`${url}/api/v1/jobs/small/checkpoints`, { step: 1, rank: 1, tier: 'peer', holder: 'n05' }, agentToken('m00'));
    expect(holder.status).toBe(400);
    expect(holder.body.error).toBe('invalid checkpoint shards: holder: n05 is not a node of job small');
    expect(await controller.jobs.checkpoints('small')).toEqual([]);
    // The job's own ranks and nodes, and a remote copy, which has no holder, are taken.
    expect(
      (
        await post(
          `${url}/api/v1/jobs/small/checkpoints`,
          [
            { step: 1, rank: 0, tier: 'host', holder: 'm00' },
            { step: 1, rank: 1, tier: 'remote' },
          ],
          agentToken('m00'),
        )
      ).status,
    ).toBe(202);
  });

  it('keeps one copy per step, rank and holder: a copy reported again in another tier replaces the one kept', async () => {
    for (const tier of ['gpu', 'host', 'disk', 'host'])
      expect((await post(`${url}/api/v1/jobs/small/checkpoints`, { step: 2, rank: 1, tier, holder: 'm01' }, agentToken('m01'))).status).toBe(202);
    expect((await controller.jobs.checkpoints('small')).filter((shard) => shard.step === 2)).toEqual([{ step: 2, rank: 1, tier: 'host', holder: 'm01' }]);
  });

  it('refuses the 40,000 planted copies of one step that held the controller for 84 s, and a report of one step beyond what the step keeps', async () => {
    const tiers = ['gpu', 'host', 'disk', 'peer', 'remote'];
    const planted = Array.from({ length: 40_000 }, (_, index) => ({
      step: 7,
      rank: index % RANKS,
      tier: tiers[index % 5] as string,
      holder: NODES[index % NODES.length] as string,
    }));
    const tooMany = await post(`${url}/api/v1/jobs/gpt/checkpoints`, planted, AGENT);
    expect(tooMany.status).toBe(400);
    expect(tooMany.body.error).toContain(`invalid checkpoint shards: (root): Too big: expected array to have <=${SHARDS_PER_REPORT} items`);
    // 1,000 pairs of a rank and a node of the job, where a step keeps 128 ranks × 4.
    const pairs = NODES.flatMap((holder) => Array.from({ length: RANKS }, (_, rank) => ({ step: 7, rank, tier: 'peer', holder }))).slice(0, SHARDS_PER_REPORT);
    const overStep = await post(`${url}/api/v1/jobs/gpt/checkpoints`, pairs, AGENT);
    expect(overStep.status).toBe(400);
    expect(overStep.body.error).toBe(
      `invalid checkpoint shards: step 7 would hold 1000 copies; job gpt keeps at most ${RANKS * COPIES_PER_RANK} a step (128 ranks × 4 copies)`,
    );
    expect(await controller.jobs.checkpoints('gpt')).toEqual([]);
  });

  it('keeps fewer steps of a job whose full steps would pass 262,144 copies: 16 for 4,096 ranks', async () => {
    const nodes = Array.from({ length: 512 }, (_, index) => `b${String(index).padStart(3, '0')}`);
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'big', nodes, ranksPerNode: 8, topology: { tp: 8, pp: 8 } })).status).toBe(201);
    for (let step = 1; step <= 17; step += 1)
      expect((await post(`${url}/api/v1/jobs/big/checkpoints`, { step, rank: 4095, tier: 'remote' }, agentToken('b000'))).status).toBe(202);
    expect((await controller.jobs.checkpoints('big')).map((shard) => shard.step)).toEqual(Array.from({ length: 16 }, (_, index) => index + 2));
  });

  it('keeps a job at its bounds: the newest 64 steps of 512 copies each; a copy more in a full step is refused; the restore plan walks every step and /healthz answers meanwhile', async () => {
    const first = 1000;
    for (let step = first; step < first + STEPS_KEPT + 1; step += 1) {
      const reported = await post(`${url}/api/v1/jobs/gpt/checkpoints`, fullStep(step, step === first + 1), AGENT);
      expect(reported.status, reported.body.error).toBe(202);
    }
    const kept = await controller.jobs.checkpoints('gpt');
    // The 65th step pushed out the oldest.
    expect(new Set(kept.map((shard) => shard.step)).size).toBe(STEPS_KEPT);
    expect(Math.min(...kept.map((shard) => shard.step))).toBe(first + 1);
    expect(kept.length).toBe(STEPS_KEPT * RANKS * COPIES_PER_RANK);

    const newest = first + STEPS_KEPT;
    const oneMore = await post(`${url}/api/v1/jobs/gpt/checkpoints`, { step: newest, rank: 0, tier: 'disk', holder: 'n09' }, AGENT);
    expect(oneMore.status).toBe(400);
    expect(oneMore.body.error).toBe(`invalid checkpoint shards: step ${newest} would hold 513 copies; job gpt keeps at most 512 a step (128 ranks × 4 copies)`);
    // A copy the step already has, in another tier, replaces it and is taken.
    expect((await post(`${url}/api/v1/jobs/gpt/checkpoints`, { step: newest, rank: 0, tier: 'disk', holder: 'n00' }, AGENT)).status).toBe(202);

    // Ranks 0-7 lose every copy on n00-n03, so only the step with remote copies is complete;
    // there ranks 0-15 (on n00 and n01) load remotely, the others from a surviving peer.
    const [plan, ...health] = await Promise.all([
      get('/api/v1/jobs/gpt/restore-plan?evicted=n00,n01,n02,n03', AGENT),
      ...Array.from({ length: 20 }, () => fetch(`${url}/healthz`)),
    ]);
    expect(health.map((answer) => answer.status)).toEqual(health.map(() => 200));
    expect(plan.status).toBe(200);
    expect(plan.body.step).toBe(first + 1);
    expect((plan.body.skipped as unknown[]).length).toBe(STEPS_KEPT - 1);
    expect((plan.body.sources as { rank: number; tier: string }[]).filter((source) => source.tier === 'remote').map((source) => source.rank)).toEqual(
      Array.from({ length: 16 }, (_, rank) => rank),
    );

    // Asked eight times at once, the controller makes one plan of the job at a time: each plan's
    // reads of the job's steps (Redis MONITOR shows them) end before the next plan's begin.
    const key = store.keys.jobCheckpoints('gpt');
    const reads: string[] = [];
    const monitor = await store.redis.monitor();
    monitor.on('monitor', (_time: string, args: string[]) => {
      if (args[1] === key && args[0]?.toLowerCase() === 'zrevrangebyscore') reads.push(args[2] === '+inf' ? 'start' : 'step');
    });
    try {
      const again = await Promise.all(Array.from({ length: 8 }, () => get('/api/v1/jobs/gpt/restore-plan?evicted=n00,n01,n02,n03', AGENT)));
      expect(again.map((answer) => [answer.status, answer.body.step])).toEqual(again.map(() => [200, first + 1]));
      await until(
        'every read of the eight plans seen',
        async () => reads.length,
        (count) => count >= 8 * STEPS_KEPT,
      );
    } finally {
      monitor.disconnect();
    }
    // Each plan looks for its first step, then for the 63 below it: 64 lookups, one plan after another.
    const onePlan = ['start', ...Array.from({ length: STEPS_KEPT - 1 }, () => 'step')];
    expect(reads).toEqual(Array.from({ length: 8 }, () => onePlan).flat());
  });
});
