import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../core/config.js';
import { resolveCredentials } from '../../core/auth-config.js';
import { InputError } from '../../core/errors.js';
import { QUEUE_NAMES } from '../../core/queues.js';
import type { Controller } from '../../controller/service.js';
import { TEST_TOKEN, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * The controller's HTTP edge: which requests get past it and which do not. Every API route
 * needs the bearer token (bull-board takes it as the Basic password too), bodies are bounded
 * after decompression, and each client's writes are rate limited before authentication.
 */

// Dated when the test runs: the controller refuses a fault dated a day or more before it arrives.
const FAST_PATH = { kind: 'xid', node: 'n07', gpu: '0000:3b:00', xid: 79, time: new Date().toISOString() };

/** Every route under /api/v1, with a body where it takes one. */
const API_ROUTES: readonly { method: 'GET' | 'POST'; path: string; body?: unknown }[] = [
  { method: 'POST', path: '/api/v1/alerts', body: {} },
  { method: 'POST', path: '/api/v1/signals', body: FAST_PATH },
  { method: 'POST', path: '/api/v1/jobs', body: {} },
  { method: 'POST', path: '/api/v1/jobs/llama/checkpoints', body: {} },
  { method: 'POST', path: '/api/v1/jobs/llama/code-updates', body: { version: 'v2' } },
  { method: 'POST', path: '/api/v1/standby/n01/self-check', body: { ok: true } },
  { method: 'GET', path: '/api/v1/audit' },
  { method: 'GET', path: '/api/v1/jobs' },
  { method: 'GET', path: '/api/v1/jobs/llama' },
  { method: 'GET', path: '/api/v1/jobs/llama/restore-plan' },
  { method: 'GET', path: '/api/v1/jobs/llama/microbatches' },
  { method: 'GET', path: '/api/v1/standby/n01' },
];

/** Authorization headers that must all be turned away: none, wrong, near misses, other schemes. */
const WRONG_CREDENTIALS: readonly (string | undefined)[] = [
  undefined,
  '',
  'Bearer',
  'Bearer ',
  'Bearer x',
  `Bearer ${TEST_TOKEN.slice(0, -1)}`,
  `Bearer ${TEST_TOKEN}x`,
  `Bearer ${TEST_TOKEN.toUpperCase()}`,
  `Bearer ${'a'.repeat(8192)}`,
  TEST_TOKEN,
  `Token ${TEST_TOKEN}`,
  `Basic ${Buffer.from(`steadfast:${TEST_TOKEN}`).toString('base64')}`,
];

async function call(
  url: string,
  method: string,
  path: string,
  options: { auth?: string | undefined; body?: string | Uint8Array<ArrayBuffer>; headers?: Record<string, string> } = {},
): Promise<{ status: number; headers: Headers; body: Record<string, unknown> | undefined }> {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...options.headers };
  if (options.auth !== undefined) headers.authorization = options.auth;
  const response = await fetch(`${url}${path}`, { method, headers, ...(options.body === undefined ? {} : { body: options.body }) });
  const text = await response.text();
  let body: Record<string, unknown> | undefined;
  try {
    body = JSON.parse(text) as Record<string, unknown>;
  } catch {
    body = undefined;
  }
  return { status: response.status, headers: response.headers, body };
}

describe('controller edge: authentication and body limits', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let signals: Queue;

  beforeAll(async () => {
    ({ controller, url } = await startController(
      testConfig(store.url, store.prefix, { controller: { bodyLimitBytes: 16_384, rateLimit: { requestsPerSecond: 0 } } }),
      { workers: false },
    ));
    signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
  });
  afterAll(async () => {
    await signals.close();
    await controller.close();
    await store.cleanup();
  });

  it('answers every API route with 401 and a Bearer challenge for a missing, wrong or near-miss token, and stores nothing', async () => {
    for (const route of API_ROUTES) {
      for (const auth of WRONG_CREDENTIALS) {
        const answer = await call(url, route.method, route.path, { auth, ...(route.body === undefined ? {} : { body: JSON.stringify(route.body) }) });
        expect(answer.status, `${route.method} ${route.path} with ${JSON.stringify(auth?.slice(0, 40))}`).toBe(401);
        expect(answer.headers.get('www-authenticate')).toMatch(/^Bearer realm=/);
        expect(typeof answer.body?.error).toBe('string');
      }
    }
    expect(await signals.count()).toBe(0);
  });

  it("lets the right token through on every API route (the answer is the route's own, never 401)", async () => {
    for (const route of API_ROUTES) {
      const answer = await call(url, route.method, route.path, {
        auth: `Bearer ${TEST_TOKEN}`,
        ...(route.body === undefined ? {} : { body: JSON.stringify(route.body) }),
      });
      expect(answer.status, `${route.method} ${route.path}`).not.toBe(401);
      expect(answer.status, `${route.method} ${route.path}`).toBeLessThan(500);
    }
  });

  it('keeps bull-board (/queues) behind the token: 401 with a Basic challenge without it, the page with it as Basic password or bearer', async () => {
    const anonymous = await fetch(`${url}/queues`);
    expect(anonymous.status).toBe(401);
    expect(anonymous.headers.get('www-authenticate')).toMatch(/^Basic realm=/);
    const wrong = await fetch(`${url}/queues/api/queues`, { headers: { authorization: `Basic ${Buffer.from('admin:admin').toString('base64')}` } });
    expect(wrong.status).toBe(401);
    for (const authorization of [`Basic ${Buffer.from(`anyone:${TEST_TOKEN}`).toString('base64')}`, `Bearer ${TEST_TOKEN}`]) {
      const page = await fetch(`${url}/queues`, { headers: { authorization } });
      expect(page.status).toBe(200);
    }
    // Read-only even with the token: no retry, remove or clean.
    const write = await fetch(`${url}/queues/api/queues/signals/clean/failed`, { method: 'PUT', headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(write.status).toBeGreaterThanOrEqual(400);
    expect(write.status).toBeLessThan(500);
  });

  it('answers a body over the limit with a JSON 413, and refuses a compressed body with 415 (a gzip bomb is no way around the limit)', async () => {
    const queuedBefore = await signals.count();
    const big = JSON.stringify([{ ...FAST_PATH, message: 'x'.repeat(20_000) }]);
    const plain = await call(url, 'POST', '/api/v1/signals', { auth: `Bearer ${TEST_TOKEN}`, body: big });
    expect(plain.status).toBe(413);
    expect(plain.body?.error).toBe('request body larger than 16384 bytes');

    // 16 MiB of spaces compress to a few KiB: under the limit on the wire, far over it inflated.
    const bomb = new Uint8Array(gzipSync(Buffer.from(`${' '.repeat(16 * 1024 * 1024)}{}`)));
    expect(bomb.length).toBeLessThan(16_384);
    const inflated = await call(url, 'POST', '/api/v1/signals', { auth: `Bearer ${TEST_TOKEN}`, body: bomb, headers: { 'content-encoding': 'gzip' } });
    expect(inflated.status).toBe(415);
    expect(inflated.body?.error).toBe('request body must not be compressed; got "Content-Encoding: gzip"');
    expect(await signals.count()).toBe(queuedBefore);
  });

  it('names the problem in a 400 for a broken path escape instead of failing', async () => {
    const answer = await call(url, 'POST', '/api/v1/jobs/%E0%A4%A/checkpoints', { auth: `Bearer ${TEST_TOKEN}`, body: '{}' });
    expect(answer.status).toBe(400);
    expect(answer.body?.error).toMatch(/unreadable request|invalid job name/);
  });

  it('labels refusals by known endpoint only, so random paths cannot grow the metrics without bound', async () => {
    for (let index = 0; index < 40; index += 1) {
      await call(url, 'POST', `/api/v1/${Math.random().toString(36).slice(2)}/${index}`, { body: '{}' });
    }
    const text = await controller.metrics.registry.metrics();
    const series = text.split('\n').filter((line) => line.startsWith('steadfast_requests_rejected_total{'));
    const endpoints = new Set(series.map((line) => /endpoint="([^"]*)"/.exec(line)?.[1]));
    expect([...endpoints].every((endpoint) => endpoint !== undefined && /^[a-z-]+$/.test(endpoint))).toBe(true);
    expect(endpoints.size).toBeLessThanOrEqual(12);
    expect(series.find((line) => line.includes('endpoint="other"') && line.includes('reason="unauthorized"'))).toMatch(/ 40$/);
  });
});

describe('controller edge: per-client rate limit on writes', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0.2, burst: 3 } } }), {
      workers: false,
    }));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('answers writes past the burst with 429, Retry-After and a JSON error, counting unauthenticated attempts too; reads stay open', async () => {
    const statuses: number[] = [];
    statuses.push((await call(url, 'POST', '/api/v1/signals', { auth: 'Bearer wrong-guess', body: JSON.stringify(FAST_PATH) })).status);
    statuses.push((await call(url, 'POST', '/api/v1/signals', { auth: `Bearer ${TEST_TOKEN}`, body: JSON.stringify(FAST_PATH) })).status);
    statuses.push((await call(url, 'POST', '/api/v1/jobs', { auth: `Bearer ${TEST_TOKEN}`, body: '{}' })).status);
    expect(statuses).toEqual([401, 202, 400]);

    for (const path of ['/api/v1/signals', '/api/v1/alerts', '/api/v1/jobs/llama/code-updates', '/api/v1/standby/n01/self-check']) {
      const limited = await call(url, 'POST', path, { auth: `Bearer ${TEST_TOKEN}`, body: JSON.stringify(FAST_PATH) });
      expect(limited.status, path).toBe(429);
      expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
      expect(Number(limited.headers.get('retry-after'))).toBeLessThanOrEqual(5);
      expect(limited.body?.error).toMatch(/^too many requests from this client: at most 0\.2 per second \(bursts of 3\); retry after \d s$/);
    }
    expect((await call(url, 'GET', '/api/v1/jobs', { auth: `Bearer ${TEST_TOKEN}` })).status).toBe(200);
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    const text = await controller.metrics.registry.metrics();
    expect(text).toMatch(/steadfast_requests_rejected_total\{endpoint="signals",reason="rate_limited"\} 1/);
  });
});

describe('controller tokens', () => {
  it("reads each role's credential from the environment or from a file, and refuses to run without one or with a short one", () => {
    const env = { STEADFAST_CONTROLLER__AUTH__OPERATOR_TOKEN: 'from-the-environment-0123' };
    expect(resolveCredentials(loadConfig({ env }).controller.auth).operator).toBe('from-the-environment-0123');
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-token-'));
    try {
      writeFileSync(join(dir, 'token'), 'from-a-file-0123456789\n');
      writeFileSync(join(dir, 'short'), 'short\n');
      expect(
        resolveCredentials(loadConfig({ env: { STEADFAST_CONTROLLER__AUTH__ALERTMANAGER_TOKEN_FILE: join(dir, 'token') } }).controller.auth).alertmanager,
      ).toBe('from-a-file-0123456789');
      expect(() => resolveCredentials({ readOnlyTokenFile: join(dir, 'short') })).toThrow(
        /controller\.auth\.readOnlyTokenFile: the secret in .* must be at least 16 characters/,
      );
      expect(() => resolveCredentials({ agentSecretFile: join(dir, 'missing') })).toThrow(InputError);
      expect(() => resolveCredentials(loadConfig({ env: {} }).controller.auth)).toThrow(/refusing to run unauthenticated/);
      expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__AUTH__OPERATOR_TOKEN: 'short' } })).toThrow(/controller\.auth\.operatorToken/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('takes the rate limit from the config and its environment overrides, refusing nonsense', () => {
    expect(loadConfig({ env: {} }).controller.rateLimit).toEqual({ requestsPerSecond: 50, burst: 500 });
    const tuned = loadConfig({ env: { STEADFAST_CONTROLLER__RATE_LIMIT__REQUESTS_PER_SECOND: '0', STEADFAST_CONTROLLER__RATE_LIMIT__BURST: '10' } });
    expect(tuned.controller.rateLimit).toEqual({ requestsPerSecond: 0, burst: 10 });
    expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__RATE_LIMIT__BURST: '0' } })).toThrow(/controller.rateLimit.burst/);
    expect(() => loadConfig({ env: { STEADFAST_CONTROLLER__RATE_LIMIT__REQUESTS_PER_SECOND: '-1' } })).toThrow(/controller.rateLimit.requestsPerSecond/);
  });
});
