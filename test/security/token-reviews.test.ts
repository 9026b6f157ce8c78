import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { Controller } from '../../controller/service.js';
import { TEST_TOKEN, testConfig } from '../support/controller.js';
import { startKubeApiOverTls, type KubeApiStandIn, type RecordedExchange } from '../support/kube-api.js';
import { projectedToken, tokenReview } from '../support/kube-tokens.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * What a stranger can make the controller ask the Kubernetes API server. A token needs only a
 * JWT's form and the controller's audience (unverified) to be sent for review, so anyone can send
 * such tokens; on a slow API server they must neither take every review slot from the agents nor
 * learn what the API server said.
 */

interface Answer {
  readonly status: number;
  readonly headers: Record<string, string | string[] | undefined>;
  readonly body: { error?: string };
}

/** One request on a connection of its own, from `from` (a loopback address: another client). */
function call(url: string, options: { token: string; body?: unknown; from?: string }): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const payload = options.body === undefined ? undefined : JSON.stringify(options.body);
    const req = request(
      url,
      {
        method: payload === undefined ? 'GET' : 'POST',
        agent: false,
        localAddress: options.from ?? '127.0.0.1',
        headers: { authorization: `Bearer ${options.token}`, ...(payload === undefined ? {} : { 'content-type': 'application/json' }) },
      },
      (response) => {
        let text = '';
        response.setEncoding('utf8');
        response.on('data', (chunk: string) => (text += chunk));
        response.on('end', () => resolve({ status: response.statusCode ?? 0, headers: response.headers, body: JSON.parse(text) as { error?: string } }));
      },
    );
    req.on('error', reject);
    req.end(payload);
  });
}

const xid = (node: string): object => ({ kind: 'xid', node, gpu: '0000:3b:00', xid: 79, time: new Date().toISOString() });

/** What a TokenReview of a token it does not know gets from the API server: not authenticated. */
const NOT_AUTHENTICATED = '[invalid bearer token, square/go-jose: error in cryptographic primitive]';

describe('token reviews a stranger can cause', () => {
  const store = testRedis();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-token-reviews-'));
  let api: KubeApiStandIn;
  let caFile = '';
  let tokenFile = '';
  let controller: Controller | undefined;
  const logs: { msg: string; reason?: string }[] = [];
  /** Reviews the stand-in holds unanswered, as a slow API server does; released after each test. */
  const held: (() => void)[] = [];
  let flooding: Promise<Answer>[] = [];

  beforeAll(async () => {
    ({ api, caFile, tokenFile } = await startKubeApiOverTls(root));
  });
  afterEach(async () => {
    for (const release of held.splice(0)) release();
    await Promise.allSettled(flooding.splice(0));
    await controller?.close();
    controller = undefined;
    logs.length = 0;
    api.verify();
  });
  afterAll(async () => {
    await api?.close();
    await store.cleanup();
    rmSync(root, { recursive: true, force: true });
  });

  async function start(kubernetesAgents: object): Promise<string> {
    const config = testConfig(store.url, store.prefix, {
      // No connection cap: a flood below keeps 300 requests open from one address, which a client that closes each connection at once could cause as well.
      controller: { auth: { operatorToken: TEST_TOKEN, kubernetesAgents }, connections: { maxPerClient: 0 } },
      // A review is cut after 30 s at the latest; the tests see it end sooner only when it is abandoned.
      backend: { kind: 'dry-run', kubernetes: { connection: 'token', server: api.url, tokenFile, caFile, timeoutMs: 30_000 } },
    });
    const sink = new Writable({ write: (chunk: Buffer, _encoding, done) => (logs.push(JSON.parse(chunk.toString()) as { msg: string }), done()) });
    controller = new Controller({ config, logger: pino({ level: 'info' }, sink), workers: false });
    const { port } = await controller.start();
    return `http://127.0.0.1:${port}`;
  }

  /** The stand-in authenticates `agents` at once and holds every other token's review until the test ends. */
  function slowForStrangers(agents: ReadonlyMap<string, string>): void {
    api.reviews(async (token) => {
      const node = agents.get(token);
      if (node !== undefined) return tokenReview(token, { bound: { node } }).response;
      await new Promise<void>((resolve) => held.push(resolve));
      return tokenReview(token, { error: NOT_AUTHENTICATED }).response;
    });
  }

  /** Sends `count` GETs with tokens never seen, at once, in turn from each address of `from`, and waits until each is answered or held at the API server. */
  async function flood(base: string, count: number, from: readonly string[]): Promise<Answer[]> {
    const answered: Answer[] = [];
    flooding = Array.from({ length: count }, (_, index) =>
      call(`${base}/api/v1/jobs`, { token: projectedToken({ bound: { podUid: randomUUID() } }), from: from[index % from.length] }).then(
        (answer) => (answered.push(answer), answer),
      ),
    );
    await until(
      'every flooding request to be answered or held by the API server',
      async () => answered.length + held.length,
      (total) => total === count,
      60_000,
    );
    return answered;
  }

  it('reviews again an agent whose token was found good while 300 unknown tokens from 30 addresses, each within its rate, hold the API server', async () => {
    // cacheSeconds 0: every request of the agent is reviewed, as each is once its minute is up.
    const base = await start({ cacheSeconds: 0 });
    const agent = projectedToken({ bound: { node: 'gpu-a01' } });
    slowForStrangers(new Map([[agent, 'gpu-a01']]));
    expect((await call(`${base}/api/v1/signals`, { token: agent, body: xid('gpu-a01') })).status).toBe(202);

    // Ten tokens from each address: within each one's burst, so the per-address rate holds none back.
    const answered = await flood(
      base,
      300,
      Array.from({ length: 30 }, (_, index) => `127.0.0.${index + 2}`),
    );
    const renewed = await call(`${base}/api/v1/signals`, { token: agent, body: xid('gpu-a01') });
    expect(renewed.status, JSON.stringify(renewed.body)).toBe(202);
    // Unknown tokens hold at most 192 of the 256 reviews; the rest wait for tokens found good.
    expect(held.length).toBe(192);
    expect(answered).toHaveLength(108);
    expect(new Set(answered.map((answer) => `${answer.status} ${answer.body.error}`))).toEqual(
      new Set(['503 credentials could not be checked now; retry later']),
    );
  });

  it('answers 429 to an address past its rate of unknown tokens, so that its flood holds only its burst of reviews and a new agent elsewhere is reviewed at once', async () => {
    const base = await start({});
    const agents = new Map<string, string>();
    slowForStrangers(agents);
    const started = Date.now();
    const answered = await flood(base, 300, ['127.0.0.2']);
    const seconds = Math.ceil((Date.now() - started) / 1000);
    const fresh = projectedToken({ bound: { node: 'gpu-a02' } });
    agents.set(fresh, 'gpu-a02');
    const agent = await call(`${base}/api/v1/signals`, { token: fresh, body: xid('gpu-a02'), from: '127.0.0.1' });
    expect(agent.status, JSON.stringify(agent.body)).toBe(202);

    // A burst of 10, then one a second.
    expect(held.length).toBeLessThanOrEqual(10 + seconds);
    expect(answered.length).toBe(300 - held.length);
    expect(answered.every((answer) => answer.status === 429)).toBe(true);
    expect(answered[0]?.body.error).toMatch(/^too many unknown tokens from this client: at most 1 per second \(bursts of 10\) are checked; retry after \d+ s$/);
    expect(Number(answered[0]?.headers['retry-after'])).toBeGreaterThanOrEqual(1);
  });

  it('abandons the review of a token when the client waiting for it goes away', async () => {
    const base = await start({});
    let abandoned = 0;
    api.reviews(async (token, gone) => {
      await new Promise<void>((resolve) => {
        held.push(resolve);
        gone.addEventListener('abort', () => {
          abandoned += 1;
          resolve();
        });
      });
      return tokenReview(token, { error: NOT_AUTHENTICATED }).response;
    });
    const leaving = request(`${base}/api/v1/jobs`, { agent: false, headers: { authorization: `Bearer ${projectedToken()}` } });
    leaving.on('error', () => undefined);
    leaving.end();
    await until(
      'the review to reach the API server',
      async () => held.length,
      (count) => count === 1,
      10_000,
    );
    leaving.destroy();
    await until(
      'the controller to abandon the review',
      async () => abandoned,
      (count) => count === 1,
      10_000,
    );
  });

  it('tells a sender nothing of what the API server said, logs it instead, and refuses a refused token again without asking for refusedCacheSeconds', async () => {
    const base = await start({});
    const failing = projectedToken({ bound: { node: 'gpu-a03' } });
    api.load([tokenReview(failing, { status: 500, message: 'etcdserver: request timed out' })]);
    const unchecked = await call(`${base}/api/v1/signals`, { token: failing, body: xid('gpu-a03') });
    expect(unchecked.status).toBe(503);
    expect(unchecked.headers['retry-after']).toBe('5');
    expect(unchecked.body).toEqual({ error: 'credentials could not be checked now; retry later' });
    expect(logs.find((line) => line.msg === 'a token could not be checked; answered 503')?.reason).toBe(
      'the Kubernetes API server failed to review the token; HTTP 500: etcdserver: request timed out',
    );
    api.verify();

    const revoked = projectedToken({ bound: { node: 'gpu-a03' } });
    api.load([tokenReview(revoked, { error: '[invalid bearer token, service account token has been invalidated]' })]);
    const refused = await call(`${base}/api/v1/signals`, { token: revoked, body: xid('gpu-a03') });
    expect(refused.status).toBe(401);
    expect(refused.body).toEqual({ error: 'invalid bearer token' });
    expect(logs.find((line) => line.msg === 'a token was refused; answered 401')?.reason).toBe(
      'the Kubernetes API server did not authenticate the service-account token: [invalid bearer token, service account token has been invalidated]',
    );
    api.verify();
    // Asked again, the stand-in would find no exchange due and verify() would fail.
    for (let attempt = 0; attempt < 5; attempt += 1) expect((await call(`${base}/api/v1/signals`, { token: revoked, body: xid('gpu-a03') })).status).toBe(401);
  });

  it('refuses a token whose review answers authenticated as the string "false", and logs the malformed answer', async () => {
    const base = await start({});
    const token = projectedToken({ bound: { node: 'gpu-a04' } });
    const sound = tokenReview(token, { bound: { node: 'gpu-a04' } });
    const body = sound.response.body as { status: Record<string, unknown> };
    const malformed: RecordedExchange = { ...sound, response: { ...sound.response, body: { ...body, status: { ...body.status, authenticated: 'false' } } } };
    api.load([malformed]);
    const answer = await call(`${base}/api/v1/signals`, { token, body: xid('gpu-a04') });
    expect(answer.status).toBe(401);
    expect(answer.body).toEqual({ error: 'invalid bearer token' });
    expect(logs.find((line) => line.msg === 'a token was refused; answered 401')?.reason).toMatch(
      /^the Kubernetes API server's TokenReview answer is malformed \(status\.authenticated: .*boolean.*\); the token is refused$/,
    );
  });
});
