import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DoNotRetryError } from '../../core/errors.js';
import { launchJob } from '../../actuators/launcher.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';

const run = promisify(execFile);

/**
 * Stopping a registered job's Slurm jobs (the ladder's stop step, and before each relaunch) on a
 * real slurmctld: its nodes are CLOUD nodes without slurmd, so held jobs stay pending and are
 * cancelled from the queue.
 */
describe('Slurm backend: cancelling a registered job and launching it in the backend environment', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurm-cancel-'));
  let slurm: SlurmPart;
  let backend: SlurmBackend;

  const submit = async (name: string): Promise<string> => {
    const { stdout } = await run('sbatch', ['--parsable', '--hold', `--job-name=${name}`, `--output=${join(root, '%j.out')}`, '--wrap', 'sleep 300'], {
      env: { ...process.env, ...slurm.env },
    });
    return stdout.trim().split(';')[0] ?? '';
  };
  const queued = async (): Promise<string[]> => {
    const { stdout } = await run('squeue', ['--noheader', '--format=%A %j'], { env: { ...process.env, ...slurm.env } });
    return stdout
      .split('\n')
      .map((line) => line.trim())
      .filter(Boolean)
      .sort();
  };

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['cx-1', 'cx-2']);
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000, cancelWaitMs: 15_000 });
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('cancels every job named after the registered job, waits until squeue no longer lists them, and leaves others alone', async () => {
    const [first, second, other] = [await submit('llama'), await submit('llama'), await submit('llama-eval')];
    expect(await queued()).toEqual([`${first} llama`, `${second} llama`, `${other} llama-eval`].sort());
    expect((await backend.cancelJobs('llama')).sort()).toEqual([first, second].sort());
    expect(await queued()).toEqual([`${other} llama-eval`]);
    // Nothing left under the name: nothing to cancel, no scancel run.
    expect(await backend.cancelJobs('llama')).toEqual([]);
    expect(await backend.cancelJobs('llama-eval')).toEqual([other]);
    expect(await queued()).toEqual([]);
  });

  it('refuses a name that could become an option, without running squeue', async () => {
    const missing = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', squeue: '/nonexistent/squeue', env: slurm.env, timeoutMs: 1000 });
    for (const name of ['--all', '-u root', 'a b', '']) await expect(missing.cancelJobs(name)).rejects.toBeInstanceOf(DoNotRetryError);
  });

  it('runs a Slurm launcher with the backend environment, so sbatch reaches the same slurmctld', async () => {
    const spec = { name: 'llama', nodes: ['cx-1'], ranksPerNode: 1, launcher: 'env', codeVersion: 'v1' };
    const launched = await launchJob(spec, { env: { kind: 'slurm', command: ['printenv', 'SLURM_CONF'] } }, backend);
    expect(launched).toMatchObject({ state: 'launched' });
    expect(launched.detail).toContain(slurm.conf);
  });
});
