import { afterAll, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import type { Controller } from '../../../controller/service.js';
import { agentToken, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * An agent sends a fault when it sees it; what its kernel log held when it started is counted,
 * never sent. A fault dated a day or more before it arrives is refused and drains nothing; the
 * rest of its batch is taken. A fault dated more than ten minutes after it arrives comes from a
 * clock running fast: it is real news, dated at its arrival, its own time kept as evidence.
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

  it('refuses an Xid dated 2001, naming the time field, and drains nothing; takes one dated an hour ahead at its arrival; takes the fresh fault of a mixed batch', async () => {
    const started = await startController(testConfig(store.url, store.prefix));
    controller = started.controller;
    const backend = new DryRunBackend(store.redis, store.keys);
    const url = `${started.url}/api/v1/signals`;

    const ancient = await post(url, xid('ft-1', '2001-09-09T01:46:40.000Z'), agentToken('ft-1'));
    expect(ancient.status).toBe(400);
    expect(ancient.body.error).toBe(
      'invalid fast-path event: time: 2001-09-09T01:46:40.000Z is more than 24 h before the event arrived: an agent sends a fault when it sees it',
    );

    // A node whose clock runs an hour fast still has its GPU drained, the fault dated when it came.
    const sent = Date.now();
    const ahead = new Date(sent + HOUR).toISOString();
    const future = await post(url, [xid('ft-4', ahead)], agentToken('ft-4'));
    expect(future.status).toBe(202);
    await until(
      'ft-4 drained',
      () => backend.recorded(),
      (nodes) => 'ft-4' in nodes,
    );
    const [signal] = (await started.controller.audit.read({ type: 'signal', node: 'ft-4', limit: 10 })).map(
      (entry) => (entry.data as { signal: { time: string; evidence: Record<string, unknown> } }).signal,
    );
    expect(signal?.evidence.reportedTime).toBe(ahead);
    expect(Date.parse(signal?.time ?? '')).toBeGreaterThanOrEqual(sent - 1000);
    expect(Date.parse(signal?.time ?? '')).toBeLessThan(sent + HOUR / 2);

    // A day-old Xid beside a fresh GPU loss: the loss is stored and drains the node, the Xid is refused by index.
    const mixed = await post(
      url,
      [
        xid('ft-2', new Date(Date.now() - 25 * HOUR).toISOString()),
        { kind: 'gpu_lost', node: 'ft-2', gpu: '0000:3b:00', message: 'gone', time: new Date().toISOString() },
      ],
      agentToken('ft-2'),
    );
    expect(mixed.status).toBe(202);
    expect(mixed.body).toMatchObject({
      accepted: 1,
      refused: [{ index: 0, reason: expect.stringMatching(/^0\.time: .* is more than 24 h before the event arrived/) }],
    });
    await until(
      'ft-2 drained for the GPU loss',
      () => backend.recorded(),
      (nodes) => 'ft-2' in nodes,
    );
    expect((await backend.recorded())['ft-2']).toMatch(/^steadfast: GPU 0000:3b:00 is lost/);

    // A fault an hour old (delivered late, after an outage) is still news.
    expect((await post(url, xid('ft-3', new Date(Date.now() - HOUR).toISOString()), agentToken('ft-3'))).status).toBe(202);
    await until(
      'ft-3 drained',
      () => backend.recorded(),
      (nodes) => 'ft-3' in nodes,
    );
    const audited = await started.controller.audit.read({ type: 'signal', limit: 100 });
    expect(audited.filter((entry) => entry.node === 'ft-1')).toEqual([]);
    expect(audited.filter((entry) => entry.node === 'ft-2').map((entry) => entry.summary)).toEqual([expect.stringMatching(/^agent reports gpu_lost on ft-2/)]);
  });
});
