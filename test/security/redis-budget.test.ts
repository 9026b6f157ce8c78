import { readdir, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES, queueJobOptions } from '../../core/queues.js';
import { retentionFromBudget } from '../../core/retention.js';
import type { Controller } from '../../controller/service.js';
import { LABELS_MAX, LABEL_VALUE_MAX_BYTES } from '../../controller/intake/alertmanager.js';
import { ALERTMANAGER_TOKEN, agentToken, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * What senders choose the size of stays within redis.retentionBudgetMB: an agent's events whose
 * messages are control characters (stored six bytes a character as JSON) and Alertmanager alerts
 * with as many and as long labels as the intake takes make signal jobs four times the size the
 * job count was sized for, yet the finished ones Redis keeps measure (MEMORY USAGE) within the
 * signals' share, and everything under the controller's prefix within the budget. Alerts past the
 * label bounds are refused by name; the real webhooks are taken whole.
 */

const BUDGET_MB = 4;
/** Finished signal jobs may take 40 % of the budget (docs/limits.md, Redis memory). */
const SIGNALS_SHARE = 0.4 * BUDGET_MB * 1024 * 1024;
const WEBHOOKS = join(import.meta.dirname, '..', 'fixtures', 'realworld', 'alertmanager-webhook');

describe('Redis bytes of signals whose size their senders choose', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { redis: { retentionBudgetMB: BUDGET_MB } })));
  });

  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  const queueKey = (part: string): string => `${store.prefix}:${QUEUE_NAMES.signals}:${part}`;

  async function memoryOf(key: string): Promise<number> {
    return (await store.redis.memory('USAGE', key, 'SAMPLES', '0')) ?? 0;
  }

  async function keptJobs(): Promise<{ jobs: number; bytes: number }> {
    const ids = [...(await store.redis.zrange(queueKey('completed'), '0', '-1')), ...(await store.redis.zrange(queueKey('failed'), '0', '-1'))];
    let bytes = 0;
    for (const id of ids) bytes += await memoryOf(queueKey(id));
    return { jobs: ids.length, bytes };
  }

  async function bytesUnderPrefix(): Promise<number> {
    let total = 0;
    let cursor = '0';
    do {
      const [next, keys] = await store.redis.scan(cursor, 'MATCH', `${store.prefix}:*`, 'COUNT', 1000);
      for (const key of keys) total += await memoryOf(key);
      cursor = next;
    } while (cursor !== '0');
    return total;
  }

  async function unfinished(): Promise<number> {
    return (await store.redis.llen(queueKey('wait'))) + (await store.redis.llen(queueKey('active'))) + (await store.redis.zcard(queueKey('delayed')));
  }

  it('keeps the finished jobs of control-character agent events and label-heavy alerts within their bytes of the budget', async () => {
    const start = Date.now() - 60_000;
    let stored = 0;
    for (let request = 0; request < 3; request += 1) {
      // The most an agent's request may carry: 100 events of 2,048 control characters (12 KiB each as JSON).
      const events = Array.from({ length: 100 }, (_, index) => ({
        kind: 'xid',
        node: 'node-1',
        gpu: '0000:3b:00',
        xid: 13,
        message: '\u0001'.repeat(2048),
        time: new Date(start + request * 1000 + index).toISOString(),
      }));
      const answer = await post(`${url}/api/v1/signals`, events, agentToken('node-1'));
      expect(answer.status, JSON.stringify(answer.body)).toBe(202);
      stored += 100;
    }
    for (let request = 0; request < 3; request += 1) {
      // Alerts at the label bounds: LABELS_MAX labels whose values take LABEL_VALUE_MAX_BYTES as stored.
      const alerts = Array.from({ length: 16 }, (_, index) => {
        const labels: Record<string, string> = { alertname: 'FleetLabelHeavy', node: `node-${index}` };
        while (Object.keys(labels).length < LABELS_MAX) labels[`extra_${Object.keys(labels).length}`] = '\u0001'.repeat(Math.floor(LABEL_VALUE_MAX_BYTES / 6));
        return {
          status: 'firing',
          labels,
          annotations: { summary: 'labels at their bounds' },
          startsAt: new Date(start + request * 1000 + index).toISOString(),
        };
      });
      const answer = await post(`${url}/api/v1/alerts`, { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts }, ALERTMANAGER_TOKEN);
      expect(answer.status, JSON.stringify(answer.body)).toBe(202);
      expect(answer.body.accepted).toBe(16);
      stored += 16;
    }
    expect(stored).toBe(348);
    // The job count was sized for 300 KiB jobs: it would keep five of these, about 6 MB.
    expect(retentionFromBudget(BUDGET_MB).signals.completed.count).toBe(5);
    await until('every signal job finished', unfinished, (left) => left === 0, 60_000);
    const kept = await until('the finished signal jobs within their share', keptJobs, ({ bytes }) => bytes <= SIGNALS_SHARE, 5_000);
    // The newest job is kept: the bound trims the oldest, not everything.
    expect(kept.jobs).toBeGreaterThanOrEqual(1);
    expect(await bytesUnderPrefix()).toBeLessThanOrEqual(BUDGET_MB * 1024 * 1024);
  }, 90_000);

  it('refuses an alert with more labels than it takes, or a label value too long, naming why, and takes the others of its webhook', async () => {
    const many: Record<string, string> = { alertname: 'FleetManyLabels' };
    for (let index = 0; index < 800; index += 1) many[`label_${index}`] = 'v'.repeat(4000);
    const alerts = [
      { labels: many, startsAt: '2026-11-21T10:00:00Z' },
      { labels: { alertname: 'FleetLongLabel', node: 'node-2', long: '\u0001'.repeat(200) }, startsAt: '2026-11-21T10:00:00Z' },
      { labels: { alertname: 'FleetFine', node: 'node-2' }, startsAt: '2026-11-21T10:00:00Z' },
    ];
    const answer = await post(`${url}/api/v1/alerts`, { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts }, ALERTMANAGER_TOKEN);
    expect(answer.status).toBe(202);
    expect(answer.body.accepted).toBe(1);
    const { refused } = answer.body as { refused?: { index: number; reason: string }[] };
    expect(refused).toEqual([
      { index: 0, reason: `alerts.0.labels: at most ${LABELS_MAX} labels are taken` },
      { index: 1, reason: `alerts.1.labels.long: must be at most ${LABEL_VALUE_MAX_BYTES} bytes as stored (a control character takes six)` },
    ]);
  });

  it('forgets the jobs BullMQ removed by count, so its ledger names exactly the finished jobs kept', async () => {
    const start = Date.now() - 30_000;
    for (let request = 0; request < 8; request += 1) {
      const alerts = [{ labels: { alertname: 'FleetSmall', node: 'node-4' }, startsAt: new Date(start + request).toISOString() }];
      expect(
        (await post(`${url}/api/v1/alerts`, { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts }, ALERTMANAGER_TOKEN)).status,
      ).toBe(202);
    }
    await until('every signal job finished', unfinished, (left) => left === 0, 30_000);
    const ledger = store.keys.signalsKept('completed');
    const sameJobs = async (): Promise<{ kept: string[]; ledger: string[] }> => ({
      kept: (await store.redis.zrange(queueKey('completed'), '0', '-1')).sort(),
      ledger: (await store.redis.zrange(ledger.order, '0', '-1')).sort(),
    });
    const { kept } = await until('the ledger to name the kept jobs', sameJobs, (jobs) => JSON.stringify(jobs.kept) === JSON.stringify(jobs.ledger), 5_000);
    expect(kept).toHaveLength(retentionFromBudget(BUDGET_MB).signals.completed.count);
    const sizes = Object.values(await store.redis.hgetall(ledger.bytes)).map(Number);
    expect(sizes).toHaveLength(kept.length);
    expect(Number(await store.redis.get(ledger.total))).toBe(sizes.reduce((sum, size) => sum + size, 0));
  });

  it('weighs a failed signal job into the failed share, and removes one bigger than that share', async () => {
    const queue = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    const share = retentionFromBudget(BUDGET_MB).signalBytes.failed;
    const options = queueJobOptions(retentionFromBudget(BUDGET_MB)).signals;
    try {
      // Never stored by the intake: the worker refuses these for good (an invalid signal).
      await queue.add('signals', { signals: [{ id: 'small', note: 'x'.repeat(20_000) }] }, { ...options, jobId: 'failed-small' });
      await until(
        'the small job failed and weighed',
        () => store.redis.hget(store.keys.signalsKept('failed').bytes, 'failed-small'),
        (bytes) => bytes !== null,
        30_000,
      );
      await queue.add('signals', { signals: [{ id: 'big', note: 'x'.repeat(share) }] }, { ...options, jobId: 'failed-big' });
      await until(
        'the big job failed and removed',
        () => store.redis.exists(queueKey('failed-big')),
        (exists) => exists === 0,
        30_000,
      );
      expect(await store.redis.zrange(queueKey('failed'), '0', '-1')).not.toContain('failed-big');
      expect(Number(await store.redis.get(store.keys.signalsKept('failed').total))).toBeLessThanOrEqual(share);
    } finally {
      await queue.close();
    }
  });

  it('takes every alert of the real Alertmanager webhooks', async () => {
    const files = (await readdir(WEBHOOKS)).filter((file) => file.endsWith('.json'));
    expect(files.length).toBeGreaterThanOrEqual(4);
    for (const file of files) {
      const webhook = JSON.parse(await readFile(join(WEBHOOKS, file), 'utf8')) as { alerts: unknown[] };
      const answer = await post(`${url}/api/v1/alerts`, webhook, ALERTMANAGER_TOKEN);
      expect(answer.status, file).toBe(202);
      expect(answer.body, file).toEqual(expect.objectContaining({ accepted: webhook.alerts.length }));
      expect(answer.body, file).not.toHaveProperty('refused');
    }
  });
});
