import { afterAll, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import type { Controller } from '../../../controller/service.js';
import { agentToken, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * An agent sends a fault when it sees it; what its kernel log held when it started is counted,
 * never sent. A fault dated a day or more before it arrives, or more than ten minutes after, is
 * refused and drains nothing; the rest of its batch is taken.
 */

const HOUR = 3600_000;

function xid(node: string, time: string, xidCode = 79): Record<string, unknown> {
  return { kind: 'xid', node, gpu: '0000:3b:00', xid: xidCode, message: 'NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.', time };
}

describe('fast-path faults dated far from their arrival', () => {
  const store = testRedis();
  let controller: Controller | undefined;
  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it('refuses an Xid dated 2001 or an hour ahead, naming the time field, and drains nothing; takes the fresh fault of a mixed batch', async () => {
    const started = await startController(testConfig(store.url, store.prefix));
    controller = started.controller;
    const backend = new DryRunBackend(store.redis, store.keys);
    const url = `${started.url}/api/v1/signals`;

    const ancient = await post(url, xid('ft-1', '2001-09-09T01:46:40.000Z'), agentToken('ft-1'));
    expect(ancient.status).toBe(400);
    expect(ancient.body.error).toBe('invalid fast-path event: time: 2001-09-09T01:46:40.000Z is more than 24 h before the event arrived: an agent sends a fault when it sees it');
    const ahead = new Date(Date.now() + HOUR).toISOString();
    const future = await post(url, [xid('ft-1', ahead)], agentToken('ft-1'));
    expect(future.status).toBe(400);
    expect(future.body.error).toBe(`invalid fast-path event: 0.time: ${ahead} is more than 10 minutes after the event arrived: the agent's clock runs ahead`);

    // A day-old Xid beside a fresh GPU loss: the loss is stored and drains the node, the Xid is refused by index.
    const mixed = await post(url, [xid('ft-2', new Date(Date.now() - 25 * HOUR).toISOString()), { kind: 'gpu_lost', node: 'ft-2', gpu: '0000:3b:00', message: 'gone', time: new Date().toISOString() }], agentToken('ft-2'));
    expect(mixed.status).toBe(202);
    expect(mixed.body).toMatchObject({ accepted: 1, refused: [{ index: 0, reason: expect.stringMatching(/^0\.time: .* is more than 24 h before the event arrived/) }] });
    await until('ft-2 drained for the GPU loss', () => backend.recorded(), (nodes) => 'ft-2' in nodes);
    expect((await backend.recorded())['ft-2']).toMatch(/^steadfast: GPU 0000:3b:00 is lost/);

    // A fault an hour old (delivered late, after an outage) is still news.
    expect((await post(url, xid('ft-3', new Date(Date.now() - HOUR).toISOString()), agentToken('ft-3'))).status).toBe(202);
    await until('ft-3 drained', () => backend.recorded(), (nodes) => 'ft-3' in nodes);
    const audited = await started.controller.audit.read({ type: 'signal', limit: 100 });
    expect(audited.filter((entry) => entry.node === 'ft-1')).toEqual([]);
    expect(audited.filter((entry) => entry.node === 'ft-2').map((entry) => entry.summary)).toEqual([expect.stringMatching(/^agent reports gpu_lost on ft-2/)]);
  });
});
