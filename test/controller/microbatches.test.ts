import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { JobStore } from '../../controller/job-store.js';
import { MicrobatchBoard } from '../../controller/microbatches.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

// 8 ranks: tp 1, pp 2, dp 4 → four DP groups; 16 micro-batches per iteration, multiples of PP = 2.
const JOB = {
  name: 'gpt-mb',
  nodes: ['m00', 'm01', 'm02', 'm03', 'm04', 'm05', 'm06', 'm07'],
  ranksPerNode: 1,
  topology: { tp: 1, pp: 2, dp: 4, order: 'tp-dp-pp' },
  launcher: 'accept',
  codeVersion: 'v1',
  microbatches: { perIteration: 16, multipleOf: 2 },
};

async function get(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(url, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe('GET /api/v1/jobs/:id/microbatches', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let board: MicrobatchBoard;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix), { workers: false }));
    board = new MicrobatchBoard(store.redis, store.keys, new JobStore(store.redis, store.keys));
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('serves an even split across the DP groups before any rebalance', async () => {
    const answer = await get(`${url}/api/v1/jobs/gpt-mb/microbatches`);
    expect(answer.status).toBe(200);
    expect(answer.body).toMatchObject({ job: 'gpt-mb', microbatches: 16, dpGroups: 4, assignment: [4, 4, 4, 4], strategy: 'even', revision: 0 });
  });

  it('serves a rebalanced plan that gives the slow group less, in multiples of the pipeline depth, with a new revision', async () => {
    // DP group 2 takes twice as long per micro-batch: the even split would take 4 × 2 = 8 s.
    await board.rebalance('gpt-mb', [1, 1, 2, 1], 'DP group 2 slow by 100%');
    const answer = await get(`${url}/api/v1/jobs/gpt-mb/microbatches`);
    expect(answer.body).toMatchObject({ strategy: 'rebalanced', revision: 1, reason: 'DP group 2 slow by 100%', iterationSeconds: 6 });
    const assignment = answer.body.assignment as number[];
    expect(assignment[2]).toBe(2);
    expect(assignment.reduce((sum, m) => sum + m, 0)).toBe(16);
    expect(assignment.every((m) => m % 2 === 0 && m >= 2 && m <= 6)).toBe(true);
    await board.reset('gpt-mb', 'slowdown over');
    expect((await get(`${url}/api/v1/jobs/gpt-mb/microbatches`)).body).toMatchObject({ assignment: [4, 4, 4, 4], strategy: 'even', revision: 2 });
  });

  it('answers 400 for a job registered without a micro-batch count and 404 for an unknown job', async () => {
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'no-mb', nodes: JOB.nodes.map((node) => `other-${node}`), microbatches: undefined })).status).toBe(
      201,
    );
    const none = await get(`${url}/api/v1/jobs/no-mb/microbatches`);
    expect(none.status).toBe(400);
    expect(none.body.error).toMatch(/registered without microbatches.perIteration/);
    expect((await get(`${url}/api/v1/jobs/nope/microbatches`)).status).toBe(404);
  });

  it('refuses to register a micro-batch count the DP groups cannot share', async () => {
    const bad = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'bad-mb', microbatches: { perIteration: 6, multipleOf: 2 } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/perIteration 6 must be a multiple of 2 and give each of the 4 DP groups at least 2/);
  });
});
