import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StoreUnavailableError } from '../../core/errors.js';
import { QUEUE_NAMES, queueJobOptions } from '../../core/queues.js';
import { retentionFromBudget } from '../../core/retention.js';
import { Keys, intakeConnection, workerConnection, type Redis } from '../../core/redis.js';
import type { Signal } from '../../core/signal.js';
import { SignalIntake } from '../../controller/intake.js';
import { startRedis, type RedisPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { signal } from '../support/signal.js';
import { storedSignals } from '../support/stored-signals.js';

/**
 * The intake promises all of a request's signals or none: a 503 must not leave part of the
 * batch stored (the sender retries the whole batch, and its already-stored part would then be
 * a silent half answer). Redis is SIGKILLed and restarted (AOF, fsync always) under a stream of
 * 50-signal batches; every batch that failed must be stored wholly or not at all, and a retry
 * of each failed batch must converge on every signal stored once.
 */

const PREFIX = 'atomic';
const BATCH = 50;

function batch(round: number, index: number): Signal[] {
  return Array.from({ length: BATCH }, (_, item) =>
    signal({ kind: 'xid', id: `s-${round}-${index}-${item}`, fingerprint: `xid/node-${item}/-/79`, evidence: { message: 'x'.repeat(600), xid: 79 } }),
  );
}

describe('a batch of signals when Redis dies under it', () => {
  const group = new ProcessGroup();
  let root: string;
  let redis: RedisPart;
  let intake: SignalIntake;
  let intakeRedis: Redis;
  let reader: Redis;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'steadfast-atomic-'));
    redis = await startRedis(group, root);
    intakeRedis = intakeConnection(redis.url);
    intakeRedis.on('error', () => undefined);
    intake = new SignalIntake(intakeRedis, PREFIX, {
      jobOptions: queueJobOptions(retentionFromBudget(64)).signals,
      replicaMarker: new Keys(PREFIX).intakeReplicaMarker,
      seen: { key: new Keys(PREFIX).intakeSeenSignals, windowSeconds: 86_400, maxIds: 10_000 },
    });
    reader = workerConnection(redis.url);
    reader.on('error', () => undefined);
  });

  afterAll(async () => {
    await intake?.close();
    intakeRedis?.disconnect();
    reader?.disconnect();
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  /** How many of `signals` are in the queue's jobs, by a snapshot of all of them. */
  async function storedCounter(): Promise<{ storedOf: (signals: readonly Signal[]) => number; copies: number }> {
    const queue = new Queue(QUEUE_NAMES.signals, { connection: reader, prefix: PREFIX });
    try {
      const { byId, copies } = await storedSignals(queue);
      return { storedOf: (signals) => signals.filter(({ id }) => byId.has(id)).length, copies };
    } finally {
      await queue.close();
    }
  }

  async function waitForIntake(): Promise<void> {
    while (intakeRedis.status !== 'ready') await sleep(50);
  }

  it('stores each failed batch wholly or not at all, and its retry stores every signal once', async () => {
    const failed: Signal[][] = [];
    const sent: Signal[][] = [];
    for (let round = 0; round < 3; round += 1) {
      await waitForIntake();
      let stop = false;
      // Twelve senders, each one batch in flight at a time, until Redis has been killed under them.
      const senders = Array.from({ length: 12 }, async (_, sender) => {
        for (let index = sender; !stop; index += 12) {
          const signals = batch(round, index);
          sent.push(signals);
          try {
            await intake.enqueue(signals);
          } catch (error) {
            if (!(error instanceof StoreUnavailableError)) throw error;
            failed.push(signals);
            await sleep(20);
          }
        }
      });
      await sleep(300);
      await group.stop('redis', 0, 'SIGKILL');
      await sleep(200);
      stop = true;
      await Promise.all(senders);
      redis = await startRedis(group, root, 'redis', redis.port);
    }
    await waitForIntake();

    expect(failed.length, 'the kills fell in the stream of batches').toBeGreaterThan(0);
    const partial: string[] = [];
    const afterKills = await storedCounter();
    for (const signals of failed) {
      const stored = afterKills.storedOf(signals);
      if (stored !== 0 && stored !== BATCH) partial.push(`${signals[0]?.id}: ${stored} of ${BATCH}`);
    }
    expect(partial, 'failed batches that left part of their signals stored').toEqual([]);

    for (const signals of failed) await intake.enqueue(signals);
    const answered = sent.filter((signals) => !failed.includes(signals));
    const afterRetries = await storedCounter();
    for (const signals of [...failed, ...answered]) expect(afterRetries.storedOf(signals)).toBe(BATCH);
    expect(afterRetries.copies, 'each signal is queued once').toBe(new Set(sent.flat().map(({ id }) => id)).size);
  }, 60_000);
});
