import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../../controller/service.js';
import { productiveShare } from '../../../controller/job-store.js';
import { TEST_TOKEN, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';

const JOB = {
  name: 'llama-8b',
  nodes: ['n00', 'n01', 'n02', 'n03'],
  ranksPerNode: 1,
  topology: { tp: 1, pp: 2, dp: 2, order: 'tp-dp-pp' },
  launcher: 'accept',
  codeVersion: 'v1',
};

async function get(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const response = await fetch(url, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
  return { status: response.status, body: (await response.json()) as Record<string, unknown> };
}

describe('jobs API', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix), { workers: false }));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
  });

  it('registers a job with a sizes topology and answers 409 for the same name again', async () => {
    const created = await post(`${url}/api/v1/jobs`, JOB);
    expect(created.status).toBe(201);
    expect((created.body as { job: { state: string; spec: { name: string } } }).job).toMatchObject({ state: 'running', spec: { name: 'llama-8b' } });
    const again = await post(`${url}/api/v1/jobs`, JOB);
    expect(again.status).toBe(409);
    expect(again.body.error).toBe('job llama-8b is already registered');
  });

  it('rejects a job whose topology does not fit its nodes, naming the problem', async () => {
    const bad = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'bad', topology: { tp: 8 } });
    expect(bad.status).toBe(400);
    expect(bad.body.error).toMatch(/tp\*cp\*ep\*dp\*pp = 8 but nodes\*ranksPerNode = 4/);
    const shell = await post(`${url}/api/v1/jobs`, { ...JOB, name: 'shell', launcher: { kind: 'slurm', command: 'sbatch train.sh' } });
    expect(shell.status).toBe(400);
    expect(shell.body.error).toContain('launcher');
  });

  it('lists jobs and reads one with its ETTR; an unknown job is 404', async () => {
    const list = await get(`${url}/api/v1/jobs`);
    expect((list.body.jobs as { spec: { name: string } }[]).map((job) => job.spec.name)).toContain('llama-8b');
    const one = await get(`${url}/api/v1/jobs/llama-8b`);
    expect(one.status).toBe(200);
    expect(one.body.ettr).toEqual({ cumulative: 1, window1h: 1 });
    expect((await get(`${url}/api/v1/jobs/nope`)).status).toBe(404);
  });

  it('takes checkpoint shards and plans a restore around evicted nodes', async () => {
    const shards = [10, 20].flatMap((step) =>
      [0, 1, 2, 3].flatMap((rank) => [
        { step, rank, tier: 'host', holder: `n0${rank}` },
        { step, rank, tier: 'peer', holder: `n0${3 - rank}` },
      ]),
    );
    const accepted = await post(`${url}/api/v1/jobs/llama-8b/checkpoints`, shards);
    expect(accepted.status).toBe(202);
    expect(accepted.body.accepted).toBe(16);
    const plan = await get(`${url}/api/v1/jobs/llama-8b/restore-plan?evicted=n01`);
    expect(plan.status).toBe(200);
    expect(plan.body.step).toBe(20);
    expect((plan.body.sources as { rank: number; tier: string; holder: string }[])[1]).toMatchObject({ rank: 1, tier: 'peer', holder: 'n02' });
    const lost = await get(`${url}/api/v1/jobs/llama-8b/restore-plan?evicted=n01,n02`);
    expect(lost.status).toBe(409);
    const badShard = await post(`${url}/api/v1/jobs/llama-8b/checkpoints`, { step: 1, rank: 0, tier: 'host' });
    expect(badShard.status).toBe(400);
    expect(badShard.body.error).toContain('holder');
  });

  it('tells a standby node its role and an active node its job', async () => {
    await controller.backend.holdStandby('spare-1');
    expect((await get(`${url}/api/v1/standby/spare-1`)).body).toEqual({ node: 'spare-1', role: 'standby' });
    expect((await get(`${url}/api/v1/standby/n02`)).body).toEqual({ node: 'n02', role: 'active', job: 'llama-8b' });
    expect((await get(`${url}/api/v1/standby/other`)).body).toEqual({ node: 'other', role: 'unassigned' });
  });

  it('refuses with 409 a job that names a node of a running job, keeps that node with its job, and takes it once that job is unregistered', async () => {
    const first = { name: 'first', nodes: ['m00', 'm01'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' };
    const second = { name: 'second', nodes: ['m01', 'm02'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' };
    expect((await post(`${url}/api/v1/jobs`, first)).status).toBe(201);
    const taken = await post(`${url}/api/v1/jobs`, second);
    expect(taken.status).toBe(409);
    expect(taken.body.error).toBe(
      'job second cannot be registered: m01 belongs to job first; a node joins another job only once that job finished or was unregistered',
    );
    // Nothing of the refused job was written, and the node still answers for the job it runs.
    expect((await get(`${url}/api/v1/jobs/second`)).status).toBe(404);
    expect(await controller.jobs.jobOnNode('m01')).toBe('first');
    expect(await controller.jobs.jobOnNode('m02')).toBeUndefined();
    expect((await get(`${url}/api/v1/standby/m01`)).body).toMatchObject({ role: 'active', job: 'first' });

    const deleted = await fetch(`${url}/api/v1/jobs/first`, { method: 'DELETE', headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(deleted.status).toBe(200);
    expect((await post(`${url}/api/v1/jobs`, second)).status).toBe(201);
    expect(await controller.jobs.jobOnNode('m01')).toBe('second');
    // Both changes of the node map are on record, with who made them.
    const audit = await controller.audit.read({ limit: 100 });
    const summaries = audit
      .filter((entry) => entry.data.verb === 'register' || entry.data.verb === 'unregister')
      .map((entry) => `${entry.summary} [${entry.actor?.role ?? '-'}]`);
    expect(summaries).toEqual(
      expect.arrayContaining([
        'first: registered on m00, m01, version v1 [operator]',
        'first: unregistered by an operator (was running); m00, m01 no longer belong to it [operator]',
        'second: registered on m01, m02, version v1 [operator]',
      ]),
    );
  });

  it("lets a finished job's nodes join another job", async () => {
    expect((await post(`${url}/api/v1/jobs`, { name: 'done-soon', nodes: ['k00'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' })).status).toBe(201);
    await controller.jobs.finish('done-soon', 'its workload ended');
    expect((await post(`${url}/api/v1/jobs`, { name: 'next', nodes: ['k00'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' })).status).toBe(201);
  });

  it('keeps the jobs API behind the token', async () => {
    expect((await fetch(`${url}/api/v1/jobs`)).status).toBe(401);
  });
});

describe('ETTR bookkeeping', () => {
  it("counts productive time in a window from the job's transitions", () => {
    const transitions = [
      { at: 0, productive: true },
      { at: 600, productive: false },
      { at: 900, productive: true },
    ];
    expect(productiveShare(transitions, 0, 1200)).toBeCloseTo(900 / 1200, 12);
    expect(productiveShare(transitions, 700, 1200)).toBeCloseTo(300 / 500, 12);
    expect(productiveShare([], 0, 10)).toBe(0);
  });
});
