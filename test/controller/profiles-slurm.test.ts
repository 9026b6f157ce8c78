import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { SlurmBackend } from '../../actuators/slurm.js';
import type { AuditEntry } from '../../core/audit.js';
import { profilesSchema, type Profile } from '../../core/profiles.js';
import { ProfileResolver } from '../../controller/profile-resolver.js';
import type { Controller } from '../../controller/service.js';
import { startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/** An agent's fast-path report of Xid 79 (the catalogue's remedy: reboot the node) on `node`. */
function xid79(node: string): Record<string, unknown> {
  return { kind: 'xid', node, gpu: '0000:3a:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
}

const ENDED = new Set(['done', 'refused', 'failed']);
const REASON = 'fatal Xid 79 (GPU has fallen off the bus) on GPU 0000:3a:00';

/**
 * Profiles on a real slurmctld and Redis, through the whole controller (intake, policy worker,
 * step processor): the burn-in partition in dry-run with a budget of one drain, the training
 * partition that never reboots, and a node two partitions' profiles claim. Reboots are on for
 * every node in no profile.
 */
describe('profiles per node group on the Slurm backend', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-profiles-'));
  const store = testRedis();
  let slurm: SlurmPart;
  let slurmBackend: SlurmBackend;
  let controller: Controller;
  let url: string;
  let profiles: Profile[];

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['bi-1', 'bi-2', 'tr-1', 'tr-2', 'gp-1', 'ov-1'], {
      partitions: { 'burn-in': ['bi-1', 'bi-2'], train: ['tr-1', 'tr-2', 'ov-1'], rack9: ['ov-1'] },
    });
    slurmBackend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: slurm.env, timeoutMs: 10_000 });
    const config = testConfig(store.url, store.prefix, {
      backend: { kind: 'slurm', slurm: { env: slurm.env } },
      remedies: { reboot: { enabled: true } },
      safety: { maxDrainsPerWindow: 10 },
    });
    profiles = profilesSchema.parse([
      { name: 'burn-in', match: { partitions: ['burn-in'] }, dryRun: true, safety: { maxDrainsPerWindow: 1 }, remedies: { reboot: false } },
      { name: 'train', match: { partitions: ['train'] }, safety: { maxDrainsPerWindow: 3 }, remedies: { reboot: false } },
      { name: 'rack9', match: { partitions: ['rack9'] } },
    ]);
    ({ controller, url } = await startController({ ...config, profiles }));
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  /** Reports Xid 79 on `node` and waits until its decision's action has ended; answers the node's audit entries. */
  async function fault(node: string): Promise<{ decision: AuditEntry | undefined; action: AuditEntry | undefined }> {
    expect((await post(`${url}/api/v1/signals`, xid79(node))).status).toBe(202);
    const entries = await until(
      `the action on ${node} to end`,
      () => controller.audit.read({ node }),
      (list) => list.some((entry) => entry.type === 'action' && ENDED.has(String(entry.data.state))),
    );
    return {
      decision: entries.find((entry) => entry.type === 'decision'),
      action: entries.find((entry) => entry.type === 'action' && ENDED.has(String(entry.data.state))),
    };
  }

  it("records a burn-in node's drain without doing it, spends only burn-in's own budget, and drains a training node for real", async () => {
    const first = await fault('bi-1');
    expect(first.decision?.summary).toBe(`drain bi-1: ${REASON} [profile burn-in]`);
    expect(first.decision?.data.profile).toBe('burn-in');
    expect(first.action?.summary).toMatch(/^drain bi-1: done \(drained \(dry-run\): steadfast: fatal Xid 79 .* audit=d-\w+\) \[profile burn-in\]$/);
    expect(first.action?.data).toMatchObject({ state: 'done', backend: 'dry-run', profile: 'burn-in' });
    // Recorded, not done: Slurm still schedules on the node.
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['bi-1']);
    expect((await slurmBackend.nodeState('bi-1')).drained).toBe(false);

    // Burn-in's budget (one drain) is spent ...
    const second = await fault('bi-2');
    expect(second.action?.data).toMatchObject({ state: 'refused', detail: 'eviction budget exhausted: 1 drains per 3600 s already used', profile: 'burn-in' });
    // ... and the training partition's is whole: its node is drained in Slurm.
    const train = await fault('tr-1');
    expect(train.decision?.summary).toBe(`drain tr-1: ${REASON} [profile train]`);
    expect(train.action?.data).toMatchObject({ state: 'done', backend: 'slurm', profile: 'train' });
    const state = await slurmBackend.nodeState('tr-1');
    expect(state.drained).toBe(true);
    expect(state.reason).toContain('fatal Xid 79');
  });

  it('drains a node of a profile with reboot off where a node in no profile is rebooted, with the global settings and entries as before', async () => {
    const plain = await fault('gp-1');
    expect(plain.decision?.summary).toBe(`reboot gp-1: ${REASON}; the catalogue's remedy is a node reboot`);
    expect(plain.decision?.data.profile).toBeUndefined();
    expect(plain.action?.summary).not.toContain('[profile');
    const noReboot = await fault('tr-2');
    expect(noReboot.decision?.summary).toBe(`drain tr-2: ${REASON} [profile train]`);
    expect((await slurmBackend.nodeState('tr-2')).drained).toBe(true);
  });

  it('tells, for the startup log, how many nodes each profile covers as Slurm lists its partitions', async () => {
    const resolver = new ProfileResolver(profiles, { partitionNodes: (partition) => slurmBackend.partitionNodes(partition) });
    expect(await resolver.describe()).toEqual([
      { name: 'burn-in', nodes: 2, byLabels: false },
      { name: 'train', nodes: 3, byLabels: false },
      { name: 'rack9', nodes: 1, byLabels: false },
    ]);
  });

  it('takes no automatic action on a node two profiles match, and audits why naming both', async () => {
    const conflicted = await fault('ov-1');
    // Its decision follows the global settings (no profile is its own); the step is refused.
    expect(conflicted.action?.data).toMatchObject({ state: 'refused', verb: 'reboot' });
    expect(conflicted.action?.data.detail).toBe(
      'node ov-1 is matched by profiles "train" and "rack9": a configuration error; no automatic action on it until one profile matches',
    );
    expect((await slurmBackend.nodeState('ov-1')).drained).toBe(false);
  });
});
