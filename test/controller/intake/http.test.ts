import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES } from '../../../core/queues.js';
import type { Controller } from '../../../controller/service.js';
import { freePort } from '../../../tryit/processes.js';
import { TEST_TOKEN, post, startController, testConfig, xidAlertPayload } from '../../support/controller.js';
import { waitingSignals } from '../../support/stored-signals.js';
import { testRedis } from '../../support/redis.js';

const WEBHOOKS = join(import.meta.dirname, '..', '..', 'fixtures', 'realworld', 'alertmanager-webhook');

describe('controller HTTP intake', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let metricsUrl: string;
  let signals: Queue;

  beforeAll(async () => {
    ({ controller, url, metricsUrl } = await startController(testConfig(store.url, store.prefix, { controller: { bodyLimitBytes: 16_384 } }), {
      workers: false,
    }));
    signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
  });
  afterAll(async () => {
    await signals.close();
    await controller.close();
    await store.cleanup();
  });

  async function queued(): Promise<number> {
    return waitingSignals(signals);
  }

  it('refuses a webhook without a bearer token with 401 and stores nothing', async () => {
    const before = await queued();
    const response = await post(`${url}/api/v1/alerts`, xidAlertPayload(), null);
    expect(response.status).toBe(401);
    expect(response.body.error).toMatch(/Authorization: Bearer/);
    expect(response.headers.get('www-authenticate')).toMatch(/^Bearer/);
    expect(await queued()).toBe(before);
  });

  it('refuses a wrong bearer token with 401', async () => {
    const response = await post(`${url}/api/v1/signals`, {}, 'not-the-token-at-all');
    expect(response.status).toBe(401);
    expect(response.body.error).toBe('invalid bearer token');
  });

  it('answers malformed JSON with 400 and a message saying it is not JSON', async () => {
    const response = await post(`${url}/api/v1/alerts`, '{"version": "4", ');
    expect(response.status).toBe(400);
    expect(response.body.error).toMatch(/not valid JSON/);
  });

  it('answers a payload with a bad field with 400 naming that field', async () => {
    const payload = xidAlertPayload();
    (payload.alerts as Record<string, unknown>[])[0]!.startsAt = 'yesterday';
    const response = await post(`${url}/api/v1/alerts`, payload);
    expect(response.status).toBe(400);
    expect(response.body.error).toContain('alerts.0.startsAt');
  });

  it('answers an unsupported webhook version with 400 naming the version field', async () => {
    const response = await post(`${url}/api/v1/alerts`, xidAlertPayload({ version: '3' }));
    expect(response.status).toBe(400);
    expect(response.body.error).toMatch(/version: only Alertmanager webhook version "4"/);
  });

  it('answers a body over the configured limit with 413 and stores nothing', async () => {
    const before = await queued();
    const payload = xidAlertPayload({ commonAnnotations: { padding: 'x'.repeat(20_000) } });
    const response = await post(`${url}/api/v1/alerts`, payload);
    expect(response.status).toBe(413);
    expect(response.body.error).toMatch(/larger than 16384 bytes/);
    expect(await queued()).toBe(before);
  });

  it('accepts every real Alertmanager webhook sample and stores one signal per alert', async () => {
    for (const file of readdirSync(WEBHOOKS).filter((name) => name.endsWith('.json'))) {
      const payload = JSON.parse(readFileSync(join(WEBHOOKS, file), 'utf8')) as { alerts: unknown[] };
      const before = await queued();
      const response = await post(`${url}/api/v1/alerts`, payload);
      expect(response.status, file).toBe(202);
      expect(response.body.accepted, file).toBe(payload.alerts.length);
      expect(await queued(), file).toBe(before + payload.alerts.length);
    }
  });

  it('stores a repeated notification of the same alert only once', async () => {
    const payload = xidAlertPayload({ groupKey: 'repeat-test' });
    (payload.alerts as Record<string, unknown>[])[0]!.startsAt = '2026-11-21T11:11:11.000Z';
    const first = await post(`${url}/api/v1/alerts`, payload);
    const before = await queued();
    const second = await post(`${url}/api/v1/alerts`, payload);
    expect(first.status).toBe(202);
    expect(second.status).toBe(202);
    expect(second.body.ids).toEqual(first.body.ids);
    expect(await queued()).toBe(before);
  });

  it('accepts a fast-path Xid event and rejects one without its Xid code, naming the field', async () => {
    const event = { kind: 'xid', node: 'node-2', gpu: '0000:18:00', xid: 48, message: 'DBE', time: new Date().toISOString() };
    const ok = await post(`${url}/api/v1/signals`, event);
    expect(ok.status).toBe(202);
    const { xid: _omitted, ...withoutXid } = event;
    const bad = await post(`${url}/api/v1/signals`, withoutXid);
    expect(bad.status).toBe(400);
    expect(bad.body.error).toContain('xid: xid is required');
  });

  it('rejects a node name that could reach a command line as an option', async () => {
    const event = { kind: 'xid', node: '--all', gpu: '0000:18:00', xid: 79, time: new Date().toISOString() };
    const response = await post(`${url}/api/v1/signals`, event);
    expect(response.status).toBe(400);
    expect(response.body.error).toContain('node:');
  });

  it('serves health without a token, and metrics without a token on their own listener only', async () => {
    const health = await fetch(`${url}/healthz`);
    expect(health.status).toBe(200);
    expect(await health.json()).toEqual({ status: 'ok', redis: 'up' });
    expect((await fetch(`${url}/metrics`)).status).toBe(404);
    expect((await fetch(`${metricsUrl}/api/v1/audit`)).status).toBe(404);
    const metrics = await (await fetch(`${metricsUrl}/metrics`)).text();
    expect(metrics).toMatch(/steadfast_signals_accepted_total\{source="alertmanager",kind="xid"\} \d+/);
    expect(metrics).toMatch(/steadfast_requests_rejected_total\{endpoint="alerts",reason="too_large"\} 1/);
    expect(metrics).toMatch(/steadfast_requests_rejected_total\{endpoint="alerts",reason="unauthorized"\} 1/);
    const { version } = JSON.parse(readFileSync(join(import.meta.dirname, '../../../package.json'), 'utf8')) as { version: string };
    expect(metrics).toContain(`steadfast_build_info{version="${version}",nodejs="${process.versions.node}"} 1`);
  });

  it('keeps the audit API behind the token', async () => {
    expect((await fetch(`${url}/api/v1/audit`)).status).toBe(401);
    const response = await fetch(`${url}/api/v1/audit?limit=5`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(response.status).toBe(200);
    const bad = await fetch(`${url}/api/v1/audit?limit=-1`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: string }).error).toContain('limit');
  });
});

describe('controller with Redis unreachable', () => {
  it('answers 503 with Retry-After so Alertmanager retries, and reports degraded health', async () => {
    const deadPort = await freePort();
    const { controller, url } = await startController(testConfig(`redis://127.0.0.1:${deadPort}`, 'down'), { workers: false });
    try {
      const response = await post(`${url}/api/v1/alerts`, xidAlertPayload());
      expect(response.status).toBe(503);
      expect(response.headers.get('retry-after')).toBe('5');
      expect(response.body.error).toMatch(/retry later/);
      const health = await fetch(`${url}/healthz`);
      expect(health.status).toBe(503);
    } finally {
      await controller.close();
    }
  });
});
