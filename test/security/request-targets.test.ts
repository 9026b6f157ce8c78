import { readdirSync, readFileSync } from 'node:fs';
import { request } from 'node:http';
import { join, resolve } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { roleHasScope, ROUTE_SCOPES, type RouteScope } from '../../controller/intake/scopes.js';
import { requestTargetProblem } from '../../controller/intake/request-target.js';
import type { Controller } from '../../controller/service.js';
import type { Role } from '../../core/credentials.js';
import {
  ALERTMANAGER_TOKEN,
  READ_ONLY_TOKEN,
  TEST_LAUNCHER,
  TEST_TOKEN,
  agentToken,
  startController,
  testConfig,
  xidAlertPayload,
} from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * The scope a request is held to is the scope of the route whose handler runs, whatever the
 * request target looks like. Request targets a router could read otherwise than they were sent
 * (a fragment, a backslash, encoded separators, dot segments, absolute-form) are refused with
 * 400 before anything else: with an agent's token, `POST /api/v1/jobs/#/checkpoints` once
 * registered a job, and `POST /api/v1/jobs/j2\code-updates#/checkpoints` relaunched one.
 */

const JOB = 'victim';
const NODES = ['n00', 'n01'];

interface Credential {
  readonly name: string;
  readonly token: string | undefined;
  readonly role: Role | undefined;
  /** An agent of a node outside the job: every request here is about n00 or the job, so its node binding refuses it. */
  readonly foreignNode?: true;
}

const CREDENTIALS: readonly Credential[] = [
  { name: 'operator', token: TEST_TOKEN, role: 'operator' },
  { name: 'read-only', token: READ_ONLY_TOKEN, role: 'read-only' },
  { name: 'alertmanager', token: ALERTMANAGER_TOKEN, role: 'alertmanager' },
  { name: 'agent of a node of the job', token: agentToken('n00'), role: 'agent' },
  { name: 'agent of another node', token: agentToken('n05'), role: 'agent', foreignNode: true },
  { name: 'none', token: undefined, role: undefined },
];

/** A request each route would carry out: a valid body, so that only the credential stands in the way. */
/** Routes about no node: any agent may call them (which Xid codes to send on the fast path). */
const NODE_FREE_ROUTES: ReadonlySet<string> = new Set(['/api/v1/xid-policy']);

function body(route: RouteScope): unknown {
  const now = new Date().toISOString();
  switch (`${route.method} ${route.path}`) {
    case 'POST /api/v1/alerts':
      return xidAlertPayload({
        alerts: [
          {
            status: 'firing',
            labels: { alertname: 'SteadfastXidFatal', node: 'n01', pci_bus_id: '0000:3a:00', xid: '79', severity: 'critical' },
            annotations: {},
            startsAt: now,
          },
        ],
      });
    case 'POST /api/v1/signals':
      return { kind: 'xid', node: 'n00', gpu: '0000:3a:00', xid: 13, message: 'Graphics Exception', time: now };
    case 'POST /api/v1/standby/:node/self-check':
      return { ok: true };
    case 'POST /api/v1/jobs/:id/checkpoints':
      return [{ step: 10, rank: 0, tier: 'host', holder: 'n00' }];
    case 'POST /api/v1/jobs':
      return { name: 'evil', nodes: ['n09'], ranksPerNode: 1, launcher: TEST_LAUNCHER, codeVersion: 'v1' };
    case 'PUT /api/v1/jobs/:id/policy':
      return { recovery: true };
    case 'POST /api/v1/jobs/:id/code-updates':
      return { version: 'pwned', urgent: true };
    case 'POST /api/v1/pause':
      return { reason: 'drill' };
    case 'PUT /api/v1/holds/:node':
      return { reason: 'drill', durationSeconds: 60 };
    default:
      return undefined;
  }
}

/** The route's path with its parameters filled in. */
function concrete(route: RouteScope): string {
  return route.path.replace(':id', JOB).replace(':node', 'n00');
}

/** Ways to write a target, each with whether it is still a plain path (then it must reach its own route, or none). */
const MUTATIONS: readonly { readonly name: string; readonly apply: (path: string, other: string) => string; readonly plain: boolean }[] = [
  { name: 'as sent', apply: (path) => path, plain: true },
  { name: 'upper case', apply: (path) => path.toUpperCase(), plain: true },
  { name: 'a query', apply: (path) => `${path}?limit=5`, plain: true },
  { name: 'a fragment naming another route', apply: (path, other) => `${path}#${other}`, plain: false },
  {
    name: 'a fragment in the middle',
    apply: (path, other) => `${path.slice(0, path.lastIndexOf('/') + 1)}#${other.slice(other.lastIndexOf('/'))}`,
    plain: false,
  },
  { name: 'a backslash', apply: (path) => path.replace(/\/([^/]*)$/, '\\$1'), plain: false },
  { name: 'a backslash before a fragment', apply: (path, other) => `${path.replace(/\/([^/]*)$/, '\\$1')}#${other}`, plain: false },
  { name: 'an encoded slash', apply: (path) => path.replace(/\/([^/]*)$/, '%2F$1'), plain: false },
  { name: 'an encoded backslash', apply: (path) => path.replace(/\/([^/]*)$/, '%5c$1'), plain: false },
  { name: 'an encoded hash', apply: (path, other) => `${path}%23${other}`, plain: false },
  { name: 'a dot segment', apply: (path) => path.replace('/api/v1/', '/api/v1/./'), plain: false },
  { name: 'a dot-dot segment', apply: (path, other) => `${other}/../..${path}`, plain: false },
  { name: 'an encoded dot segment', apply: (path) => path.replace('/api/v1/', '/api/v1/%2e%2e/v1/'), plain: false },
  { name: 'absolute form', apply: (path) => `http://127.0.0.1${path}`, plain: false },
  { name: 'a leading double slash', apply: (path) => `//${path}`, plain: false },
];

interface Answer {
  readonly status: number;
  readonly body: { error?: string; scope?: string };
}

/** One request with `target` sent exactly as given (fetch would normalise it). */
function send(port: number, method: string, target: string, token: string | undefined, payload: unknown): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const text = payload === undefined ? undefined : JSON.stringify(payload);
    const req = request(
      {
        host: '127.0.0.1',
        port,
        method,
        path: target,
        headers: {
          ...(token ? { authorization: `Bearer ${token}` } : {}),
          ...(text ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) } : {}),
        },
      },
      (res) => {
        let data = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (data += chunk));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: data.startsWith('{') ? (JSON.parse(data) as Answer['body']) : {} }));
      },
    );
    req.on('error', reject);
    req.end(text);
  });
}

describe('request targets and route scopes on the real controller', () => {
  const store = testRedis();
  let controller: Controller;
  let port: number;

  /** Puts the job back as it was, whatever an earlier request did to it. */
  async function resetJob(): Promise<void> {
    const existing = await send(port, 'GET', `/api/v1/jobs/${JOB}`, TEST_TOKEN, undefined);
    if (existing.status === 200) return;
    const created = await send(port, 'POST', '/api/v1/jobs', TEST_TOKEN, {
      name: JOB,
      nodes: NODES,
      ranksPerNode: 1,
      launcher: TEST_LAUNCHER,
      codeVersion: 'v1',
    });
    expect(created.status).toBe(201);
  }

  beforeAll(async () => {
    const started = await startController(testConfig(store.url, store.prefix, { safety: { maxDrainsPerWindow: 1000 } }));
    controller = started.controller;
    port = Number(new URL(started.url).port);
    await resetJob();
  });

  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it('registers every route of the API through apiRoute, which checks its scope: no handler is added to a router or app directly', () => {
    const dir = resolve(import.meta.dirname, '../../controller');
    const direct = readdirSync(dir)
      .filter((file) => file.endsWith('.ts') && file !== 'routes.ts')
      .flatMap((file) =>
        readFileSync(join(dir, file), 'utf8')
          .split('\n')
          .map((line, index) => ({ where: `controller/${file}:${index + 1}`, line }))
          .filter(({ line }) => /\b(router|app|api)\.(get|post|put|patch|delete|all)\(/.test(line)),
      )
      // The one route outside the API: the health check, open to all.
      .filter(({ line }) => !line.includes("app.get('/healthz'"));
    expect(direct).toEqual([]);
  });

  it('refuses with 400 the targets a router reads otherwise, and lets plain paths through', () => {
    for (const target of [
      '/api/v1/jobs/#/checkpoints',
      '/api/v1/jobs/j2\\code-updates#/checkpoints',
      '/api/v1/jobs/j2%2Fcode-updates',
      '/api/v1/jobs/j2/../jobs',
      'http://x/api/v1/jobs',
      '*',
      '//api/v1/jobs',
    ]) {
      expect(requestTargetProblem(target), target).toBeDefined();
    }
    for (const target of ['/api/v1/jobs/llama-7b/checkpoints', '/api/v1/audit?ref=a%2Fb', '/healthz', '/api/v1/jobs/v1.2']) {
      expect(requestTargetProblem(target), target).toBeUndefined();
    }
  });

  it('refuses the two smuggled requests that once registered a job and relaunched another with an agent token', async () => {
    const evilJob = await send(port, 'POST', '/api/v1/jobs/#/checkpoints', agentToken('n00'), {
      name: 'evil',
      nodes: ['n05'],
      ranksPerNode: 1,
      launcher: TEST_LAUNCHER,
      codeVersion: 'v1',
    });
    expect(evilJob.status).toBe(400);
    expect(evilJob.body.error).toMatch(/must not contain "#"/);
    const relaunch = await send(port, 'POST', `/api/v1/jobs/${JOB}\\code-updates#/checkpoints`, agentToken('n00'), { version: 'pwned', urgent: true });
    expect(relaunch.status).toBe(400);
    const everySpec = await send(port, 'GET', '/api/v1/jobs/#/microbatches', agentToken('n00'), undefined);
    expect(everySpec.status).toBe(400);
    expect((await send(port, 'GET', '/api/v1/jobs/evil', TEST_TOKEN, undefined)).status).toBe(404);
    expect((await controller.jobs.get(JOB)).spec.codeVersion).toBe('v1');
  });

  it('holds every route to its own scope for every credential when the path is plain: a 2xx only with the scope (and the node), a 403 naming it otherwise', async () => {
    for (const route of ROUTE_SCOPES) {
      for (const credential of CREDENTIALS) {
        await resetJob();
        const answer = await send(port, route.method, concrete(route), credential.token, body(route));
        const label = `${credential.name}: ${route.method} ${route.path} → ${answer.status} ${answer.body.error ?? ''}`;
        if (credential.role === undefined) {
          expect(answer.status, label).toBe(401);
        } else if (!roleHasScope(credential.role, route.scope) || (credential.foreignNode && !NODE_FREE_ROUTES.has(route.path))) {
          expect(answer.status, label).toBe(403);
          expect(answer.body.scope, label).toBe(route.scope);
        } else {
          expect([401, 403], label).not.toContain(answer.status);
        }
      }
    }
  }, 120_000);

  it('never answers 2xx to a credential without the scope of the route that ran, whatever the target (property)', async () => {
    const routes = ROUTE_SCOPES;
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom(...routes),
        fc.constantFrom(...routes),
        fc.constantFrom(...CREDENTIALS),
        fc.constantFrom(...MUTATIONS),
        async (route, other, credential, mutation) => {
          await resetJob();
          const target = mutation.apply(concrete(route), concrete(other));
          const answer = await send(port, route.method, target, credential.token, body(route));
          const label = `${credential.name}: ${route.method} ${target} (${mutation.name}) → ${answer.status} ${answer.body.error ?? ''}`;
          if (!mutation.plain) {
            expect(answer.status, label).toBe(400);
            return;
          }
          if (answer.status >= 200 && answer.status < 300)
            expect(credential.role !== undefined && roleHasScope(credential.role, route.scope), label).toBe(true);
          // A refusal names the scope of the route the target reached: its own, never another's.
          if (answer.status === 403) expect(answer.body.scope, label).toBe(route.scope);
        },
      ),
      { numRuns: 400, seed: 20261128 },
    );
  }, 180_000);
});
