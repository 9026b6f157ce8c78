import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import { agentTokenFor } from '../../core/credentials.js';
import type { Controller } from '../../controller/service.js';
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
import { until } from '../support/until.js';

/**
 * Each credential does what its role is for and nothing more (controller/intake/scopes.ts): outside its
 * scope it gets 403 naming its role and the scope needed, counted and audited; an agent's
 * credential speaks for its own node only; the audit names who caused each drain.
 */

const JOB = {
  name: 'scoped',
  nodes: ['node-1', 'node-2'],
  ranksPerNode: 1,
  topology: { dp: 2 },
  launcher: TEST_LAUNCHER,
  codeVersion: 'v1',
};

function xid(node: string, time = new Date().toISOString()): Record<string, unknown> {
  return { kind: 'xid', node, gpu: '0000:3b:00', xid: 79, message: 'GPU has fallen off the bus.', time };
}

interface Answer {
  status: number;
  body: { error?: string; role?: string; node?: string; scope?: string };
}

describe('scoped credentials on the real controller', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let metricsUrl: string;

  async function call(token: string, method: string, path: string, body?: unknown): Promise<Answer> {
    const response = await fetch(`${url}${path}`, {
      method,
      headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    const text = await response.text();
    return { status: response.status, body: text.startsWith('{') ? (JSON.parse(text) as Answer['body']) : {} };
  }

  async function forbiddenCount(): Promise<number> {
    const text = await (await fetch(`${metricsUrl}/metrics`)).text();
    return text
      .split('\n')
      .filter((line) => line.startsWith('steadfast_requests_rejected_total{') && line.includes('reason="forbidden"'))
      .reduce((sum, line) => sum + Number(line.split(' ').at(-1)), 0);
  }

  const accessEntries = (): Promise<AuditEntry[]> => controller.audit.read({ limit: 10_000, type: 'access' });

  beforeAll(async () => {
    ({ controller, url, metricsUrl } = await startController(testConfig(store.url, store.prefix)));
    expect((await call(TEST_TOKEN, 'POST', '/api/v1/jobs', JOB)).status).toBe(201);
  });

  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('lets each role through on the routes of its scope', async () => {
    const [alert] = xidAlertPayload().alerts as Record<string, unknown>[];
    const resolvedAlert = xidAlertPayload({
      status: 'resolved',
      alerts: [{ ...alert, status: 'resolved', labels: { ...(alert?.labels as object), node: 'node-8' } }],
    });
    const allowed: [string, string, string, unknown, number][] = [
      [READ_ONLY_TOKEN, 'GET', '/api/v1/audit?limit=1', undefined, 200],
      [READ_ONLY_TOKEN, 'GET', '/api/v1/jobs', undefined, 200],
      [READ_ONLY_TOKEN, 'GET', '/api/v1/jobs/scoped', undefined, 200],
      [READ_ONLY_TOKEN, 'GET', '/queues/api/queues', undefined, 200],
      [ALERTMANAGER_TOKEN, 'POST', '/api/v1/alerts', resolvedAlert, 202],
      [agentToken('node-1'), 'POST', '/api/v1/signals', { ...xid('node-1'), xid: 31 }, 202],
      [agentToken('node-1'), 'GET', '/api/v1/standby/node-1', undefined, 200],
      [agentToken('node-1'), 'POST', '/api/v1/jobs/scoped/checkpoints', [{ step: 10, rank: 0, tier: 'host', holder: 'node-1' }], 202],
      [agentToken('node-2'), 'POST', '/api/v1/jobs/scoped/checkpoints', [{ step: 10, rank: 1, tier: 'host', holder: 'node-2' }], 202],
      [agentToken('node-2'), 'GET', '/api/v1/jobs/scoped/restore-plan', undefined, 200],
      [TEST_TOKEN, 'GET', '/api/v1/audit?limit=1', undefined, 200],
      [TEST_TOKEN, 'POST', '/api/v1/jobs/scoped/code-updates', { version: 'v2' }, 202],
    ];
    for (const [token, method, path, body, status] of allowed) {
      const answer = await call(token, method, path, body);
      expect(answer.status, `${method} ${path}: ${JSON.stringify(answer.body)}`).toBe(status);
    }
  });

  it('answers a credential outside its scope with 403 naming its role and the scope needed, counts it and audits it', async () => {
    const before = await forbiddenCount();
    const refused: [string, string, string, string, unknown, string][] = [
      [READ_ONLY_TOKEN, 'read-only', 'POST', '/api/v1/jobs', JOB, 'operate'],
      [READ_ONLY_TOKEN, 'read-only', 'POST', '/api/v1/alerts', xidAlertPayload(), 'alerts'],
      [ALERTMANAGER_TOKEN, 'alertmanager', 'POST', '/api/v1/signals', xid('node-1'), 'signals'],
      [ALERTMANAGER_TOKEN, 'alertmanager', 'GET', '/api/v1/audit', undefined, 'read'],
      [agentToken('node-1'), 'agent', 'POST', '/api/v1/alerts', xidAlertPayload(), 'alerts'],
      [agentToken('node-1'), 'agent', 'GET', '/api/v1/audit', undefined, 'read'],
      [agentToken('node-1'), 'agent', 'POST', '/api/v1/jobs/scoped/code-updates', { version: 'v3' }, 'operate'],
      [agentToken('node-1'), 'agent', 'DELETE', '/api/v1/jobs/scoped', undefined, 'operate'],
    ];
    for (const [token, role, method, path, body, scope] of refused) {
      const answer = await call(token, method, path, body);
      expect(answer.status, `${role} ${method} ${path}`).toBe(403);
      expect(answer.body.error).toBe(`role ${role} may not ${method} ${path}: it needs scope "${scope}"`);
      expect(answer.body).toMatchObject({ role, scope });
    }
    expect(await forbiddenCount()).toBe(before + refused.length);
    const entries = await until('the refusals audited', accessEntries, (found) =>
      refused.every(([, role, method, path]) => found.some((entry) => entry.actor?.role === role && entry.data.method === method && entry.data.path === path)),
    );
    const jobsRefusal = entries.find((entry) => entry.actor?.role === 'read-only' && entry.data.path === '/api/v1/jobs');
    expect(jobsRefusal).toMatchObject({ type: 'access', actor: { role: 'read-only' }, data: { method: 'POST', path: '/api/v1/jobs', scope: 'operate' } });
    expect(jobsRefusal?.summary).toBe('refused read-only: POST /api/v1/jobs (role read-only may not POST /api/v1/jobs: it needs scope "operate")');
    // Nothing the refused requests carried was acted on.
    expect((await controller.jobs.get('scoped')).spec.codeVersion).toBe('v1');
  });

  it("refuses an agent speaking about another node (fast path, standby, a job not on its node), stores nothing of the batch, and audits it with the agent's node", async () => {
    const before = await controller.audit.read({ limit: 10_000, type: 'signal' });
    const time = new Date().toISOString();
    const other = await call(agentToken('node-1'), 'POST', '/api/v1/signals', xid('node-9', time));
    expect(other.status).toBe(403);
    expect(other.body).toMatchObject({ role: 'agent', node: 'node-1', scope: 'signals' });
    expect(other.body.error).toBe('agent node-1 may not report a fault about node node-9: its credential is bound to node-1');
    const mixed = await call(agentToken('node-1'), 'POST', '/api/v1/signals', [xid('node-1', time), xid('node-9', time)]);
    expect(mixed.status).toBe(403);
    expect((await call(agentToken('node-1'), 'GET', '/api/v1/standby/node-2')).status).toBe(403);
    expect((await call(agentToken('node-1'), 'POST', '/api/v1/standby/node-2/self-check', { ok: true })).status).toBe(403);
    const foreignJob = await call(agentToken('node-7'), 'POST', '/api/v1/jobs/scoped/checkpoints', [{ step: 20, rank: 0, tier: 'host', holder: 'node-7' }]);
    expect(foreignJob.status).toBe(403);
    expect(foreignJob.body.error).toBe('agent node-7 may not POST /api/v1/jobs/scoped/checkpoints: job scoped does not run on node-7');

    const entries = await until(
      'the refusals audited',
      accessEntries,
      (found) =>
        found.filter(
          (entry) => entry.actor?.node === 'node-1' && entry.data.scope !== 'read' && entry.data.scope !== 'alerts' && entry.data.scope !== 'operate',
        ).length >= 4,
    );
    const signalRefusal = entries.find((entry) => entry.actor?.node === 'node-1' && entry.data.path === '/api/v1/signals');
    expect(signalRefusal).toMatchObject({ node: 'node-1', actor: { role: 'agent', node: 'node-1' }, data: { method: 'POST', scope: 'signals' } });
    expect(entries.some((entry) => entry.actor?.node === 'node-1' && entry.data.path === '/api/v1/standby/node-2/self-check')).toBe(true);
    expect(entries.some((entry) => entry.actor?.node === 'node-7' && entry.data.path === '/api/v1/jobs/scoped/checkpoints')).toBe(true);
    // Not even node-1's own event of the mixed batch was stored.
    const after = await controller.audit.read({ limit: 10_000, type: 'signal' });
    expect(after.filter((entry) => entry.node === 'node-9')).toEqual([]);
    expect((await controller.jobs.checkpoints('scoped')).some((shard) => shard.step === 20)).toBe(false);
    expect(after.length).toBe(before.length);
  });

  it('turns away an agent token made with another secret, or with its node name swapped, as unknown (401)', async () => {
    const foreign = agentTokenFor('some-other-secret-0123456789abcdef0123', 'node-1');
    const swapped = `node-2.${agentToken('node-1').split('.').at(-1) ?? ''}`;
    for (const token of [foreign, swapped, `${agentToken('node-1')}0`, agentToken('node-1').toUpperCase()]) {
      const answer = await call(token, 'POST', '/api/v1/signals', xid('node-2'));
      expect(answer.status, token).toBe(401);
      expect(answer.body.error).toBe('invalid bearer token');
    }
  });

  it('records who caused a drain: the agent and its node for a fast-path signal, Alertmanager for an alert', async () => {
    expect((await call(agentToken('node-5'), 'POST', '/api/v1/signals', xid('node-5'))).status).toBe(202);
    expect((await call(ALERTMANAGER_TOKEN, 'POST', '/api/v1/alerts', xidAlertPayload())).status).toBe(202);
    const drained = (node: string) => (entries: AuditEntry[]) =>
      entries.some((entry) => entry.type === 'action' && entry.node === node && entry.data.state === 'done');
    const all = () => controller.audit.read({ limit: 10_000 });
    await until('both drains done', all, (entries) => drained('node-5')(entries) && drained('node-3')(entries));
    const entries = await all();
    for (const [node, actor] of [
      ['node-5', { role: 'agent', node: 'node-5' }],
      ['node-3', { role: 'alertmanager' }],
    ] as const) {
      const trail = entries.filter((entry) => entry.node === node && entry.type !== 'access');
      expect(trail.map((entry) => entry.type)).toEqual(expect.arrayContaining(['signal', 'decision', 'action']));
      for (const entry of trail) expect(entry.actor, `${entry.type} ${entry.summary}`).toEqual(actor);
    }
  });

  it('audits refusals of one credential at a bounded rate, while every one is still refused and counted', async () => {
    const flooder = agentToken('flood-node');
    const before = await forbiddenCount();
    const attempts = 60;
    for (let index = 0; index < attempts; index += 1) {
      expect((await call(flooder, 'GET', '/api/v1/audit')).status).toBe(403);
    }
    expect(await forbiddenCount()).toBe(before + attempts);
    const audited = await until(
      'the first refusals audited',
      accessEntries,
      (found) => found.filter((entry) => entry.actor?.node === 'flood-node').length >= 10,
    );
    expect(audited.filter((entry) => entry.actor?.node === 'flood-node').length).toBeLessThan(attempts);
  });
});
