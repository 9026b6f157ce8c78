import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES } from '../../core/queues.js';
import { workerConnection, type Redis } from '../../core/redis.js';
import type { Controller } from '../../controller/service.js';
import { startRedis } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { post, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { storedSignals } from '../support/stored-signals.js';

/**
 * A Redis that is connected but slow to answer (here: busy with a long script for 4 s, past the
 * intake's 3 s deadline) must not make the controller answer 503 for signals it then goes on to
 * store: the intake waits for the store while the connection stays up, and answers 202.
 */

/** Keeps Redis busy for `ms` milliseconds (a script blocks every other client until it ends). */
const BUSY = `
local started = redis.call('TIME')
local start = started[1] * 1000 + math.floor(started[2] / 1000)
while true do
  local now = redis.call('TIME')
  if now[1] * 1000 + math.floor(now[2] / 1000) - start >= tonumber(ARGV[1]) then return 1 end
end
`;

describe('a slow but connected Redis', () => {
  const group = new ProcessGroup();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-slow-redis-'));
  let controller: Controller;
  let url: string;
  let busy: Redis;
  let signals: Queue;

  beforeAll(async () => {
    const redis = await startRedis(group, dir);
    ({ controller, url } = await startController(testConfig(redis.url, 'slow', { controller: { rateLimit: { requestsPerSecond: 0 } } }), { workers: false }));
    busy = workerConnection(redis.url);
    signals = new Queue(QUEUE_NAMES.signals, { connection: workerConnection(redis.url), prefix: 'slow' });
  }, 60_000);

  afterAll(async () => {
    await signals.close();
    busy.disconnect();
    await controller.close();
    await group.stopAll();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers 202 once the signals are stored, not 503 while they are still on their way', async () => {
    const payload = xidAlertPayload({ groupKey: 'slow-redis' });
    const blocked = busy.eval(BUSY, 0, '4000');
    // Let the script start before the webhook arrives.
    await new Promise((resolve) => setTimeout(resolve, 200));
    const started = Date.now();
    const answer = await post(`${url}/api/v1/alerts`, payload);
    await blocked;
    // The store really was held past the intake's 3 s deadline, or this would prove nothing.
    expect(Date.now() - started).toBeGreaterThan(3000);
    expect(answer.status).toBe(202);
    const { byId } = await storedSignals(signals);
    for (const id of answer.body.ids ?? []) expect(byId.has(id), id).toBe(true);
    expect(answer.body.ids).toHaveLength(1);
  }, 30_000);
});
