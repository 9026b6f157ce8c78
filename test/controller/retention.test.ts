import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import { QUEUE_NAMES } from '../../core/queues.js';
import { AUDIT_DATA_MAX_BYTES, AUDIT_SUMMARY_MAX_BYTES, retentionFromBudget } from '../../core/retention.js';
import type { Controller } from '../../controller/service.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * Redis stays within the retention budget however many alerts arrive: finished signal jobs,
 * the audit stream and its write-once markers are trimmed to counts sized from
 * redis.retentionBudgetMB (here its least, 1 MiB), and what steadfast keeps in Redis measures
 * under that budget (MEMORY USAGE of every key under its prefix).
 */

const ALERTS = 600;
const PER_WEBHOOK = 50;

describe('Redis retention under a stream of alerts beyond its caps', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(
      testConfig(store.url, store.prefix, { redis: { retentionBudgetMB: 1 }, controller: { auditMaxLength: 100_000 } }),
    ));
  });

  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  async function bytesUnderPrefix(): Promise<number> {
    let total = 0;
    let cursor = '0';
    do {
      const [next, keys] = await store.redis.scan(cursor, 'MATCH', `${store.prefix}:*`, 'COUNT', 1000);
      for (const key of keys) total += (await store.redis.memory('USAGE', key, 'SAMPLES', '0')) ?? 0;
      cursor = next;
    } while (cursor !== '0');
    return total;
  }

  it('keeps finished jobs, audit entries and markers to the counts of the budget, and its bytes under it', async () => {
    const start = Date.parse('2026-11-21T10:00:00.000Z');
    for (let sent = 0; sent < ALERTS; sent += PER_WEBHOOK) {
      const alerts = Array.from({ length: PER_WEBHOOK }, (_, index) => ({
        status: 'firing',
        labels: { alertname: 'SteadfastGpuTemperatureHigh', node: `node-${index % 8}`, gpu: String(index % 8), severity: 'warning', domain: 'gpu' },
        annotations: { summary: 'A GPU runs hot.', description: 'GPU temperature above the threshold for five minutes.' },
        startsAt: new Date(start + sent + index).toISOString(),
      }));
      const answer = await post(`${url}/api/v1/alerts`, { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts });
      expect(answer.status).toBe(202);
    }
    const completedKey = `${store.prefix}:${QUEUE_NAMES.signals}:completed`;
    const retention = retentionFromBudget(1);
    for (const until = Date.now() + 20_000; Date.now() < until; await sleep(200)) {
      const waiting =
        (await store.redis.llen(`${store.prefix}:${QUEUE_NAMES.signals}:wait`)) + (await store.redis.llen(`${store.prefix}:${QUEUE_NAMES.signals}:active`));
      if (waiting === 0) break;
    }
    const jobKeys: string[] = [];
    let cursor = '0';
    do {
      const [next, keys] = await store.redis.scan(cursor, 'MATCH', `${store.prefix}:${QUEUE_NAMES.signals}:sb-*`, 'COUNT', 1000);
      jobKeys.push(...keys.filter((key) => !key.endsWith(':logs')));
      cursor = next;
    } while (cursor !== '0');

    expect(retention.signals.completed.count).toBeLessThan(ALERTS / 2);
    expect(await store.redis.zcard(completedKey)).toBe(retention.signals.completed.count);
    expect(jobKeys.length, 'signal jobs kept in Redis').toBe(retention.signals.completed.count);
    // XADD MAXLEN ~ trims whole stream nodes (100 entries each): up to one node over.
    expect(await store.redis.xlen(store.keys.audit)).toBeLessThanOrEqual(retention.auditEntries + 100);
    expect(await store.redis.zcard(store.keys.auditWritten)).toBe(retention.auditEntries);
    expect(await bytesUnderPrefix()).toBeLessThan(1024 * 1024);
  }, 60_000);

  it('stores an audit entry with oversized data cut to the per-entry cap, saying so', async () => {
    const audit = new AuditLog(store.redis, store.keys, 1000);
    const huge = { description: 'é'.repeat(20_000), node: 'node-1' };
    await audit.append({ type: 'signal', ref: 'big-entry', node: 'node-1', summary: 's'.repeat(2000), data: huge });
    const [entry] = await audit.read({ ref: 'big-entry' });
    const rows = await store.redis.xrevrange(store.keys.audit, '+', '-', 'COUNT', 1);
    const stored = rows[0]?.[1] ?? [];
    const dataField = stored[stored.indexOf('data') + 1] ?? '';
    expect(Buffer.byteLength(dataField)).toBeLessThanOrEqual(AUDIT_DATA_MAX_BYTES);
    expect(entry?.data).toMatchObject({ truncated: true, bytes: Buffer.byteLength(JSON.stringify(huge)) });
    expect(Buffer.byteLength(entry?.summary ?? '')).toBe(AUDIT_SUMMARY_MAX_BYTES);
    expect(entry?.summary.endsWith('…[cut]')).toBe(true);
  });

  it('cuts a summary of three-byte characters to its bytes, between characters', async () => {
    const audit = new AuditLog(store.redis, store.keys, 1000);
    await audit.append({ type: 'access', ref: 'wide-summary', summary: `refused ${'€'.repeat(400)}`, data: {} });
    const [entry] = await audit.read({ ref: 'wide-summary' });
    const summary = entry?.summary ?? '';
    expect(Buffer.byteLength(summary)).toBeLessThanOrEqual(AUDIT_SUMMARY_MAX_BYTES);
    expect(summary).toMatch(/^refused €+…\[cut\]$/);
    expect(summary.length).toBeGreaterThan(160);
  });

  it('keeps a long write-once marker as its hash: the same entry is written once, one differing only past the cut still is', async () => {
    const audit = new AuditLog(store.redis, store.keys, 1000);
    const summary = (end: string): string => `refused GET /${'€'.repeat(600)}${end}`;
    const first = await audit.append({ type: 'access', ref: 'long-marker', summary: summary('a'), data: {} });
    const again = await audit.append({ type: 'access', ref: 'long-marker', summary: summary('a'), data: {} });
    const other = await audit.append({ type: 'access', ref: 'long-marker', summary: summary('b'), data: {} });
    expect(first).toBeDefined();
    expect(again).toBeUndefined();
    expect(other).toBeDefined();
    const markers = await store.redis.zrange(store.keys.auditWritten, '0', '-1');
    expect(Math.max(...markers.map((marker) => Buffer.byteLength(marker)))).toBeLessThanOrEqual(AUDIT_SUMMARY_MAX_BYTES);
  });
});
