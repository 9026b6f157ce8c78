import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../../controller/service.js';
import { post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';

/**
 * A registration names each node once: a node listed twice in `nodes` (or in a sizes topology's
 * own `nodes`) was accepted, and the job then counted, launched and placed ranks on it twice.
 * Several ranks on one node stay valid, each with its own local rank.
 */

const JOB = { name: 'twice', nodes: ['n00', 'n01'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' };

describe('job registration on the real controller', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix), { workers: false }));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('refuses a node listed twice in nodes, naming the field and the node, and registers nothing', async () => {
    const answer = await post(`${url}/api/v1/jobs`, { ...JOB, nodes: ['n00', 'n01', 'n00'] });
    expect(answer.status).toBe(400);
    expect(answer.body.error).toBe('invalid job: nodes.2: n00 is listed twice (first at index 0)');
    expect(await controller.jobs.list()).toEqual([]);
    expect(await controller.jobs.jobOnNode('n00')).toBeUndefined();
  });

  it('refuses a node listed twice in a sizes topology, and two ranks of a rank table on one GPU of a node', async () => {
    const sizes = await post(`${url}/api/v1/jobs`, {
      ...JOB,
      name: 'twice-sizes',
      nodes: ['p00', 'p01', 'p02', 'p03'],
      topology: { nodes: ['p00', 'p01', 'p00', 'p03'], ranksPerNode: 1, dp: 4 },
    });
    expect(sizes.status).toBe(400);
    expect(sizes.body.error).toBe('topology.nodes.2: p00 is listed twice (first at index 0)');
    const table = await post(`${url}/api/v1/jobs`, {
      ...JOB,
      name: 'twice-table',
      nodes: ['q00', 'q01'],
      ranksPerNode: 2,
      topology: {
        ranks: [
          { rank: 0, node: 'q00', localRank: 0 },
          { rank: 1, node: 'q00', localRank: 0 },
          { rank: 2, node: 'q01' },
          { rank: 3, node: 'q01' },
        ],
      },
    });
    expect(table.status).toBe(400);
    expect(table.body.error).toBe('topology.ranks: rank 1 has local rank 0 on q00, as rank 0 does');
    expect((await controller.jobs.list()).map((job) => job.spec.name)).not.toContain('twice-sizes');
    expect((await controller.jobs.list()).map((job) => job.spec.name)).not.toContain('twice-table');
  });

  it('still registers several ranks on each node, by sizes or by a rank table', async () => {
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'sizes', nodes: ['m00', 'm01'], ranksPerNode: 4, topology: { tp: 4, dp: 2 } })).status).toBe(201);
    const ranks = [0, 1, 2, 3].map((rank) => ({ rank, node: rank < 2 ? 'k00' : 'k01', dp: rank % 2 }));
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'table', nodes: ['k00', 'k01'], ranksPerNode: 2, topology: { ranks } })).status).toBe(201);
  });
});
