import { connect } from 'node:net';
import { Queue } from 'bullmq';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AUDIT_TYPES } from '../../core/audit.js';
import { QUEUE_NAMES } from '../../core/queues.js';
import type { Controller } from '../../controller/service.js';
import { ALERTMANAGER_TOKEN, READ_ONLY_TOKEN, TEST_TOKEN, agentToken, post, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { hostileString } from '../support/hostile.js';
import { testRedis } from '../support/redis.js';
import { storedSignals } from '../support/stored-signals.js';
import { FuzzReport, budget, fuzz, watchProcess } from './harness.js';
import { expectNoPrototypePollution, expectWellFormed, requestBodies, type RequestBody } from './inputs.js';

/**
 * Fuzzes the controller's write endpoints over real HTTP against the real Redis: every answer
 * to a bad request is a JSON 4xx naming the problem, never a 5xx or a crash, and what was
 * accepted before the fuzzing (signals in the queue, a job, its checkpoints, the audit trail)
 * is still there, unchanged, afterwards.
 */

const REPORT = new FuzzReport('controller HTTP');
const PER_ENDPOINT = budget(300, 4);

const KEEP_JOB = {
  name: 'keep-job',
  nodes: ['keep-00', 'keep-01'],
  ranksPerNode: 1,
  topology: { tp: 1, pp: 1, dp: 2, order: 'tp-dp-pp' },
  launcher: 'accept',
  codeVersion: 'v1',
};
const FUZZ_JOB = { ...KEEP_JOB, name: 'fuzz-job', nodes: ['n00', 'n01', 'n02', 'n03'], topology: { tp: 1, pp: 2, dp: 2, order: 'tp-dp-pp' } };
/** A hot-swap job, for its world reports. */
const SWAP_JOB = { ...KEEP_JOB, name: 'swap-job', nodes: ['w00', 'w01'], topology: undefined, hotSwap: { spares: ['w02'] } };

const ALERT = xidAlertPayload();
// Dated when the test runs: the controller refuses a fault dated a day or more before it arrives.
const FAST_PATH = { kind: 'xid', node: 'n07', gpu: '0000:3b:00', xid: 79, message: 'NVRM: Xid 79', time: new Date().toISOString() };
const NCCL_TIMEOUT = { kind: 'nccl_timeout', node: 'n01', job: 'fuzz-job', rank: 3, time: new Date().toISOString() };
const SHARD = { step: 100, rank: 0, tier: 'host', holder: 'n00' };

/** `text` with lone surrogates replaced, which encodeURIComponent cannot encode. */
function wellFormed(text: string): string {
  return text.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');
}

/** A path parameter: mostly valid, often hostile, sometimes a broken percent-escape. */
function pathParameter(valid: string): fc.Arbitrary<string> {
  return fc.oneof(
    { weight: 5, arbitrary: fc.constant(valid) },
    { weight: 2, arbitrary: hostileString.map((text) => encodeURIComponent(wellFormed(text.slice(0, 2000)))) },
    { weight: 1, arbitrary: fc.constantFrom('%zz', '%E0%A4%A', '%', '..', '.', '%2e%2e', 'keep-job', 'nope') },
  );
}

interface Target {
  readonly name: string;
  /** POST unless named. */
  readonly method?: 'PUT' | 'DELETE';
  readonly path: fc.Arbitrary<string>;
  readonly bodies: readonly unknown[];
  readonly allowed: readonly number[];
}

const TARGETS: readonly Target[] = [
  { name: 'POST /api/v1/alerts', path: fc.constant('/api/v1/alerts'), bodies: [ALERT], allowed: [202, 400, 413, 415] },
  {
    name: 'POST /api/v1/signals',
    path: fc.constant('/api/v1/signals'),
    bodies: [FAST_PATH, [FAST_PATH, NCCL_TIMEOUT], NCCL_TIMEOUT],
    allowed: [202, 400, 413, 415],
  },
  {
    name: 'POST /api/v1/jobs',
    path: fc.constant('/api/v1/jobs'),
    bodies: [
      FUZZ_JOB,
      { ...FUZZ_JOB, name: 'other', launcher: { kind: 'kubernetes', namespace: 'ml', workload: 'jobs.batch/llama', podSelector: 'job-name=llama' } },
    ],
    allowed: [201, 400, 409, 413, 415],
  },
  {
    name: 'POST /api/v1/jobs/:id/checkpoints',
    path: pathParameter('fuzz-job').map((id) => `/api/v1/jobs/${id}/checkpoints`),
    bodies: [SHARD, [SHARD, { ...SHARD, rank: 1, holder: 'n01' }], { step: 5, rank: 2, tier: 'remote' }],
    allowed: [202, 400, 404, 413, 415],
  },
  {
    name: 'POST /api/v1/jobs/:id/code-updates',
    path: pathParameter('fuzz-job').map((id) => `/api/v1/jobs/${id}/code-updates`),
    bodies: [
      { version: 'v2', urgent: false },
      { version: 'release/2.1+cu124', urgent: true },
    ],
    allowed: [202, 400, 404, 413, 415],
  },
  {
    name: 'POST /api/v1/jobs/:id/world',
    path: pathParameter('swap-job').map((id) => `/api/v1/jobs/${id}/world`),
    bodies: [
      { epoch: 0, shard: 0, node: 'w00', event: 'stepped', step: 3, stepSeconds: 0.1 },
      { epoch: 0, node: 'w02', event: 'spare' },
      { epoch: 0, shard: 1, node: 'w01', event: 'failed', detail: 'rendezvous timed out', missing: [0] },
    ],
    // 409: a report for an epoch that is over.
    allowed: [202, 400, 404, 409, 413, 415],
  },
  {
    name: 'POST /api/v1/standby/:node/self-check',
    path: pathParameter('spare-01').map((node) => `/api/v1/standby/${node}/self-check`),
    bodies: [
      { ok: true, detail: '' },
      { ok: false, detail: 'gpu 3 missing' },
    ],
    allowed: [200, 400, 404, 413, 415],
  },
  // keep-job is left alone: it must come through the fuzzing as it was.
  {
    name: 'PUT /api/v1/jobs/:id/policy',
    method: 'PUT',
    path: pathParameter('fuzz-job')
      .filter((id) => id !== 'keep-job')
      .map((id) => `/api/v1/jobs/${id}/policy`),
    bodies: [{ recovery: false }, { recovery: true, dryRun: true }, { dryRun: false }],
    allowed: [200, 400, 404, 413, 415],
  },
  {
    name: 'DELETE /api/v1/jobs/:id',
    method: 'DELETE',
    path: pathParameter('fuzz-job')
      .filter((id) => id !== 'keep-job')
      .map((id) => `/api/v1/jobs/${id}`),
    bodies: [{}],
    allowed: [200, 400, 404, 413, 415],
  },
  {
    name: 'PUT /api/v1/holds/:node',
    method: 'PUT',
    path: pathParameter('n02').map((node) => `/api/v1/holds/${node}`),
    bodies: [{ reason: 'DIMM swap' }, { reason: 'firmware', durationSeconds: 3600 }, { reason: 'cable', until: '2099-01-01T00:00:00Z' }],
    // 404: a path such as /holds/.. that names no endpoint.
    allowed: [200, 400, 404, 413, 415],
  },
  {
    name: 'DELETE /api/v1/holds/:node',
    method: 'DELETE',
    path: pathParameter('n02').map((node) => `/api/v1/holds/${node}`),
    bodies: [{}],
    allowed: [200, 400, 404, 413, 415],
  },
  { name: 'POST /api/v1/pause', path: fc.constant('/api/v1/pause'), bodies: [{ reason: 'fuzzing' }, {}], allowed: [200, 400, 413, 415] },
];

/** The edge cases of what the controller takes, each with the answer it must give: the body's encoding, NULs, and content types. */
type EdgeCase = { readonly request: RequestBody; readonly status: number; readonly error: RegExp };

/** Just after the opening quote of one of the body's strings (keys included), picked by `at`. */
function insideAString(body: string, at: number): number {
  const quotes = [...body.matchAll(/(?<!\\)"/g)].map((match) => match.index);
  const openings = quotes.filter((_, index) => index % 2 === 0);
  return (openings[at % openings.length] ?? 0) + 1;
}

function edgeCases(bases: readonly unknown[]): fc.Arbitrary<EdgeCase> {
  const text = fc.constantFrom(...bases).map((base) => JSON.stringify(base));
  // Byte sequences no UTF-8 decoder may accept: a lone continuation byte, an overlong "/", a surrogate, a cut-off sequence, bytes past U+10FFFF.
  const invalid = fc.constantFrom([0x80], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xe2, 0x82], [0xf5, 0x80, 0x80, 0x80], [0xff]);
  const json = 'application/json';
  return fc.oneof(
    fc.tuple(text, invalid, fc.nat()).map(([body, bytes, at]): EdgeCase => {
      // Inside a string, so only the encoding is wrong.
      const cut = insideAString(body, at);
      const encoded = Buffer.concat([Buffer.from(body.slice(0, cut)), Buffer.from(bytes), Buffer.from(body.slice(cut))]);
      return { request: { body: new Uint8Array(encoded), contentType: json, shape: 'raw' }, status: 400, error: /^request body is not valid UTF-8$/ };
    }),
    fc.tuple(text, fc.nat()).map(([body, at]): EdgeCase => {
      const cut = insideAString(body, at);
      return {
        request: { body: `${body.slice(0, cut)}\\u0000${body.slice(cut)}`, contentType: json, shape: 'raw' },
        status: 400,
        error: /must not contain a NUL character/,
      };
    }),
    fc
      .tuple(
        text,
        fc.constantFrom(
          'text/plain',
          'application/json; charset=latin1',
          'application/json; charset=utf-16',
          'application/jsonx',
          'application/x-ndjson',
          'text/json',
          'application/vnd.api+json',
          '',
        ),
      )
      .map(([body, type]): EdgeCase => ({
        request: { body, contentType: type, shape: 'raw' },
        status: 415,
        error: /^request body must be sent as "Content-Type: application\/json" \(UTF-8\)/,
      })),
    fc.tuple(text, fc.constantFrom('gzip', 'deflate', 'br', 'x-unknown')).map(([body, encoding]): EdgeCase => ({
      request: { body, contentType: json, contentEncoding: encoding, shape: 'raw' },
      status: 415,
      error: /^request body must not be compressed/,
    })),
  );
}

async function send(
  url: string,
  path: string,
  request: RequestBody,
  method: 'POST' | 'PUT' | 'DELETE' = 'POST',
): Promise<{ status: number; contentType: string; text: string }> {
  const headers: Record<string, string> = { authorization: `Bearer ${TEST_TOKEN}` };
  if (request.contentType !== undefined) headers['content-type'] = request.contentType;
  if (request.contentEncoding !== undefined) headers['content-encoding'] = request.contentEncoding;
  const response = await fetch(`${url}${path}`, { method, headers, body: request.body });
  return { status: response.status, contentType: response.headers.get('content-type') ?? '', text: await response.text() };
}

/** Sends one raw request line, the way no well-behaved client would, and returns the status code answered. */
function rawRequestStatus(port: number, method: string, target: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let received = '';
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(
        `${method} ${target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${TEST_TOKEN}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
      );
    });
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      received += chunk;
    });
    socket.on('error', reject);
    socket.on('close', () => {
      const status = /^HTTP\/1\.1 (\d{3})/.exec(received)?.[1];
      if (status === undefined) reject(new Error(`no status line answered to ${method} ${JSON.stringify(target)}: ${JSON.stringify(received.slice(0, 200))}`));
      else resolve(Number(status));
    });
  });
}

describe('controller HTTP intake under fuzzing', () => {
  const store = testRedis();
  const watch = watchProcess();
  let controller: Controller;
  let url: string;
  let signals: Queue;
  const seeded = new Map<string, unknown>();
  let keepJobBefore: unknown;
  let keepCheckpointsBefore: unknown;

  async function authedGet(path: string): Promise<{ status: number; body: unknown }> {
    const response = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    return { status: response.status, body: await response.json() };
  }

  beforeAll(async () => {
    ({ controller, url } = await startController(
      testConfig(store.url, store.prefix, { controller: { bodyLimitBytes: 65_536, rateLimit: { requestsPerSecond: 0 } } }),
      { workers: false },
    ));
    signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    for (const job of [KEEP_JOB, FUZZ_JOB, SWAP_JOB]) expect((await post(`${url}/api/v1/jobs`, job)).status).toBe(201);
    expect(
      (
        await post(`${url}/api/v1/jobs/keep-job/checkpoints`, [
          { step: 7, rank: 0, tier: 'host', holder: 'keep-00' },
          { step: 7, rank: 1, tier: 'remote' },
        ])
      ).status,
    ).toBe(202);
    // Accepted before the fuzzing: these must come through it untouched.
    const before: [string, unknown][] = [
      ['alerts', ALERT],
      ['signals', FAST_PATH],
      ['signals', [{ ...FAST_PATH, node: 'n08' }, NCCL_TIMEOUT]],
    ];
    for (const [endpoint, body] of before) {
      const accepted = await post(`${url}/api/v1/${endpoint}`, body);
      expect(accepted.status).toBe(202);
      const { byId } = await storedSignals(signals);
      for (const id of accepted.body.ids ?? []) seeded.set(id, byId.get(id));
    }
    await controller.audit.append({ type: 'action', ref: 'fuzz-seed', summary: 'accepted before the fuzzing', data: { kept: true } });
    keepJobBefore = (await authedGet('/api/v1/jobs/keep-job')).body;
    keepCheckpointsBefore = await controller.jobs.checkpoints('keep-job');
  });

  afterAll(async () => {
    REPORT.print();
    watch.stop();
    await signals.close();
    await controller.close();
    await store.cleanup();
  });

  it.each(TARGETS.map((target) => [target.name, target] as const))(
    'answers every fuzzed %s with JSON: a 2xx when valid, a 4xx naming the problem otherwise',
    async (name, target) => {
      await fuzz(
        REPORT,
        name,
        fc.record({ path: target.path, request: requestBodies(target.bodies) }),
        async ({ path, request }) =>
          expectWellFormed(await send(url, path, request, target.method), target.allowed, { path, ...request, body: String(request.body).slice(0, 300) }),
        PER_ENDPOINT,
      );
    },
  );

  it.each(
    TARGETS.filter((target) => target.name.startsWith('POST /api/v1/alerts') || target.name.startsWith('POST /api/v1/signals')).map(
      (target) => [target.name, target] as const,
    ),
  )(
    'refuses every body of %s that is not UTF-8 JSON, holds a NUL, or comes with another content type or an encoding, with the answer naming why',
    async (name, target) => {
      const path = fc.sample(target.path, 1)[0] ?? '';
      await fuzz(
        REPORT,
        `${name} (encodings)`,
        edgeCases(target.bodies),
        async ({ request, status, error }) => {
          const answer = await send(url, path, request);
          const outcome = expectWellFormed(answer, [status], { ...request, body: String(request.body).slice(0, 300) });
          expect((JSON.parse(answer.text) as { error: string }).error).toMatch(error);
          return outcome;
        },
        budget(120, 2),
      );
    },
  );

  it('answers every fuzzed audit query with 200 or a JSON 400', async () => {
    const value = fc.oneof(
      fc.string({ maxLength: 40 }),
      hostileString.map((text) => text.slice(0, 200)),
      fc.integer().map(String),
      fc.constantFrom('0', '10001', '-1', '1.5', '1700000000000-0', 'signal', 'action', '1e3'),
    );
    const query = fc.array(fc.tuple(fc.constantFrom('limit', 'after', 'type', 'node', 'ref', 'other', 'limit[]', '__proto__'), value), { maxLength: 4 });
    await fuzz(
      REPORT,
      'GET /api/v1/audit?query',
      query,
      async (pairs) => {
        const search = new URLSearchParams(pairs).toString();
        const response = await fetch(`${url}/api/v1/audit?${search}`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
        return expectWellFormed(
          { status: response.status, contentType: response.headers.get('content-type') ?? '', text: await response.text() },
          [200, 400],
          search,
        );
      },
      budget(300, 3),
    );
  });

  it('answers every fuzzed request target without a 5xx, the parser refusing what is not HTTP', async () => {
    const { port } = new URL(url);
    const printable = fc.string({ unit: fc.integer({ min: 0x21, max: 0x7e }).map((code) => String.fromCharCode(code)), maxLength: 60 });
    const target = fc
      .tuple(fc.constantFrom('', '/', '/api/v1/', '/api/v1/jobs/', 'http://', '//', 'http://[', '*', '/queues/'), printable)
      .map(([prefix, rest]) => `${prefix}${rest}`);
    await fuzz(
      REPORT,
      'raw request targets',
      fc.tuple(fc.constantFrom('GET', 'POST', 'PUT', 'DELETE', 'OPTIONS', 'PATCH'), target),
      async ([method, path]) => {
        const status = await rawRequestStatus(Number(port), method, path);
        expect(status, `${method} ${path}`).toBeLessThan(500);
        return String(status);
      },
      budget(150, 2),
    );
  });

  it('answers every fuzzed Authorization header with 401 or 403, and a 2xx only to a real credential allowed there', async () => {
    const genuine = [TEST_TOKEN, READ_ONLY_TOKEN, ALERTMANAGER_TOKEN, agentToken('n07'), agentToken('n01'), agentToken('a.b.c')];
    const visible = (text: string): string => text.replace(/[^\x20-\x7e]/g, '');
    const mutated = fc
      .tuple(fc.constantFrom(...genuine), fc.nat(), fc.constantFrom('drop', 'flip', 'append', 'upper', 'swap-node', 'none'))
      .map(([token, at, edit]) => {
        const index = at % token.length;
        if (edit === 'drop') return token.slice(0, index) + token.slice(index + 1);
        if (edit === 'flip') return token.slice(0, index) + (token[index] === 'a' ? 'b' : 'a') + token.slice(index + 1);
        if (edit === 'append') return `${token}${token[index] ?? ''}`;
        if (edit === 'upper') return token.toUpperCase();
        if (edit === 'swap-node') return `n07.${token.split('.').at(-1) ?? ''}`;
        return token;
      });
    const credential = fc.oneof(
      { weight: 4, arbitrary: mutated },
      { weight: 2, arbitrary: hostileString.map((text) => visible(text.slice(0, 300))) },
      { weight: 1, arbitrary: fc.string({ maxLength: 80 }).map(visible) },
    );
    const header = fc
      .tuple(fc.constantFrom('Bearer ', 'bearer  ', 'Basic ', 'Token ', '', 'Bearer\t'), credential, fc.boolean())
      .map(([scheme, token, base64]) => `${scheme}${base64 ? Buffer.from(`user:${token}`).toString('base64') : token}`);
    const allowedHeaders = new Set([
      `Bearer ${TEST_TOKEN}`,
      `bearer  ${TEST_TOKEN}`,
      `Bearer\t${TEST_TOKEN}`,
      ...['Bearer ', 'bearer  ', 'Bearer\t'].map((scheme) => `${scheme}${agentToken('n07')}`),
    ]);
    await fuzz(
      REPORT,
      'Authorization headers on POST /api/v1/signals',
      header,
      async (authorization) => {
        const response = await fetch(`${url}/api/v1/signals`, {
          method: 'POST',
          headers: { authorization, 'content-type': 'application/json' },
          body: JSON.stringify(FAST_PATH),
        });
        const answer = { status: response.status, contentType: response.headers.get('content-type') ?? '', text: await response.text() };
        const outcome = expectWellFormed(answer, [202, 401, 403], authorization);
        if (answer.status === 202) expect(allowedHeaders.has(authorization.trimEnd()), authorization).toBe(true);
        return outcome;
      },
      budget(300, 4),
    );
  });

  it('keeps everything accepted before the fuzzing intact: queued signals, the job, its checkpoints and the audit trail', async () => {
    const { byId } = await storedSignals(signals);
    for (const [id, data] of seeded) expect(byId.get(id), `signal ${id}`).toEqual(data);
    expect(seeded.size).toBeGreaterThanOrEqual(4);
    expect((await authedGet('/api/v1/jobs/keep-job')).body).toEqual(keepJobBefore);
    expect(await controller.jobs.checkpoints('keep-job')).toEqual(keepCheckpointsBefore);

    // Every entry of the audit stream still decodes: a known type, JSON data.
    const rows = await store.redis.xrange(store.keys.audit, '-', '+');
    expect(rows.length).toBeGreaterThan(0);
    for (const [id, fields] of rows) {
      const entry = new Map<string, string>();
      for (let index = 0; index + 1 < fields.length; index += 2) entry.set(fields[index] as string, fields[index + 1] as string);
      expect(AUDIT_TYPES as readonly string[], `audit entry ${id}`).toContain(entry.get('type'));
      expect(() => JSON.parse(entry.get('data') ?? ''), `audit entry ${id} data`).not.toThrow();
    }
    const audit = await authedGet('/api/v1/audit?ref=fuzz-seed');
    expect(audit.body).toMatchObject({ entries: [{ ref: 'fuzz-seed', summary: 'accepted before the fuzzing', data: { kept: true } }] });

    expectNoPrototypePollution();
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
    expect(watch.problems).toEqual([]);
  });
});
