import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DoNotRetryError } from '../../core/errors.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';

describe('Slurm reboot for the remedies against a real slurmctld', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurm-reboot-'));
  let slurm: SlurmPart;
  let backend: SlurmBackend;

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['gpu-r1', 'gpu-r2']);
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('passes the reboot to slurmctld for a node it knows, and fails for good for one it does not know', async () => {
    // The nodes here are powered-down CLOUD nodes without slurmd: slurmctld accepts the request
    // and has nothing to reboot, so the reboot step's check afterwards (node out of service?)
    // is what decides whether it counts; see test/actuators/steps/node-remedies.test.ts.
    await expect(backend.reboot('gpu-r1', 'steadfast: 3 GPU resets within 604800 s audit=d-1', 'resume')).resolves.toBeUndefined();
    await expect(backend.reboot('gpu-zz', 'steadfast: test', 'down')).rejects.toBeInstanceOf(DoNotRetryError);
    expect((await backend.nodeState('gpu-r2')).drained).toBe(false);
  });

  it('refuses a node name that could become an option, without running scontrol', async () => {
    const missing = new SlurmBackend({ scontrol: '/nonexistent/scontrol', sinfo: '/nonexistent/sinfo', env: slurm.env, timeoutMs: 1000 });
    await expect(missing.reboot('--all', 'x', 'down')).rejects.toBeInstanceOf(DoNotRetryError);
  });
});
