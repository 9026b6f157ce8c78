import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { SafetyGates } from '../../../actuators/safety.js';
import type { AuditEntry } from '../../../core/audit.js';
import type { Controller } from '../../../controller/service.js';
import { TEST_TOKEN, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * The operator's controls on a real controller and Redis (dry-run backend): launchers by name
 * from the configuration, nodes the backend knows, unregistering a job, holding a node, and a
 * job's own recovery and dry-run policy.
 */

const dir = mkdtempSync(join(tmpdir(), 'steadfast-operator-'));
const launches = join(dir, 'launches.txt');

/** A launcher that records each launch's filled placeholders in a file, one line per launch. */
const RECORDING_LAUNCHERS = { recorder: { kind: 'slurm', command: ['sh', '-c', `echo "$0 $1 $2" >> ${launches}`, '{job}', '{nodes}', '{version}'] } };
const KNOWN_NODES = ['n00', 'n01', 'n02', 'n03', 'spare-1', 'lone-1'];

const JOB = {
  name: 'llama',
  nodes: ['n00', 'n01', 'n02', 'n03'],
  ranksPerNode: 1,
  topology: { pp: 2, dp: 2, order: 'tp-dp-pp' },
  launcher: 'recorder',
  codeVersion: 'v1',
};

async function call(url: string, method: string, path: string, body?: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(`${url}${path}`, {
    method,
    headers: { authorization: `Bearer ${TEST_TOKEN}`, 'content-type': 'application/json' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

const xid = (node: string): Record<string, unknown> => ({
  kind: 'xid',
  node,
  gpu: '0000:18:00',
  xid: 79,
  message: 'GPU has fallen off the bus.',
  time: new Date().toISOString(),
});
const actions = (entries: AuditEntry[]): AuditEntry[] => entries.filter((entry) => entry.type === 'action');

describe('operator controls on a running controller', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
    rmSync(launches, { force: true });
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  async function setUp(
    overrides: Parameters<typeof testConfig>[2] = {},
  ): Promise<{ store: ReturnType<typeof testRedis>; controller: Controller; url: string }> {
    const store = testRedis();
    stores.push(store);
    const config = testConfig(store.url, store.prefix, { launchers: RECORDING_LAUNCHERS, backend: { dryRun: { nodes: KNOWN_NODES } }, ...overrides });
    const { controller, url } = await startController(config);
    controllers.push(controller);
    return { store, controller, url };
  }

  it('refuses a registration carrying a command, naming an unknown launcher or an unknown node, with 400 and the reason', async () => {
    const { controller, url } = await setUp();
    const argv = await post(`${url}/api/v1/jobs`, { ...JOB, launcher: { kind: 'slurm', command: ['sbatch', '--wrap=id', 'train.sh'] } });
    expect(argv.status).toBe(400);
    expect(argv.body.error).toMatch(/launcher: must name a launcher from the controller configuration \(launchers:\); a registration carries no command/);
    const path = await post(`${url}/api/v1/jobs`, { ...JOB, launcher: '/usr/bin/sbatch' });
    expect(path.status).toBe(400);
    expect(path.body.error).toContain('launcher');
    const unknown = await post(`${url}/api/v1/jobs`, { ...JOB, launcher: 'mystery' });
    expect(unknown.status).toBe(400);
    expect(unknown.body.error).toBe('job.launcher: "mystery" is not a launcher of this controller (configured: accept, recorder)');
    const stranger = await post(`${url}/api/v1/jobs`, { ...JOB, nodes: ['n00', 'evil.example.com', 'n02', 'n03'] });
    expect(stranger.status).toBe(400);
    expect(stranger.body.error).toBe('job.nodes: not known to the dry-run backend: evil.example.com');
    expect(await controller.jobs.list()).toEqual([]);
  });

  it('relaunches a job through the named launcher, its placeholders filled from the job', async () => {
    const { controller, url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect((await post(`${url}/api/v1/jobs/llama/code-updates`, { version: 'v2', urgent: true })).status).toBe(202);
    await until(
      'the relaunch',
      async () => (existsSync(launches) ? readFileSync(launches, 'utf8') : ''),
      (text) => text.length > 0,
    );
    expect(readFileSync(launches, 'utf8')).toBe('llama n00,n01,n02,n03 v2\n');
    await until(
      'job running v2',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.codeVersion === 'v2',
    );
  });

  it('unregisters a job: its record, ladder and node index go, and the audit says so', async () => {
    const { store, controller, url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect(await controller.jobs.jobOnNode('n01')).toBe('llama');
    const deleted = await call(url, 'DELETE', '/api/v1/jobs/llama');
    expect(deleted).toEqual({ status: 200, body: { deleted: 'llama', was: 'running' } });
    expect((await call(url, 'GET', '/api/v1/jobs/llama')).status).toBe(404);
    expect(await controller.jobs.jobOnNode('n01')).toBeUndefined();
    expect(await store.redis.exists(store.keys.jobLadder('llama'))).toBe(0);
    expect((await controller.audit.read({ limit: 50 })).map((entry) => entry.summary)).toContain(
      'llama: unregistered by an operator (was running); n00, n01, n02, n03 no longer belong to it',
    );
    expect((await call(url, 'DELETE', '/api/v1/jobs/llama')).status).toBe(404);
    // A fault on its former node is now a plain drain, not a recovery of the job.
    expect((await post(`${url}/api/v1/signals`, xid('n01'))).status).toBe(202);
    await until(
      'the drain',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (recorded) => 'n01' in recorded,
    );
  });

  it('records signals about a held node but never drains it; once released, the next fault is acted on at once, within the dedupe window', async () => {
    // The default 15-minute dedupe window: the refused decision must not hold the node's claim through it.
    const { store, controller, url } = await setUp();
    const held = await call(url, 'PUT', '/api/v1/holds/lone-1', { reason: 'DIMM swap', durationSeconds: 3600 });
    expect(held.status).toBe(200);
    expect(held.body).toMatchObject({ node: 'lone-1', reason: 'DIMM swap' });
    expect((await call(url, 'GET', '/api/v1/holds')).body.holds).toEqual([expect.objectContaining({ node: 'lone-1', reason: 'DIMM swap' })]);
    expect((await post(`${url}/api/v1/signals`, xid('lone-1'))).status).toBe(202);
    const refused = await until(
      'the refusal',
      () => controller.audit.read({ limit: 100 }),
      (entries) => actions(entries).some((entry) => entry.data.state === 'refused'),
    );
    expect(refused.some((entry) => entry.type === 'signal' && entry.node === 'lone-1')).toBe(true);
    expect(actions(refused).find((entry) => entry.data.state === 'refused')?.data.detail).toMatch(
      /^held for maintenance by an operator: lone-1 \(DIMM swap, until /,
    );
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});

    expect((await call(url, 'DELETE', '/api/v1/holds/lone-1')).status).toBe(200);
    expect((await call(url, 'DELETE', '/api/v1/holds/lone-1')).status).toBe(404);
    // A fatal Xid on another GPU of the node: a new decision, acted on now.
    expect((await post(`${url}/api/v1/signals`, { ...xid('lone-1'), gpu: '0000:3b:00' })).status).toBe(202);
    await until(
      'the drain after the release',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (recorded) => 'lone-1' in recorded,
    );
  });

  it('refuses every drain while paused; once unpaused, the next fault on a node refused meanwhile is acted on at once', async () => {
    const { store, controller, url } = await setUp();
    expect((await call(url, 'POST', '/api/v1/pause', { reason: 'switch firmware' })).status).toBe(200);
    expect((await post(`${url}/api/v1/signals`, xid('lone-1'))).status).toBe(202);
    const refused = await until(
      'the refusal',
      () => controller.audit.read({ limit: 100 }),
      (entries) => actions(entries).some((entry) => entry.data.state === 'refused'),
    );
    expect(actions(refused).find((entry) => entry.data.state === 'refused')?.data.detail).toMatch(/paused/);
    expect((await call(url, 'DELETE', '/api/v1/pause')).status).toBe(200);
    expect((await post(`${url}/api/v1/signals`, { ...xid('lone-1'), gpu: '0000:3b:00' })).status).toBe(202);
    await until(
      'the drain after the pause',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (recorded) => 'lone-1' in recorded,
    );
    const joined = (await controller.audit.read({ limit: 100 })).filter((entry) => entry.type === 'signal' && /already being drained/.test(entry.summary));
    expect(joined).toEqual([]);
  });

  it('refuses to evict a held node of a job, and never takes a held node as its standby', async () => {
    const { store, controller, url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.backend.holdStandby('spare-1');
    expect((await call(url, 'PUT', '/api/v1/holds/n01', { reason: 'cable reseat' })).status).toBe(200);
    expect((await post(`${url}/api/v1/signals`, xid('n01'))).status).toBe(202);
    const entries = await until(
      'the refused eviction',
      () => controller.audit.read({ limit: 100 }),
      (list) => actions(list).some((entry) => entry.data.verb === 'evict' && entry.data.state === 'refused'),
    );
    expect(actions(entries).find((entry) => entry.data.verb === 'evict')?.data.detail).toMatch(/held for maintenance by an operator: n01 \(cable reseat/);
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
    expect((await controller.jobs.get('llama')).spec.nodes).toContain('n01');
  });

  it('answers bad holds with 400 naming the field', async () => {
    const { url } = await setUp();
    expect((await call(url, 'PUT', '/api/v1/holds/n01', {})).body.error).toMatch(/reason/);
    expect((await call(url, 'PUT', '/api/v1/holds/n01', { reason: 'x', until: '2001-01-01T00:00:00Z' })).body.error).toBe('hold.until: must be in the future');
    expect((await call(url, 'PUT', '/api/v1/holds/n01', { reason: 'x', durationSeconds: 10 })).status).toBe(400);
    expect(
      (await call(url, 'PUT', '/api/v1/holds/n01', { reason: 'x', until: new Date(Date.now() + 3600_000).toISOString(), durationSeconds: 600 })).body.error,
    ).toMatch(/not both/);
    expect((await call(url, 'PUT', '/api/v1/holds/-rf', { reason: 'x' })).body.error).toMatch(/node/);
  });

  it('lets a hold expire by itself', async () => {
    const store = testRedis();
    stores.push(store);
    const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 600 }, 30);
    const now = Date.now();
    await gates.hold('n01', 'firmware', now + 60_000, now);
    expect(await gates.checkHolds(['n00', 'n01'], now + 59_000)).toMatchObject({ ok: false, gate: 'hold' });
    expect(await gates.acquireLease('n01', 'drain-1')).toMatchObject({ ok: false, gate: 'hold' });
    expect(await gates.checkHolds(['n00', 'n01'], now + 60_001)).toEqual({ ok: true });
    expect([...(await gates.holds(now + 60_001)).keys()]).toEqual([]);
  });

  it("with recovery off, refuses the ladder's acting steps with the reason on the audit", async () => {
    const { store, controller, url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.backend.holdStandby('spare-1');
    expect(await call(url, 'PUT', '/api/v1/jobs/llama/policy', { recovery: false })).toEqual({
      status: 200,
      body: { job: 'llama', policy: { recovery: false, dryRun: false } },
    });
    expect((await call(url, 'GET', '/api/v1/jobs/llama')).body.job).toMatchObject({ policy: { recovery: false, dryRun: false } });
    expect((await post(`${url}/api/v1/signals`, xid('n01'))).status).toBe(202);
    const entries = await until(
      'the refused steps',
      () => controller.audit.read({ limit: 100 }),
      (list) => actions(list).filter((entry) => entry.data.state === 'refused').length >= 3,
    );
    const refused = actions(entries).filter((entry) => entry.data.state === 'refused');
    expect(refused.map((entry) => entry.data.verb)).toEqual(['stop', 'evict', 'restart']);
    for (const entry of refused) expect(entry.data.detail).toBe("automatic recovery is off for job llama (the operator's job policy); not acting");
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
    expect(existsSync(launches)).toBe(false);
    expect(
      (await controller.audit.read({ limit: 100 })).some((entry) => entry.summary === 'llama: job policy set by an operator: recovery off, dry-run off'),
    ).toBe(true);
  });

  it('with dry-run on for one job, describes its relaunch instead of running the launcher', async () => {
    const { controller, url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect((await call(url, 'PUT', '/api/v1/jobs/llama/policy', { dryRun: true })).body).toEqual({ job: 'llama', policy: { recovery: true, dryRun: true } });
    expect((await post(`${url}/api/v1/jobs/llama/code-updates`, { version: 'v2', urgent: true })).status).toBe(202);
    const entries = await until(
      'the described restart',
      () => controller.audit.read({ limit: 100 }),
      (list) => actions(list).some((entry) => entry.data.verb === 'restart'),
    );
    const restart = actions(entries).find((entry) => entry.data.verb === 'restart');
    expect(restart?.data.detail).toMatch(/^dry-run: would run \["sh","-c",".*","llama","n00,n01,n02,n03","v2"\]/);
    expect(existsSync(launches)).toBe(false);
  });

  it('answers a bad policy with 400 naming the field, and an unknown job with 404', async () => {
    const { url } = await setUp();
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    expect((await call(url, 'PUT', '/api/v1/jobs/llama/policy', {})).body.error).toMatch(/give recovery, dryRun or both/);
    expect((await call(url, 'PUT', '/api/v1/jobs/llama/policy', { recovery: 'off' })).body.error).toMatch(/recovery/);
    expect((await call(url, 'PUT', '/api/v1/jobs/llama/policy', { recovery: true, shell: 'id' })).status).toBe(400);
    expect((await call(url, 'PUT', '/api/v1/jobs/ghost/policy', { recovery: false })).status).toBe(404);
  });

  it('pauses and unpauses every actuator over HTTP, with the reason and the budget', async () => {
    const { controller, url } = await setUp();
    const paused = await call(url, 'POST', '/api/v1/pause', { reason: 'rack 7 maintenance' });
    expect(paused).toEqual({ status: 200, body: { paused: true, reason: 'rack 7 maintenance', drainsInWindow: 0, maxPerWindow: 4, windowSeconds: 3600 } });
    expect(await controller.gates.paused()).toBe('rack 7 maintenance');
    expect((await call(url, 'DELETE', '/api/v1/pause')).body).toMatchObject({ paused: false });
    expect(await controller.gates.paused()).toBeUndefined();
    expect((await call(url, 'POST', '/api/v1/pause', { reason: 7 })).status).toBe(400);
  });
});
