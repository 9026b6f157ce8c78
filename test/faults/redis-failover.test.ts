import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import type { Config } from '../../core/config.js';
import { silentLogger } from '../../core/log.js';
import { Keys, workerConnection, type Redis } from '../../core/redis.js';
import { Controller } from '../../controller/service.js';
import { ControlPlane } from '../../tryit/control-plane.js';
import { deliverUntilAccepted, sendStorm, stormCredential, stormRequests, waitForAnswered, waitForAudited, waitForDrains } from '../support/storm.js';
import { RedisHa, SENTINEL_GROUP } from '../../tryit/redis-ha.js';

/**
 * The primary Redis dies (SIGKILL) in the middle of a storm of webhooks and fast-path signals;
 * three sentinels promote its replica, and the controller, pointed at the sentinels, follows.
 * The controller acknowledges only writes a replica confirmed (WAIT, redis.minReplicasAcked 1),
 * so every request answered 202 must have all its signals audited and acted on after the
 * failover. Whatever was not answered 202 was answered 503, and the test's senders retry it as
 * Alertmanager and the agents do.
 */

const VICTIMS = Array.from({ length: 20 }, (_, index) => `f-${String(index + 1).padStart(2, '0')}`);
const BYSTANDERS = Array.from({ length: 10 }, (_, index) => `g-${String(index + 1).padStart(2, '0')}`);
const PREFIX = 'failover';

describe('the primary Redis killed mid-storm, a replica promoted by the sentinels', () => {
  let plane: ControlPlane;
  let ha: RedisHa;
  let controller: Controller;
  let url: string;
  let reader: Redis;
  let redisSettings: Config['redis'];

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: [...VICTIMS, ...BYSTANDERS], redisUrl: 'redis://127.0.0.1:1' });
    ha = await RedisHa.start(plane.processes, plane.root, { replicas: 1, sentinels: 3, downAfterMs: 1000 });
    const config = plane.controllerConfig(PREFIX);
    redisSettings = { ...config.redis, sentinels: ha.sentinels, name: SENTINEL_GROUP, minReplicasAcked: 1, replicaAckTimeoutMs: 500 };
    controller = new Controller({ config: { ...config, redis: redisSettings }, logger: silentLogger() });
    url = `http://127.0.0.1:${(await controller.start()).port}`;
    reader = workerConnection(redisSettings);
    // It follows the sentinels to the new primary by itself; in between there is nothing to do.
    reader.on('error', () => undefined);
  }, 60_000);

  afterAll(async () => {
    reader?.disconnect();
    await controller?.close();
    await plane?.stop();
  });

  it('loses no signal it answered 202 for, answers 503 otherwise, and drains each faulty node once', async () => {
    const requests = stormRequests(url, 160, VICTIMS, BYSTANDERS, 4);
    // Six senders work through the storm; the primary is killed once the first requests are in. They retry for as
    // long as the sentinels may take to promote a replica and bring the old primary back.
    const deadline = Date.now() + ha.promotionDeadlineMs + ha.rejoinDeadlineMs;
    const { results, done } = sendStorm(requests, 6, 150, (request) =>
      deliverUntilAccepted(request, stormCredential(plane.credentials, request), deadline, 10_000),
    );
    await waitForAnswered(results, 6);
    const answeredBeforeKill = results.length;
    const { from, to } = await ha.failover();
    await done;

    expect(to).not.toBe(from);
    expect(answeredBeforeKill, 'requests answered before the kill').toBeGreaterThan(0);
    expect(results).toHaveLength(requests.length);
    expect(
      results.every((result) => result.ids.length > 0),
      'every request was eventually answered 202',
    ).toBe(true);
    const refusals = results.flatMap((result) => result.statuses.filter((status) => status !== 202));
    expect(refusals.length, 'requests turned away during the failover').toBeGreaterThan(0);
    expect(new Set(refusals), 'how requests were turned away').toEqual(new Set([503]));

    const accepted = new Set(results.flatMap((result) => result.ids));
    const audited = await waitForAudited(reader, PREFIX, accepted, 30_000);
    expect(audited.missing, 'accepted signals that never reached the audit').toEqual([]);
    expect(new Set(audited.refs).size).toBe(audited.refs.length);

    const drains = await waitForDrains(() => plane.slurmDrainCounts(), VICTIMS);
    for (const node of VICTIMS) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    for (const node of BYSTANDERS) expect(drains.has(node), `${node} drained`).toBe(false);
    // A backstop only: every wait above has its own deadline, taken from the sentinels' settings.
  }, 180_000);

  it('answers 503 with Retry-After while no replica confirms a write, and stores the retry once a replica is back', async () => {
    const event = { kind: 'xid', node: 'g-01', gpu: '0000:18:00', xid: 13, message: 'Graphics Exception', time: new Date().toISOString() };
    const post = (): Promise<Response> =>
      fetch(`${url}/api/v1/signals`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${plane.credentials.agentToken(event.node)}` },
        body: JSON.stringify(event),
      });
    await ha.killReplicas();
    const refused = await post();
    expect(refused.status).toBe(503);
    expect(refused.headers.get('retry-after')).toBe('5');
    expect(((await refused.json()) as { error: string }).error).toMatch(/0 of the 1 required replicas confirmed the write within 500 ms/);

    await ha.restartReplicas();
    const accepted = await post();
    expect(accepted.status).toBe(202);
    const [id] = ((await accepted.json()) as { ids: string[] }).ids;
    const audit = new AuditLog(reader, new Keys(PREFIX));
    const entries = await (async () => {
      for (const until = Date.now() + 15_000; ; await sleep(200)) {
        const found = await audit.read({ limit: 100, type: 'signal', ref: id });
        if (found.length > 0 || Date.now() > until) return found;
      }
    })();
    expect(entries, 'the signal refused, then retried, is audited once').toHaveLength(1);
  }, 60_000);
});
