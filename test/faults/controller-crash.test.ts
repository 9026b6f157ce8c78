import { chmodSync, existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { SlurmBackend } from '../../actuators/slurm.js';
import { AuditLog, type AuditEntry } from '../../core/audit.js';
import { JobStore } from '../../controller/job-store.js';
import { ControlPlane } from '../../sim/control-plane.js';
import { ControllerProcess } from '../../sim/controller-process.js';
import { freePort, waitFor } from '../../sim/processes.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * kill -9 of the controller in the middle of a recovery: a fatal Xid evicts a node of a
 * registered job, and the controller process dies while `scontrol update … State=DRAIN` is in
 * flight (the command itself completes, as it would on a real head node). After a restart the
 * recovery finishes — a standby takes the node's place and the job is relaunched — and nothing
 * is evicted twice: one drain in slurmctld's log, one eviction and one standby in the audit.
 */

const JOB_NODES = ['c-01', 'c-02', 'c-03', 'c-04'];
const SPARES = ['c-spare-1', 'c-spare-2'];
const VICTIM = 'c-02';

describe('a controller killed with SIGKILL mid-recovery', () => {
  const store = testRedis();
  let plane: ControlPlane;
  let controller: ControllerProcess;
  let marker: string;

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: [...JOB_NODES, ...SPARES], redisUrl: inject('redisUrl') });
    // A slow scontrol: a drain takes a few seconds, long enough to kill the controller during it.
    marker = join(plane.root, 'drain-started');
    const slowScontrol = join(plane.root, 'scontrol-slow');
    writeFileSync(slowScontrol, `#!/bin/sh\ncase "$*" in *State=DRAIN*) touch '${marker}'; sleep 3;; esac\nexec scontrol "$@"\n`);
    chmodSync(slowScontrol, 0o755);
    const config = plane.controllerConfig(store.prefix, {
      controller: { port: await freePort() },
      backend: { kind: 'slurm', slurm: { scontrol: slowScontrol, env: { ...plane.slurm.env } } },
    });
    controller = new ControllerProcess(plane.processes, { name: 'controller', dir: plane.root, config });
    await controller.start();
  }, 90_000);

  afterAll(async () => {
    await controller?.stop();
    await plane?.stop();
    await store.cleanup();
  });

  const api = async (path: string, body: unknown): Promise<number> => {
    const response = await fetch(`${controller.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${plane.token}` }, body: JSON.stringify(body) });
    await response.arrayBuffer();
    return response.status;
  };

  it('finishes the recovery after a restart, evicting the node once and activating one standby', async () => {
    const registered = await api('/api/v1/jobs', {
      name: 'crash-job',
      nodes: JOB_NODES,
      ranksPerNode: 1,
      topology: { pp: 2, dp: 2, order: 'tp-dp-pp' },
      launcher: { kind: 'slurm', command: ['true', '{job}', '{nodes}', '{version}'] },
      codeVersion: 'v1',
    });
    expect(registered).toBe(201);
    const backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: plane.slurm.env, timeoutMs: 10_000 });
    for (const spare of SPARES) await backend.holdStandby(spare);

    const xid = { kind: 'xid', node: VICTIM, gpu: '0000:3a:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
    expect(await api('/api/v1/signals', xid)).toBe(202);
    await waitFor('the eviction\'s drain to start', async () => existsSync(marker), 30_000, 20);
    await controller.kill();
    await controller.start();

    const jobs = new JobStore(store.redis, store.keys);
    const job = await until(
      'the job running again on a standby',
      () => jobs.get('crash-job'),
      (record) => record.state === 'running' && !record.spec.nodes.includes(VICTIM),
      // BullMQ gives a dead worker's job back to the queue once its lock (30 s) has expired and
      // two stalled-job checks (one per 30 s across all workers) have seen it: 30 to 60 s.
      90_000,
    );

    expect(job.spec.nodes).toEqual(['c-01', 'c-spare-1', 'c-03', 'c-04']);
    expect(plane.slurmDrains(VICTIM)).toBe(1);
    expect([...plane.slurmDrainCounts().keys()]).toEqual([VICTIM]);
    expect(await backend.standbys()).toEqual(['c-spare-2']);

    const audit: AuditEntry[] = await new AuditLog(store.redis, store.keys).read({ limit: 10_000 });
    const lines = audit.map((entry) => `${entry.type}: ${entry.summary}`);
    const evictions = audit.filter((entry) => entry.type === 'action' && entry.data.verb === 'evict' && entry.node === VICTIM && entry.data.state === 'done');
    expect(evictions, lines.join('\n')).toHaveLength(1);
    // The drain the killed controller started had landed; its successor saw that and did not drain again.
    expect(evictions[0]?.summary).toMatch(/^crash-job: evict c-02: done \(already out of service/);
    expect(lines.filter((line) => /evict c-spare-\d: done \(standby c-spare-\d activated in place of c-02\)/.test(line))).toHaveLength(1);
    expect(lines.filter((line) => line.startsWith('decision: crash-job: evict'))).toHaveLength(1);
  }, 150_000);
});
