import { afterEach, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { LLAMA as JOB } from '../support/steps.js';
import { until } from '../support/until.js';

/**
 * The restore plan a relaunch records (actuators/steps/restart.ts) asks the backend about the
 * job's own nodes only: a copy held by a node outside the job is lost without asking. Before, it
 * asked once per distinct holder name the stored copies carried, so copies kept before holders
 * were checked could make every relaunch ask the scheduler thousands of times.
 */
describe('the restore plan of a relaunch on the real controller', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  it('asks the backend about no holder outside the job, and plans from the copies of the job nodes', async () => {
    const store = testRedis();
    stores.push(store);
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    controllers.push(controller);
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.backend.holdStandby('spare-1');
    // Copies as a store written before holders were checked keeps them: 2,000 holders no job has.
    const key = store.keys.jobCheckpoints('llama');
    const kept = store.redis.multi();
    for (let index = 0; index < 2000; index += 1) kept.zadd(key, '60', JSON.stringify({ step: 60, rank: index % 4, tier: 'peer', holder: `planted-${index}` }));
    for (const [rank, node] of JOB.nodes.entries()) kept.zadd(key, '50', JSON.stringify({ step: 50, rank, tier: 'host', holder: node }));
    await kept.exec();

    const asked: string[] = [];
    const nodeState = controller.backend.nodeState.bind(controller.backend);
    controller.backend.nodeState = async (node) => {
      asked.push(node);
      return nodeState(node);
    };
    await post(`${url}/api/v1/signals`, {
      kind: 'xid',
      node: 'n01',
      gpu: '0000:18:00',
      xid: 79,
      message: 'GPU has fallen off the bus.',
      time: new Date().toISOString(),
    });
    const entries = await until(
      'restore plan recorded',
      () => controller.audit.read({ type: 'action', limit: 100 }),
      (read) => read.some((entry) => entry.summary.includes('restore plan')),
    );
    // n01's copy went with n01; its rank runs on spare-1 now and finds no copy of step 50, and step 60's holders are gone.
    expect(entries.find((entry) => entry.summary.includes('restore plan'))?.summary).toBe(
      'llama: restore plan: no checkpoint step survives the evictions: the job restarts from its last persistent checkpoint',
    );
    expect(asked.filter((node) => node.startsWith('planted-'))).toEqual([]);
  });
});
