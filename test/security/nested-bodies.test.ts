import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { ALERTMANAGER_TOKEN, READ_ONLY_TOKEN, TEST_TOKEN, agentToken, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * A body nested thousands of levels deep, holding a NUL, once made the controller walk it
 * recursively inside the request's 'end' event: the stack ran out and the RangeError ended the
 * process. Now such a body is refused by its depth before it is parsed, whichever endpoint and
 * credential sends it, and the controller answers on.
 */

/** 4,000 `[`, a string holding an escaped NUL, 4,000 `]`: 8 KB. */
const DEEP_WITH_NUL = `${'['.repeat(4000)}"\\u0000"${']'.repeat(4000)}`;

/** Sends `body` as JSON with `method` (a GET with a body too, which fetch will not send); the status and the parsed answer. */
function send(url: string, method: string, token: string, body: string): Promise<{ status: number; body: { error?: string } }> {
  return new Promise((resolve, reject) => {
    const req = request(
      url,
      { method, headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (text += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as { error?: string } }));
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

describe('deeply nested bodies at the controller', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0 } } }), {
      workers: false,
    }));
  });

  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it.each([
    ['the read-only token as a GET of the jobs', 'GET', '/api/v1/jobs', READ_ONLY_TOKEN],
    ["an agent's token on the fast path", 'POST', '/api/v1/signals', agentToken('n00')],
    ["Alertmanager's token on the webhook", 'POST', '/api/v1/alerts', ALERTMANAGER_TOKEN],
    ["the operator's token registering a job", 'POST', '/api/v1/jobs', TEST_TOKEN],
  ])('refuses the 8 KB body nested 4,000 deep with a NUL, sent with %s, by its depth (400), and stays up', async (_who, method, path, token) => {
    const answer = await send(`${url}${path}`, method, token, DEEP_WITH_NUL);
    expect(answer.status).toBe(400);
    expect(answer.body.error).toBe('request body nests deeper than 64 levels of arrays and objects');
    const health = await fetch(`${url}/healthz`);
    expect(health.status).toBe(200);
  });

  it('answers a body nested 3,000 deep by its depth, before any walk of it, and one of objects as well', async () => {
    for (const body of [`${'['.repeat(3000)}1${']'.repeat(3000)}`, `${'{"a":'.repeat(3000)}"\\u0000"${'}'.repeat(3000)}`]) {
      const answer = await send(`${url}/api/v1/alerts`, 'POST', ALERTMANAGER_TOKEN, body);
      expect(answer.status).toBe(400);
      expect(answer.body.error).toMatch(/^request body nests deeper than 64 levels/);
    }
  });

  it('still parses a body at the limit, and names the field of a NUL in it by its path', async () => {
    // 64 levels: the outer object, 62 arrays and the object holding the NUL.
    const body = `{"alerts":${'['.repeat(62)}{"labels":"a\\u0000"}${']'.repeat(62)}}`;
    const answer = await send(`${url}/api/v1/alerts`, 'POST', ALERTMANAGER_TOKEN, body);
    expect(answer.status).toBe(400);
    expect(answer.body.error).toBe(`alerts.${'0.'.repeat(62)}labels: must not contain a NUL character (\\u0000)`);
  });

  it('takes an ordinary Alertmanager webhook and a job registration, whose nesting is far under the limit', async () => {
    const job = {
      name: 'nested-ok',
      nodes: ['n00', 'n01'],
      ranksPerNode: 1,
      topology: {
        ranks: [
          { rank: 0, node: 'n00' },
          { rank: 1, node: 'n01' },
        ],
      },
      launcher: 'accept',
      codeVersion: 'v1',
    };
    const registered = await send(`${url}/api/v1/jobs`, 'POST', TEST_TOKEN, JSON.stringify(job));
    expect(registered.status, registered.body.error).toBe(201);
  });
});
