import { chmodSync, existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { SlurmBackend } from '../../actuators/slurm.js';
import { AuditLog, type AuditEntry } from '../../core/audit.js';
import { JobStore } from '../../controller/job-store.js';
import { ControlPlane } from '../../tryit/control-plane.js';
import { ControllerProcess } from '../../tryit/controller-process.js';
import { freePort, waitFor } from '../../tryit/processes.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * kill -9 of the controller in the middle of a recovery: a fatal Xid evicts a node of a
 * registered job, and the controller process dies while `scontrol update … State=DRAIN` is in
 * flight (the command itself completes, as it would on a real head node). After a restart the
 * recovery finishes — a standby takes the node's place and the job is relaunched — and nothing
 * is evicted twice: one drain in slurmctld's log, one eviction and one standby in the audit.
 *
 * How soon it resumes is the `queues:` config: the dead worker's lock must lapse and a
 * stalled-job check must have seen the job twice (core/queues.ts), so within about
 * lockDurationSeconds + 2 × stalledIntervalSeconds of the new controller being up. The test runs
 * with a short lock and measures it.
 */

const JOB_NODES = ['c-01', 'c-02', 'c-03', 'c-04'];
const SPARES = ['c-spare-1', 'c-spare-2'];
const VICTIM = 'c-02';
/** Short enough to measure in a test; long enough that a loaded machine does not lose a live lock. */
const QUEUES = { lockDurationSeconds: 5, stalledIntervalSeconds: 2 };
/** The time the new controller's recovery worker may take to pick the job up, by the mechanism. */
const RESUME_BOUND_MS = (QUEUES.lockDurationSeconds + 2 * QUEUES.stalledIntervalSeconds) * 1000;
/** Scheduling and the step's own Slurm read on a shared two-core machine. */
const SLACK_MS = 4000;

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
    const config = {
      ...plane.controllerConfig(store.prefix, {
        controller: { port: await freePort() },
        backend: { kind: 'slurm', slurm: { scontrol: slowScontrol, env: { ...plane.slurm.env } } },
      }),
      queues: QUEUES,
    };
    controller = new ControllerProcess(plane.processes, { name: 'controller', dir: plane.root, config });
    await controller.start();
  }, 90_000);

  afterAll(async () => {
    await controller?.stop();
    await plane?.stop();
    await store.cleanup();
  });

  const api = async (path: string, body: unknown): Promise<number> => {
    const response = await fetch(`${controller.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${plane.credentials.operator}` },
      body: JSON.stringify(body),
    });
    await response.arrayBuffer();
    return response.status;
  };

  it('finishes the recovery after a restart, evicting the node once and activating one standby', async () => {
    const registered = await api('/api/v1/jobs', {
      name: 'crash-job',
      nodes: JOB_NODES,
      ranksPerNode: 1,
      topology: { pp: 2, dp: 2, order: 'tp-dp-pp' },
      launcher: 'accept',
      codeVersion: 'v1',
    });
    expect(registered).toBe(201);
    const backend = new SlurmBackend({ scontrol: 'scontrol', sinfo: 'sinfo', env: plane.slurm.env, timeoutMs: 10_000 });
    for (const spare of SPARES) await backend.holdStandby(spare);

    const xid = { kind: 'xid', node: VICTIM, gpu: '0000:3a:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
    expect(await api('/api/v1/signals', xid)).toBe(202);
    await waitFor("the eviction's drain to start", async () => existsSync(marker), 30_000, 20);
    const killedAt = Date.now();
    await controller.kill();
    await controller.start();
    const upAt = Date.now();

    const jobs = new JobStore(store.redis, store.keys);
    const job = await until(
      'the job running again on a standby',
      () => jobs.get('crash-job'),
      (record) => record.state === 'running' && !record.spec.nodes.includes(VICTIM),
      RESUME_BOUND_MS + SLACK_MS + 20_000,
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
    // The successor's first step of the transition: when the recovery resumed.
    const resumedAt = Number((evictions[0]?.id ?? '').split('-')[0]);
    const fromKill = resumedAt - killedAt;
    const fromUp = resumedAt - upAt;
    console.log(
      `controller-crash: recovery resumed ${(fromKill / 1000).toFixed(1)} s after kill -9, ${(fromUp / 1000).toFixed(1)} s after the new controller was up ` +
        `(lock ${QUEUES.lockDurationSeconds} s, stalled check every ${QUEUES.stalledIntervalSeconds} s: bound ${RESUME_BOUND_MS / 1000} s + ${SLACK_MS / 1000} s slack)`,
    );
    // Not before the lock could lapse: it is renewed every half lock.
    expect(fromKill).toBeGreaterThanOrEqual((QUEUES.lockDurationSeconds * 1000) / 2);
    expect(fromUp).toBeLessThanOrEqual(RESUME_BOUND_MS + SLACK_MS);
    expect(lines.filter((line) => /evict c-spare-\d: done \(standby c-spare-\d activated in place of c-02\)/.test(line))).toHaveLength(1);
    expect(lines.filter((line) => line.startsWith('decision: crash-job: evict'))).toHaveLength(1);
  }, 120_000);
});
