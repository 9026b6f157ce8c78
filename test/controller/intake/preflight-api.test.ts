import { afterEach, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../../core/audit.js';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import type { Controller } from '../../../controller/service.js';
import { agentToken, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { LLAMA as JOB } from '../../support/steps.js';
import { until } from '../../support/until.js';

/**
 * POST /api/v1/jobs/:id/preflight: a job's preflight (clients/python/steadfast_preflight.py)
 * names the nodes whose link failed the all-reduce; the controller takes each out as a machine
 * fault — the job's ladder evicts it onto a warm standby and relaunches — audited with the
 * reporting node's identity, and refuses a report from outside the job or naming nodes outside it.
 */
describe('the preflight report', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(): Promise<{ store: ReturnType<typeof testRedis>; controller: Controller; url: string }> {
    const store = testRedis();
    stores.push(store);
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    controllers.push(controller);
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.backend.holdStandby('spare-1');
    return { store, controller, url };
  }

  const report = { nodes: ['n01'], detail: 'all-reduce among 4 nodes took 1.9s against a threshold of 0.25s; pair tests named n01', seconds: 4.2, run: '81' };

  it("evicts the named node onto a warm standby and relaunches the job, audited as the reporting node's", async () => {
    const { store, controller, url } = await setUp();
    const answer = await post(`${url}/api/v1/jobs/llama/preflight`, report, agentToken('n02'));
    expect(answer.status).toBe(202);
    expect(answer.body.accepted).toBe(1);
    const job = await until(
      'the job back to running on the standby',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
    );
    expect(job.spec.nodes).toEqual(['n00', 'spare-1', 'n02', 'n03']);
    const drained = await new DryRunBackend(store.redis, store.keys).recorded();
    expect(Object.keys(drained)).toEqual(['n01']);
    expect(drained.n01).toContain('preflight: the all-reduce across job llama named n01');
    const entries: AuditEntry[] = await controller.audit.read({ limit: 100 });
    const signal = entries.find((entry) => entry.type === 'signal' && entry.node === 'n01');
    expect(signal?.summary).toBe(
      'agent reports preflight_failed on n01; job llama: machine fault (preflight: the all-reduce across job llama named n01 in 4.2 s)',
    );
    expect(signal?.actor).toEqual({ role: 'agent', node: 'n02' });
    const decisions = entries.filter((entry) => entry.type === 'decision').map((entry) => /^llama: (\S+)/.exec(entry.summary)?.[1]);
    expect(decisions).toEqual(['stop', 'evict', 'restart']);
  });

  it('stores a retried report of one run once', async () => {
    const { controller, url } = await setUp();
    const first = await post(`${url}/api/v1/jobs/llama/preflight`, report, agentToken('n02'));
    const again = await post(`${url}/api/v1/jobs/llama/preflight`, report, agentToken('n02'));
    expect(again.body.ids).toEqual(first.body.ids);
    await until(
      'the job relaunched',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
    );
    const signals = (await controller.audit.read({ limit: 100 })).filter((entry) => entry.type === 'signal');
    expect(signals).toHaveLength(1);
  });

  it('refuses a report from a node outside the job, one naming a node outside the job, and a malformed one, storing nothing', async () => {
    const { store, controller, url } = await setUp();
    const stranger = await post(`${url}/api/v1/jobs/llama/preflight`, report, agentToken('x9'));
    expect(stranger.status).toBe(403);
    expect(stranger.body.error).toContain('job llama does not run on x9');
    const outside = await post(`${url}/api/v1/jobs/llama/preflight`, { ...report, nodes: ['n01', 'x9'] }, agentToken('n02'));
    expect(outside.status).toBe(403);
    expect(outside.body.error).toContain('may name only its nodes (n00, n01, n02, n03), not x9');
    const empty = await post(`${url}/api/v1/jobs/llama/preflight`, { ...report, nodes: [] }, agentToken('n02'));
    expect(empty.status).toBe(400);
    expect(empty.body.error).toMatch(/nodes/);
    const unknown = await post(`${url}/api/v1/jobs/ghost/preflight`, report);
    expect(unknown.status).toBe(404);
    const entries = await controller.audit.read({ limit: 100 });
    expect(entries.filter((entry) => entry.type === 'signal')).toEqual([]);
    // The refusals themselves are on the record, with the node that tried.
    expect(entries.some((entry) => entry.type === 'access' && /may name only its nodes/.test(entry.summary))).toBe(true);
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
  });
});
