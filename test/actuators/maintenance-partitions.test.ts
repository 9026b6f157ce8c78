import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SafetyGates } from '../../actuators/safety.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import { silentLogger } from '../../core/log.js';
import { maintenanceWindowSchema, type MaintenanceWindow } from '../../core/remedy-config.js';
import { startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { testRedis } from '../support/redis.js';

/** Maintenance windows by Slurm partition, resolved through a real slurmctld. */
describe('maintenance windows by partition', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-maint-partition-'));
  const store = testRedis();
  let slurm: SlurmPart;
  let backend: SlurmBackend;

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['gpu-m1', 'gpu-m2', 'gpu-m3', 'gpu-m4'], { partitions: { rack7: ['gpu-m1', 'gpu-m2'], spare: ['gpu-m4'] } });
    backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
    await store.cleanup();
  });

  const window = (fields: Record<string, unknown>): MaintenanceWindow =>
    maintenanceWindowSchema.parse({
      name: 'rack7-firmware',
      start: new Date(Date.now() - 60_000).toISOString(),
      end: new Date(Date.now() + 3600_000).toISOString(),
      ...fields,
    });
  const gates = (windows: MaintenanceWindow[]) =>
    new SafetyGates(
      store.redis,
      store.keys,
      { maxPerWindow: 10, windowSeconds: 60 },
      30,
      windows,
      (partition) => backend.partitionNodes(partition),
      silentLogger(),
    );

  it("reads a partition's nodes from Slurm and refuses actions on them while the window is open, not on the others", async () => {
    expect(await backend.partitionNodes('rack7')).toEqual(['gpu-m1', 'gpu-m2']);
    const open = gates([window({ partitions: ['rack7'] })]);
    expect(await open.checkHolds(['gpu-m2'])).toMatchObject({ ok: false, gate: 'hold', reason: expect.stringContaining('gpu-m2 (window rack7-firmware') });
    expect(await open.checkHolds(['gpu-m3'])).toEqual({ ok: true });
    // Standby sizing sees the same nodes.
    expect([...open.inMaintenance().keys()].sort()).toEqual(['gpu-m1', 'gpu-m2']);
  });

  it('joins partitions and nodes in one window, and covers nothing for a partition Slurm does not know', async () => {
    const mixed = gates([window({ partitions: ['spare', 'no-such-partition'], nodes: ['gpu-m3'] })]);
    await mixed.refreshPartitions();
    expect([...mixed.inMaintenance().keys()].sort()).toEqual(['gpu-m3', 'gpu-m4']);
    expect(await mixed.checkHolds(['gpu-m1'])).toEqual({ ok: true });
  });

  it('refuses a partition name that could become an option, and a window that names nothing', async () => {
    await expect(backend.partitionNodes('--all')).rejects.toThrow(/invalid partition name/);
    expect(() => window({ partitions: ['--all'] })).toThrow(/Slurm partition name/);
    expect(() => window({})).toThrow(/must name nodes, partitions or both/);
    expect(() => new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 60 }, 30, [window({ partitions: ['rack7'] })])).toThrow(
      /only the Slurm backend knows/,
    );
  });
});
