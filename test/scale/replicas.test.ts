import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { ClusterBackend } from '../../actuators/backend.js';
import type { AuditEntry } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { Controller } from '../../controller/service.js';
import { ControlPlane } from '../../tryit/control-plane.js';
import { ControllerProcess } from '../../tryit/controller-process.js';
import { testRedis } from '../support/redis.js';
import { storedSignals } from '../support/stored-signals.js';
import { nodeTransition } from '../support/steps.js';
import { until } from '../support/until.js';

/**
 * Scale-out on the real parts: two controller replicas (HTTP and workers) and one worker-only
 * process share one Redis and key prefix in front of one slurmctld. A storm of fast-path events
 * and Alertmanager webhooks, every fault reported several times over both replicas, must end in
 * one decision and one Slurm drain per faulty node, and the per-node lease must keep two
 * actuators off one node at the same time.
 */

const NODES = Array.from({ length: 24 }, (_, index) => `gpu-${String(index + 1).padStart(2, '0')}`);
const VICTIMS = NODES.slice(0, 12);
const GPU = '0000:3a:00';

interface Replica {
  controller: Controller;
  url: string;
  /** [node, start, end] of every backend drain this replica made. */
  drains: [string, number, number][];
}

/** Wraps the replica's backend so each drain is recorded with its time span and takes `delayMs` longer. */
function instrument(backend: ClusterBackend, drains: [string, number, number][], delayMs: number): void {
  const drain = backend.drain.bind(backend);
  backend.drain = async (node, reason) => {
    const start = performance.timeOrigin + performance.now();
    await sleep(delayMs);
    await drain(node, reason);
    drains.push([node, start, performance.timeOrigin + performance.now()]);
  };
}

function webhook(node: string, startsAt: string): unknown {
  return {
    version: '4',
    status: 'firing',
    receiver: 'steadfast-controller',
    alerts: [
      {
        status: 'firing',
        labels: { alertname: 'SteadfastXidFatal', node, pci_bus_id: GPU, xid: '79', xid_severity: 'fatal', severity: 'critical', domain: 'gpu' },
        annotations: { summary: 'A GPU reported a fatal Xid error.' },
        startsAt,
      },
    ],
  };
}

function shuffled<T>(items: T[]): T[] {
  const copy = [...items];
  for (let index = copy.length - 1; index > 0; index -= 1) {
    const other = Math.floor(Math.random() * (index + 1));
    [copy[index], copy[other]] = [copy[other] as T, copy[index] as T];
  }
  return copy;
}

describe('two controller replicas and a worker-only process on one Redis', () => {
  const store = testRedis();
  let plane: ControlPlane;
  const replicas: Replica[] = [];
  let worker: ControllerProcess;

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: NODES, redisUrl: inject('redisUrl') });
    const config = plane.controllerConfig(store.prefix);
    for (let index = 0; index < 2; index += 1) {
      const controller = new Controller({ config, logger: silentLogger() });
      const { port } = await controller.start();
      const replica: Replica = { controller, url: `http://127.0.0.1:${port}`, drains: [] };
      instrument(controller.backend, replica.drains, 150);
      replicas.push(replica);
    }
    worker = new ControllerProcess(plane.processes, { name: 'worker-only', dir: plane.root, config, http: false });
    await worker.start();
  }, 90_000);

  afterAll(async () => {
    await Promise.allSettled(replicas.map((replica) => replica.controller.close()));
    await worker?.stop();
    await plane?.stop();
    await store.cleanup();
  });

  const post = async (url: string, body: unknown): Promise<number> => {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${plane.credentials.operator}` },
      body: JSON.stringify(body),
    });
    await response.arrayBuffer();
    return response.status;
  };

  it("runs three workers on every queue, and either replica's bull-board shows the same queues", async () => {
    const queue = new Queue('steps', { connection: store.redis, prefix: store.prefix });
    try {
      expect(await queue.getWorkersCount()).toBe(3);
    } finally {
      await queue.close();
    }
    for (const replica of replicas) {
      const page = await fetch(`${replica.url}/queues`, {
        headers: { authorization: `Basic ${Buffer.from(`ops:${plane.credentials.readOnly}`).toString('base64')}` },
      });
      expect(page.status).toBe(200);
      expect(await page.text()).toContain('steadfast queues');
      const response = await fetch(`${replica.url}/queues/api/queues`, { headers: { authorization: `Bearer ${plane.credentials.readOnly}` } });
      expect(response.status).toBe(200);
      const body = (await response.json()) as { queues: { name: string }[] };
      expect(body.queues.map((queue) => queue.name).sort()).toEqual(['analysis', 'signals', 'steps']);
    }
  });

  it('handles a storm of repeated reports over both replicas with one decision and one Slurm drain per faulty node', async () => {
    const [a, b] = replicas as [Replica, Replica];
    const faultTime = new Date().toISOString();
    const requests: { url: string; body: unknown }[] = [];
    for (const node of VICTIMS) {
      const xid = { kind: 'xid', node, gpu: GPU, xid: 79, message: 'GPU has fallen off the bus.', time: faultTime };
      // The agent's fast path, retried against the other replica behind a load balancer.
      requests.push({ url: `${a.url}/api/v1/signals`, body: xid }, { url: `${b.url}/api/v1/signals`, body: xid });
      // Prometheus' alert for the same Xid, delivered by both Alertmanagers of an HA pair.
      requests.push({ url: `${b.url}/api/v1/alerts`, body: webhook(node, faultTime) }, { url: `${a.url}/api/v1/alerts`, body: webhook(node, faultTime) });
      // A second fault on the same node a moment later: the node is already being drained.
      requests.push({
        url: `${b.url}/api/v1/signals`,
        body: { kind: 'gpu_lost', node, gpu: '0000:18:00', message: 'GPU 0000:18:00 no longer listed', time: new Date(Date.now() + 50).toISOString() },
      });
    }
    for (const node of NODES.slice(VICTIMS.length)) {
      // Noise: non-fatal Xids (observed, never drained).
      requests.push({
        url: `${(Math.random() < 0.5 ? a : b).url}/api/v1/signals`,
        body: { kind: 'xid', node, gpu: GPU, xid: 13, message: 'Graphics Exception', time: faultTime },
      });
    }
    const statuses = await Promise.all(shuffled(requests).map((request) => post(request.url, request.body)));
    expect(statuses.every((status) => status === 202)).toBe(true);

    const distinctSignals = VICTIMS.length * 3 + (NODES.length - VICTIMS.length);
    const audit = await until(
      'every distinct signal audited and every drain finished',
      () => a.controller.audit.read({ limit: 10_000 }),
      (entries) =>
        entries.filter((entry) => entry.type === 'signal').length >= distinctSignals &&
        entries.filter((entry) => entry.type === 'action' && entry.data.state === 'done').length >= VICTIMS.length,
      40_000,
    );
    await sleep(1000);
    const settled: AuditEntry[] = await b.controller.audit.read({ limit: 10_000 });
    expect(settled.length).toBeGreaterThanOrEqual(audit.length);

    // Every distinct signal is on record once: a repeat (both Alertmanagers' copies, stored by
    // two controllers) is acted on once, whichever batch holds it.
    const signalRefs = settled.filter((entry) => entry.type === 'signal').map((entry) => entry.ref);
    expect(new Set(signalRefs).size).toBe(signalRefs.length);
    expect(signalRefs).toHaveLength(distinctSignals);
    const signals = new Queue('signals', { connection: store.redis, prefix: store.prefix });
    try {
      expect(await signals.getJobCounts('failed', 'waiting', 'active')).toEqual({ failed: 0, waiting: 0, active: 0 });
      expect((await storedSignals(signals, ['completed'])).byId.size).toBe(distinctSignals);
    } finally {
      await signals.close();
    }

    const drains = plane.slurmDrainCounts();
    for (const node of VICTIMS) {
      const decisions = settled.filter((entry) => entry.type === 'decision' && entry.node === node);
      expect(decisions, `decisions for ${node}`).toHaveLength(1);
      expect(
        settled.filter((entry) => entry.type === 'action' && entry.node === node && entry.data.state === 'running'),
        `drain attempts on ${node}`,
      ).toHaveLength(1);
      expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    }
    expect(NODES.filter((node) => drains.has(node)).sort()).toEqual([...VICTIMS].sort());
  }, 60_000);

  it('lets one actuator at a time work on a node when several drain jobs for it reach different processes at once', async () => {
    const targets = NODES.slice(VICTIMS.length, VICTIMS.length + 3);
    const actions = new Queue('steps', { connection: store.redis, prefix: store.prefix });
    // Three decisions per node, as if three claims had raced: the lease and the reconcile read must still drain each once.
    const jobs = targets.flatMap((node) =>
      [0, 1, 2].map((copy) => {
        const id = `d-lease-${node}-${copy}`;
        return {
          name: 'node',
          data: nodeTransition('drain', { id, node, reason: `lease test copy ${copy}` }),
          opts: { jobId: id, attempts: 5, backoff: { type: 'fixed', delay: 300 } },
        };
      }),
    );
    try {
      await actions.addBulk(jobs);
      const finished = await until(
        'every lease-test drain job finished',
        async () => Promise.all(jobs.map(async (job) => (await actions.getJob(job.opts.jobId))?.finishedOn)),
        (times) => times.every((time) => time !== undefined),
        30_000,
      );
      expect(finished).toHaveLength(jobs.length);
      // Some jobs found their node leased by another actuator and were retried (BullMQ counts the
      // finishing attempt too, so a job that never waited shows 1).
      const retried = (await Promise.all(jobs.map(async (job) => (await actions.getJob(job.opts.jobId))?.attemptsMade ?? 0))).filter(
        (attempts) => attempts > 1,
      );
      expect(retried.length).toBeGreaterThan(0);
    } finally {
      await actions.close();
    }
    const drains = plane.slurmDrainCounts();
    for (const node of targets) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    // The spans of the replicas' backend calls on one node never overlap.
    const spans = replicas.flatMap((replica) => replica.drains).filter(([node]) => targets.includes(node));
    for (const node of targets) {
      const mine = spans.filter(([name]) => name === node).sort((x, y) => x[1] - y[1]);
      for (let index = 1; index < mine.length; index += 1)
        expect((mine[index] as [string, number, number])[1]).toBeGreaterThanOrEqual((mine[index - 1] as [string, number, number])[2]);
    }
  }, 45_000);
});
