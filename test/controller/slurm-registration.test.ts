import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SlurmBackend } from '../../actuators/slurm.js';
import type { Controller } from '../../controller/service.js';
import { startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

const run = promisify(execFile);

/**
 * A controller on a real slurmctld (CLOUD nodes without slurmd: submitted jobs stay pending):
 * a registration naming a node Slurm does not know is refused, and a job whose Slurm job a person
 * cancelled is marked finished, its nodes out of its ladder.
 */
describe('job registration and job end on the Slurm backend', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurm-registration-'));
  const store = testRedis();
  let slurm: SlurmPart;
  let controller: Controller;
  let url: string;
  const JOB = { name: 'llama', nodes: ['cx-1', 'cx-2'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'accept', codeVersion: 'v1' };

  const submit = async (name: string): Promise<string> => {
    const { stdout } = await run('sbatch', ['--parsable', '--hold', `--job-name=${name}`, `--output=${join(root, '%j.out')}`, '--wrap', 'sleep 300'], {
      env: { ...process.env, ...slurm.env },
    });
    return stdout.trim().split(';')[0] ?? '';
  };

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['cx-1', 'cx-2']);
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { backend: { kind: 'slurm', slurm: { env: slurm.env } } })));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('refuses a job naming a node slurmctld does not know, and takes one on its nodes', async () => {
    const refused = await post(`${url}/api/v1/jobs`, { ...JOB, nodes: ['cx-1', 'cx-9'] });
    expect(refused.status).toBe(400);
    expect(refused.body.error).toBe('job.nodes: not known to the slurm backend: cx-9');
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
  });

  it("reads a workload's state by its name: pending is active, cancelled is cancelled, none is unknown", async () => {
    const backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
    expect((await backend.workloadState('nobody')).state).toBe('unknown');
    const id = await submit('probe');
    expect(await backend.workloadState('probe')).toEqual({ state: 'active', detail: `Slurm job ${id} is PENDING` });
    await run('scancel', [id], { env: { ...process.env, ...slurm.env } });
    await until(
      'the cancel',
      () => backend.workloadState('probe'),
      (state) => state.state !== 'active',
    );
    expect(await backend.workloadState('probe')).toEqual({ state: 'cancelled', detail: `Slurm job ${id} named probe ended CANCELLED` });
  });

  it('marks a registered job finished once its Slurm job was cancelled, and its nodes leave it', async () => {
    const id = await submit('llama');
    // Pending: the job is not over, whatever the ticks see.
    expect((await controller.jobs.get('llama')).state).toBe('running');
    await run('scancel', [id], { env: { ...process.env, ...slurm.env } });
    const finished = await until(
      'job finished',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'finished',
      30_000,
    );
    expect(finished.stateReason).toBe(`Slurm job ${id} named llama ended CANCELLED`);
    expect(await controller.jobs.jobOnNode('cx-1')).toBeUndefined();
    expect((await controller.audit.read({ limit: 50 })).map((entry) => entry.summary)).toContain(
      `llama: finished (Slurm job ${id} named llama ended CANCELLED); its nodes leave its recovery ladder`,
    );
  });
});
