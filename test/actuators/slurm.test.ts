import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DoNotRetryError } from '../../core/errors.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { slurmNode, startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';

describe('Slurm backend against a real slurmctld', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurm-test-'));
  let slurm: SlurmPart;
  let backend: SlurmBackend;

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['gpu-a1', 'gpu-a2']);
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('reads a node in service as existing and not drained', async () => {
    const state = await backend.nodeState('gpu-a1');
    expect(state).toMatchObject({ node: 'gpu-a1', exists: true, drained: false });
  });

  it('drains a node with the reason shown by sinfo, and resumes it', async () => {
    await backend.drain('gpu-a2', 'steadfast: fatal Xid 79 on GPU 0000:3a:00 audit=d-123');
    expect(await slurmNode(slurm, 'gpu-a2')).toEqual({ state: 'drained~', reason: 'steadfast: fatal Xid 79 on GPU 0000:3a:00 audit=d-123' });
    const state = await backend.nodeState('gpu-a2');
    expect(state).toMatchObject({ exists: true, drained: true, reason: 'steadfast: fatal Xid 79 on GPU 0000:3a:00 audit=d-123' });
    await backend.resume('gpu-a2');
    expect((await backend.nodeState('gpu-a2')).drained).toBe(false);
  });

  it('reports a node Slurm does not know as not existing', async () => {
    expect(await backend.nodeState('gpu-zz')).toMatchObject({ exists: false, drained: false });
  });

  it('refuses a node name that could become an option or a second argument, without running scontrol', async () => {
    const missingBinary = new SlurmBackend({ scontrol: '/nonexistent/scontrol', sinfo: '/nonexistent/sinfo', env: slurm.env, timeoutMs: 1000 });
    for (const name of ['--all', 'a b', 'node;reboot', '']) {
      await expect(missingBinary.drain(name, 'x')).rejects.toBeInstanceOf(DoNotRetryError);
    }
  });

  it('keeps a reason with control characters on one printable line', async () => {
    await backend.drain('gpu-a1', 'line one\nline two\tend');
    expect((await slurmNode(slurm, 'gpu-a1')).reason).toBe('line one line two end');
    await backend.resume('gpu-a1');
  });
});

describe('Slurm standbys', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-slurm-standby-'));
  let backend: SlurmBackend;

  beforeAll(async () => {
    const slurm = await startSlurm(group, root, ['sb-1', 'sb-2', 'sb-3']);
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('holds standbys in a maintenance reservation, releases one to a job, and deletes the reservation when empty', async () => {
    expect(await backend.standbys()).toEqual([]);
    await backend.holdStandby('sb-2');
    await backend.holdStandby('sb-3');
    await backend.holdStandby('sb-3');
    expect(await backend.standbys()).toEqual(['sb-2', 'sb-3']);
    await backend.activateStandby('sb-2', 'llama');
    expect(await backend.standbys()).toEqual(['sb-3']);
    await backend.activateStandby('sb-3', 'llama');
    expect(await backend.standbys()).toEqual([]);
    await backend.activateStandby('sb-3', 'llama');
  });
});
