import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../../controller/service.js';
import { TEST_TOKEN, agentToken, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * A hot-swap job over HTTP: its spec's validation, the world its ranks read and report to (scope
 * `training`: members and spares, each only as itself), stale epochs, what a node can keep in
 * Redis, and a swap done, failed or past its bound as the ladder hears it.
 */

const JOB = {
  name: 'hs',
  nodes: ['h0', 'h1', 'h2', 'h3'],
  ranksPerNode: 1,
  launcher: 'accept',
  codeVersion: 'v1',
  hotSwap: { spares: ['h4', 'h5'], timeoutSeconds: 5 },
};

async function get(url: string, token = TEST_TOKEN): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(url, { headers: { authorization: `Bearer ${token}` } });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe('the hot-swap world over HTTP', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    // Three nodes of this 4-node job leave it within the hour: two swaps, then a spare that never came.
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { safety: { maxJobEvictionPercent: 100 } })));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it("refuses spares that are repeated, in the job's nodes or busy in another job, naming the field", async () => {
    const twice = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'twice', nodes: ['t0'], hotSwap: { spares: ['t1', 't1'] } });
    expect(twice.status).toBe(400);
    expect(twice.body.error).toMatch(/hotSwap\.spares.*t1 is listed twice/);
    const inside = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'inside', nodes: ['i0', 'i1'], hotSwap: { spares: ['i1'] } });
    expect(inside.status).toBe(400);
    expect(inside.body.error).toBe('job.hotSwap.spares: i1 is in job.nodes; a spare is a node of the allocation outside them');
    const bound = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'bound', nodes: ['b0'], hotSwap: { spares: ['b1'], timeoutSeconds: 2 } });
    expect(bound.status).toBe(400);
    expect(bound.body.error).toContain('hotSwap.timeoutSeconds');
    const none = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'none', nodes: ['e0'], hotSwap: { spares: [] } });
    expect(none).toMatchObject({ status: 400, body: { error: 'job.hotSwap.spares: a registration names at least one spare' } });
    expect((await post(`${url}/api/v1/jobs`, { ...JOB, name: 'owner', nodes: ['o0'], hotSwap: undefined })).status).toBe(201);
    const busy = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'busy', nodes: ['o1'], hotSwap: { spares: ['o0'] } });
    expect(busy.status).toBe(409);
    expect(busy.body.error).toContain('o0 belongs to job owner');
  });

  it("registers the job with its spares and shows the world at epoch 0 in GET /jobs/:id and to a spare's agent", async () => {
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    const one = await get(`${url}/api/v1/jobs/hs`);
    expect(one.body).toMatchObject({ job: { spec: { hotSwap: { spares: ['h4', 'h5'], timeoutSeconds: 5 } } }, world: { epoch: 0, state: 'steady' } });
    const world = await get(`${url}/api/v1/jobs/hs/world`, agentToken('h4'));
    expect(world.status).toBe(200);
    expect(world.body).toEqual({
      job: 'hs',
      epoch: 0,
      state: 'steady',
      shards: [0, 1, 2, 3].map((shard) => ({ shard, node: `h${shard}` })),
      spares: ['h4', 'h5'],
      replicas: expect.any(Array),
      swap: null,
    });
    expect((world.body.replicas as { shard: number; holders: number[] }[]).map((entry) => entry.holders.length)).toEqual([1, 1, 1, 1]);
    // A spare's agent may call the job's other training routes too; a stranger's may not.
    expect((await get(`${url}/api/v1/jobs/hs/restore-plan`, agentToken('h5'))).status).toBe(409);
    const stranger = await get(`${url}/api/v1/jobs/hs/world`, agentToken('x9'));
    expect(stranger.status).toBe(403);
    expect((await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, node: 'x9', event: 'spare' }, agentToken('x9'))).status).toBe(403);
  });

  it("takes a rank's report only as its own node, for a shard it holds, in the open epoch", async () => {
    expect(
      await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 1, node: 'h1', event: 'stepped', step: 3, stepSeconds: 0.2 }, agentToken('h1')),
    ).toMatchObject({ status: 202, body: { accepted: true } });
    expect(await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, node: 'h4', event: 'spare' }, agentToken('h4'))).toMatchObject({ status: 202 });
    const asOther = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 2, node: 'h2', event: 'joined' }, agentToken('h1'));
    expect(asOther.status).toBe(403);
    const notHeld = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 2, node: 'h1', event: 'joined' }, agentToken('h1'));
    expect(notHeld).toMatchObject({ status: 400, body: { error: 'invalid world report: shard: shard 2 is on h2 in epoch 0, not on h1' } });
    const notSpare = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, node: 'h1', event: 'spare' }, agentToken('h1'));
    expect(notSpare.body.error).toMatch(/^invalid world report: node: h1 is not a spare/);
    const badField = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 1, node: 'h1', event: 'rebooted' }, agentToken('h1'));
    expect(badField.status).toBe(400);
    expect(badField.body.error).toContain('event');
    const noShard = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, node: 'h1', event: 'joined' }, agentToken('h1'));
    expect(noShard.body.error).toContain('shard');
    const longDetail = await post(
      `${url}/api/v1/jobs/hs/world`,
      { epoch: 0, shard: 1, node: 'h1', event: 'failed', detail: 'x'.repeat(600) },
      agentToken('h1'),
    );
    expect(longDetail.body.error).toContain('detail');
    const ahead = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 7, shard: 1, node: 'h1', event: 'joined' }, agentToken('h1'));
    expect(ahead).toMatchObject({ status: 400, body: { error: 'invalid world report: epoch: 7 is not open; job hs is in epoch 0' } });
  });

  it('keeps one report per shard and spare however often a node reports', async () => {
    for (let step = 0; step < 50; step += 1)
      expect(
        (await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 1, node: 'h1', event: 'stepped', step, stepSeconds: 0.2 }, agentToken('h1'))).status,
      ).toBe(202);
    expect(await store.redis.hlen(store.keys.jobWorldReports('hs'))).toBe(2);
    expect(JSON.parse((await store.redis.hget(store.keys.jobWorld('hs'), 'stepSeconds')) ?? '[]')).toHaveLength(32);
  });

  it('swaps a spare in for a fatal Xid, finishes when every shard stepped, answers 409 to the old epoch', async () => {
    const xid = { kind: 'xid', node: 'h1', gpu: '0000:18:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
    expect((await post(`${url}/api/v1/signals`, xid)).status).toBe(202);
    const world = await until(
      "the swap's epoch open",
      () => get(`${url}/api/v1/jobs/hs/world`, agentToken('h4')),
      (answer) => answer.body.state === 'swapping',
    );
    expect(world.body).toMatchObject({ epoch: 1, swap: { epoch: 1, replaced: { h1: 'h4' } }, spares: ['h5'] });
    expect((world.body.shards as { node: string }[]).map((shard) => shard.node)).toEqual(['h0', 'h4', 'h2', 'h3']);
    const stale = await post(`${url}/api/v1/jobs/hs/world`, { epoch: 0, shard: 0, node: 'h0', event: 'stepped', step: 9 }, agentToken('h0'));
    expect(stale.status).toBe(409);
    await until(
      'the failed node out of the job',
      () => controller.jobs.get('hs'),
      (record) => record.spec.nodes.includes('h4'),
    );
    for (const [shard, node] of [
      [0, 'h0'],
      [1, 'h4'],
      [2, 'h2'],
      [3, 'h3'],
    ] as const) {
      expect((await post(`${url}/api/v1/jobs/hs/world`, { epoch: 1, shard, node, event: 'stepped', step: 41 }, agentToken(node))).status).toBe(202);
    }
    await until(
      'the job running again',
      () => controller.jobs.get('hs'),
      (record) => record.state === 'running',
    );
    const audit = (await controller.audit.read({ limit: 200 })).map((entry) => entry.summary);
    expect(audit.some((line) => /^hs: notify — hot swap done: epoch 1, h4 in place of h1, first step 41 in \d+\.\d s/.test(line))).toBe(true);
    expect(audit.some((line) => /^hs: stop/.test(line))).toBe(false);
    expect((await get(`${url}/api/v1/jobs/hs`)).body.world).toEqual({ epoch: 1, state: 'steady' });
  });

  it('falls back to stop and relaunch when the swap passes its bound, and the relaunch starts a new epoch', async () => {
    // One warm standby: it stays for the fallback's eviction rather than become a spare.
    await store.redis.sadd(store.keys.dryRunStandbys(), 'h9');
    const xid = { kind: 'xid', node: 'h2', gpu: '0000:18:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
    expect((await post(`${url}/api/v1/signals`, xid)).status).toBe(202);
    await until(
      "the swap's epoch open",
      () => controller.jobs.world.summary('hs'),
      (world) => world.state === 'swapping',
    );
    // No rank reports: the bound (5 s) passes, a recovery tick notices it.
    const audit = await until(
      'the fallback relaunched',
      async () => (await controller.audit.read({ limit: 300 })).map((entry) => entry.summary),
      (lines) => lines.some((line) => /^hs: restart: done/.test(line)),
      30_000,
    );
    expect(
      audit.some((line) =>
        /^hs: stop — hot swap of h2 failed \(not done within its bound of 5 s: shards 0, 1, 2, 3 had not stepped in epoch 2\); falling back to stop and relaunch/.test(
          line,
        ),
      ),
    ).toBe(true);
    // Its spare never said a word in the epoch: it is evicted with the fallback, a standby in its place.
    expect(audit.some((line) => /^hs: evict h\d — hot swap of h2 failed/.test(line))).toBe(true);
    const world = await controller.jobs.world.summary('hs');
    expect(world.state).toBe('steady');
    expect(world.epoch).toBeGreaterThan(2);
  }, 40_000);
});
