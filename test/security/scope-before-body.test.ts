import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { READ_ONLY_TOKEN, TEST_TOKEN, agentToken, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * A credential without a route's scope is refused before the controller reads the request's
 * body: an agent's token announcing a 3 MB job registration, of which it sends only the first
 * kilobyte, gets its 403 at once. Before, the body was read (and held, and parsed) ahead of the
 * route's scope check, so the controller waited for the rest and answered it by the body's pace.
 */

const DECLARED = 3 * 1024 * 1024;

interface Answer {
  readonly status: number;
  readonly body: { error?: string; scope?: string };
}

/**
 * POSTs to `path` with a Content-Length of `declared` bytes and sends `first` only, keeping the
 * rest back until `rest` is called; resolves with the answer, whenever it comes.
 */
function postPartly(
  url: string,
  path: string,
  token: string,
  declared: number,
  first: string,
): { answer: Promise<Answer>; rest: (text: string) => void; cut: () => void } {
  const req = request(`${url}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'content-length': declared },
  });
  const answer = new Promise<Answer>((resolve, reject) => {
    req.on('response', (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (text += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(text) as Answer['body'] }));
    });
    req.on('error', reject);
  });
  req.write(first);
  return { answer, rest: (text) => req.end(text), cut: () => req.destroy() };
}

describe('the scope check before the body', () => {
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
    ["an agent's token", agentToken('n00')],
    ['the read-only token', READ_ONLY_TOKEN],
  ])('answers %s registering a job 403 while most of its announced 3 MB body has not been sent', async (_who, token) => {
    const { answer, cut } = postPartly(url, '/api/v1/jobs', token, DECLARED, `{"name":"${'x'.repeat(1000)}`);
    try {
      const refused = await answer;
      expect(refused.status).toBe(403);
      expect(refused.body.scope).toBe('operate');
    } finally {
      cut();
    }
  });

  it("reads the whole body of a credential that has the route's scope, sent in two parts", async () => {
    const job = JSON.stringify({ name: 'scope-first', nodes: ['n00', 'n01'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'accept', codeVersion: 'v1' });
    const half = Math.floor(job.length / 2);
    const { answer, rest } = postPartly(url, '/api/v1/jobs', TEST_TOKEN, Buffer.byteLength(job), job.slice(0, half));
    rest(job.slice(half));
    const registered = await answer;
    expect(registered.status, registered.body.error).toBe(201);
  });
});
