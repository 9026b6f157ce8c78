import { Queue } from 'bullmq';
import { afterAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES, queueJobOptions } from '../../core/queues.js';
import { retentionFromBudget } from '../../core/retention.js';
import { intakeConnection } from '../../core/redis.js';
import type { Signal } from '../../core/signal.js';
import { IntakeBatcher } from '../../controller/intake-batch.js';
import { SignalIntake } from '../../controller/intake.js';
import { testRedis } from '../support/redis.js';
import { storedSignals } from '../support/stored-signals.js';

/** Requests that arrive together are stored in one write, each answered only once it is stored, and a failed write fails them all. */

function signal(index: number): Signal {
  return {
    id: `s-batch-${index}`,
    kind: 'alert',
    node: `n${index}`,
    severity: 'warning',
    time: '2026-11-21T10:00:00.000Z',
    receivedAt: '2026-11-21T10:00:01.000Z',
    fingerprint: `alert/n${index}/-/batch`,
    source: 'alertmanager',
    evidence: { alertname: 'BatchCheck' },
  };
}

describe('intake batching on a real Redis', () => {
  const store = testRedis();
  const connection = intakeConnection(store.url);
  const intake = new SignalIntake(connection, store.prefix, {
    jobOptions: queueJobOptions(retentionFromBudget(64)).signals,
    replicaMarker: store.keys.intakeReplicaMarker,
    seen: { key: store.keys.intakeSeenSignals, windowSeconds: 86_400, maxIds: 10_000 },
  });
  const signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
  afterAll(async () => {
    await signals.close();
    await intake.close();
    connection.disconnect();
    await store.cleanup();
  });

  it('stores the signals of requests made in one turn with one write, and answers each once its signals are in Redis', async () => {
    await new Promise<void>((resolve) => (connection.status === 'ready' ? resolve() : connection.once('ready', () => resolve())));
    const writes: number[] = [];
    const batcher = new IntakeBatcher(async (batch) => {
      writes.push(batch.length);
      await intake.enqueue(batch);
    });
    await Promise.all(Array.from({ length: 20 }, (_, index) => batcher.enqueue([signal(index)])));
    expect(writes).toEqual([20]);
    const { byId } = await storedSignals(signals);
    for (let index = 0; index < 20; index += 1) expect(byId.get(`s-batch-${index}`)).toEqual(signal(index));
  });

  it('stores a request at the batch size on its own and starts a new batch past it', async () => {
    const writes: number[] = [];
    const batcher = new IntakeBatcher(async (batch) => {
      writes.push(batch.length);
      await intake.enqueue(batch);
    }, 5);
    await Promise.all([
      batcher.enqueue([signal(100), signal(101), signal(102)]),
      batcher.enqueue([signal(103), signal(104), signal(105)]),
      batcher.enqueue([100, 101, 102, 103, 104].map((index) => signal(index + 10))),
    ]);
    expect(writes.sort()).toEqual([3, 3, 5]);
  });

  it('stores a signal two requests of one batch both carry once, and answers both (an Alertmanager pair sends each alert twice)', async () => {
    const batcher = new IntakeBatcher((batch) => intake.enqueue(batch));
    const before = await storedSignals(signals);
    await Promise.all([batcher.enqueue([signal(300)]), batcher.enqueue([signal(300), signal(301)])]);
    const after = await storedSignals(signals);
    expect(after.copies).toBe(before.copies + 2);
    expect(after.byId.get('s-batch-300')).toEqual(signal(300));
  });

  it('fails every request of a batch whose write fails, so each sender retries', async () => {
    const batcher = new IntakeBatcher(() => Promise.reject(new Error('Redis went away')));
    const answers = await Promise.allSettled([batcher.enqueue([signal(200)]), batcher.enqueue([signal(201)])]);
    expect(answers.map((answer) => answer.status)).toEqual(['rejected', 'rejected']);
  });
});
