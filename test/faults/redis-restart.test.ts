import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { workerConnection, type Redis } from '../../core/redis.js';
import { Controller } from '../../controller/service.js';
import { ControlPlane } from '../../tryit/control-plane.js';
import { deliverUntilAccepted, sendStorm, stormCredential, stormRequests, waitForAnswered, waitForAudited, waitForDrains } from '../support/storm.js';

/**
 * Redis dies (SIGKILL) and comes back in the middle of an alert storm. It runs with AOF and
 * `appendfsync always` (tryit/parts.ts), and the intake answers 202 only once a request's signals
 * are stored: every signal that was ever answered 202 must reach the audit after the restart,
 * once, and the fatal ones must drain their node in Slurm exactly once. Senders retry whatever
 * was not answered 202 (503 while Redis is away), as Alertmanager and the agents do.
 */

const VICTIMS = Array.from({ length: 30 }, (_, index) => `r-${String(index + 1).padStart(2, '0')}`);
const BYSTANDERS = Array.from({ length: 10 }, (_, index) => `b-${String(index + 1).padStart(2, '0')}`);
const PREFIX = 'storm';

describe('Redis restarted in the middle of an alert storm', () => {
  let plane: ControlPlane;
  let controller: Controller;
  let url: string;
  let reader: Redis;

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: [...VICTIMS, ...BYSTANDERS], ownRedis: true });
    // A step taken just as Redis dies stalls and resumes within lockDuration + 2 × stalledInterval
    // (core/queues.ts): 30 + 60 s at BullMQ's defaults, longer than the drains are waited for here.
    controller = new Controller({
      config: plane.controllerConfig(PREFIX, { queues: { lockDurationSeconds: 5, stalledIntervalSeconds: 2 } }),
      logger: silentLogger(),
    });
    url = `http://127.0.0.1:${(await controller.start()).port}`;
    reader = workerConnection(plane.redisUrl);
    // It reconnects by itself once Redis is back; while it is away there is nothing to do.
    reader.on('error', () => undefined);
  }, 60_000);

  afterAll(async () => {
    reader?.disconnect();
    await controller?.close();
    await plane?.stop();
  });

  it('loses no signal it answered 202 for, and drains each faulty node once', async () => {
    const requests = stormRequests(url, 240, VICTIMS, BYSTANDERS, 2);
    // Eight senders work through the storm over about six seconds; Redis is killed once the first are answered.
    const deadline = Date.now() + 40_000;
    const { results, done } = sendStorm(requests, 8, 200, (request) =>
      deliverUntilAccepted(request, stormCredential(plane.credentials, request), deadline, 5000),
    );
    await waitForAnswered(results, 8);
    const sentBeforeCrash = results.length;
    await plane.crashRedis(1000);
    await done;

    const accepted = new Set(results.flatMap((result) => result.ids));
    const refusedDuringOutage = results.filter((result) => result.statuses.some((status) => status !== 202)).length;
    expect(results).toHaveLength(requests.length);
    expect(
      results.every((result) => result.ids.length > 0),
      'every request was eventually answered 202',
    ).toBe(true);
    // The crash did fall in the storm: requests were answered before it and some were turned away during it.
    expect(sentBeforeCrash).toBeGreaterThan(0);
    expect(refusedDuringOutage).toBeGreaterThan(0);

    const audited = await waitForAudited(reader, PREFIX, accepted, 60_000);
    expect(audited.missing, 'accepted signals that never reached the audit').toEqual([]);
    expect(new Set(audited.refs).size).toBe(audited.refs.length);

    const drains = await waitForDrains(() => plane.slurmDrainCounts(), VICTIMS);
    for (const node of VICTIMS) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    for (const node of BYSTANDERS) expect(drains.has(node), `${node} drained`).toBe(false);
  }, 120_000);
});
