import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { OwnDrains } from '../../actuators/own-drains.js';
import { returnToService } from '../../actuators/return-to-service.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { slurmNode, startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { testRedis } from '../support/redis.js';

const run = promisify(execFile);

/**
 * Others' drains on a real slurmctld: an administrator's `scontrol update State=DRAIN Reason=…`
 * stays first when steadfast drains too, and steadfast's resume takes only its own part away;
 * after its own remedy, a node goes back only when Redis says this decision took it out.
 */
describe("Slurm: others' drains are kept", () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-foreign-drains-'));
  const stores: ReturnType<typeof testRedis>[] = [];
  let slurm: SlurmPart;
  let backend: SlurmBackend;

  /** What an administrator types. */
  const adminDrain = (node: string, reason: string) =>
    run('scontrol', ['update', `NodeName=${node}`, 'State=DRAIN', `Reason=${reason}`], { env: { ...process.env, ...slurm.env } });

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['fd-1', 'fd-2', 'fd-3']);
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
  });
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it("appends steadfast's reason after an administrator's, and a resume lifts only steadfast's part", async () => {
    await adminDrain('fd-1', 'admin: fan replacement');
    expect(await backend.nodeState('fd-1')).toMatchObject({ drained: true, foreign: 'admin: fan replacement' });

    await backend.drain('fd-1', 'steadfast: GPU reset refused audit=d-1');
    expect(await slurmNode(slurm, 'fd-1')).toMatchObject({ reason: 'admin: fan replacement; steadfast: GPU reset refused audit=d-1' });
    // A second drain of steadfast's replaces its own part only.
    await backend.drain('fd-1', 'steadfast: reboot asked audit=d-2');
    expect(await slurmNode(slurm, 'fd-1')).toMatchObject({ reason: 'admin: fan replacement; steadfast: reboot asked audit=d-2' });

    await backend.resume('fd-1');
    const kept = await slurmNode(slurm, 'fd-1');
    expect(kept.state).toMatch(/^drain/);
    expect(kept.reason).toBe('admin: fan replacement');

    await backend.resume('fd-1', { force: true });
    expect((await backend.nodeState('fd-1')).drained).toBe(false);
  });

  it('returns a node after its own remedy only when this decision took it out and no one else drained it since', async () => {
    const store = testRedis();
    stores.push(store);
    const ownDrains = new OwnDrains(store.redis, store.keys);
    const deps = { backend, ownDrains };

    // steadfast drains; an administrator drains again on top (Slurm replaces the reason).
    await ownDrains.record('fd-2', 'd-10', 'steadfast: GPU reset audit=d-10');
    await backend.drain('fd-2', 'steadfast: GPU reset audit=d-10');
    await adminDrain('fd-2', 'admin: BIOS update');
    const kept = await returnToService(deps, 'fd-2', { decisionId: 'd-10' });
    expect(kept).toMatchObject({ returned: false, foreign: 'admin: BIOS update' });
    expect(await slurmNode(slurm, 'fd-2')).toMatchObject({ reason: 'admin: BIOS update' });
    await backend.resume('fd-2', { force: true });

    // A reason that only looks like steadfast's: no record of taking it out.
    await adminDrain('fd-3', 'steadfast: copied by hand');
    expect(await returnToService(deps, 'fd-3', { decisionId: 'd-11' })).toMatchObject({ returned: false });
    expect((await backend.nodeState('fd-3')).drained).toBe(true);
    await backend.resume('fd-3', { force: true });

    // Its own drain alone, under this decision: back in service.
    await ownDrains.record('fd-2', 'd-12', 'steadfast: GPU reset audit=d-12');
    await backend.drain('fd-2', 'steadfast: GPU reset audit=d-12');
    expect(await returnToService(deps, 'fd-2', { decisionId: 'd-12' })).toMatchObject({ returned: true, already: false });
    expect((await backend.nodeState('fd-2')).drained).toBe(false);
    expect(await ownDrains.get('fd-2')).toBeUndefined();
  });
});
