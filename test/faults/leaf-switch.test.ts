import { setTimeout as sleep } from 'node:timers/promises';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { SafetyGates } from '../../actuators/safety.js';
import { AuditLog, type AuditEntry } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { Controller } from '../../controller/service.js';
import { renderAlertmanagerConfig } from '../../rules/index.js';
import { ControlPlane } from '../../tryit/control-plane.js';
import { startAlertmanager, type AlertmanagerPart } from '../../tryit/parts.js';
import { testRedis } from '../support/redis.js';
import { nodeTransition, queued, testStepProcessor } from '../support/steps.js';
import { until } from '../support/until.js';

/**
 * A leaf switch fails and takes the RDMA ports of the 32 nodes under it down at once: a storm of
 * port-down alerts (through the real Alertmanager) and NCCL timeouts naming the port (the agents'
 * fast path). The eviction budget must stop the mass eviction, and a person must be paged once
 * for the incident, not once per refused node.
 */

const RACK_A = Array.from({ length: 32 }, (_, index) => `leaf-a-${String(index + 1).padStart(2, '0')}`);
const STANDBYS = ['spare-1', 'spare-2', 'spare-3', 'spare-4'];
const RACK_B = Array.from({ length: 32 }, (_, index) => `leaf-b-${String(index + 1).padStart(2, '0')}`);
const BUDGET = 4;

function pageEntries(entries: AuditEntry[]): AuditEntry[] {
  return entries.filter((entry) => entry.type === 'action' && entry.data.verb === 'page_human');
}

/** Waits until the steps queue has nothing left to run and the audit has stopped growing. */
async function settle(controller: Controller, recovery: Queue): Promise<void> {
  let last = -1;
  let quietSince = Date.now();
  const deadline = Date.now() + 45_000;
  while (Date.now() < deadline) {
    const counts = await recovery.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
    const length = (await controller.audit.read({ limit: 10_000 })).length;
    const busy = Object.values(counts).some((count) => count > 0);
    if (busy || length !== last) quietSince = Date.now();
    last = length;
    if (Date.now() - quietSince >= 2000) return;
    await sleep(200);
  }
  throw new Error('the steps queue did not go quiet within 45 s');
}

async function post(url: string, token: string, body: unknown): Promise<number> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` },
    body: JSON.stringify(body),
  });
  await response.arrayBuffer();
  return response.status;
}

describe('a leaf-switch failure on the real parts', () => {
  let plane: ControlPlane;
  let alertmanager: AlertmanagerPart;
  const jobStore = testRedis();
  const plainStore = testRedis();
  let withJob: { controller: Controller; url: string; metricsUrl: string };
  let noJob: { controller: Controller; url: string; metricsUrl: string };
  let recovery: Queue;

  beforeAll(async () => {
    plane = await ControlPlane.start({ nodes: [...RACK_A, ...STANDBYS, ...RACK_B], redisUrl: inject('redisUrl') });
    // Two installations on one Slurm, each with its own key prefix and so its own eviction budget.
    const start = async (prefix: string): Promise<{ controller: Controller; url: string; metricsUrl: string }> => {
      const controller = new Controller({
        config: plane.controllerConfig(prefix, { safety: { maxDrainsPerWindow: BUDGET, maxJobEvictionPercent: 50 } }),
        logger: silentLogger(),
      });
      const { port, metricsPort } = await controller.start();
      return { controller, url: `http://127.0.0.1:${port}`, metricsUrl: `http://127.0.0.1:${metricsPort}` };
    };
    withJob = await start(jobStore.prefix);
    recovery = new Queue('steps', { connection: jobStore.redis, prefix: jobStore.prefix });
    noJob = await start(plainStore.prefix);
    alertmanager = await startAlertmanager(
      plane.processes,
      plane.root,
      renderAlertmanagerConfig({
        webhookUrl: `${withJob.url}/api/v1/alerts`,
        credentialsFile: plane.credentials.alertmanagerTokenFile,
        groupWait: '0s',
        groupInterval: '1s',
      }),
    );
  }, 60_000);

  afterAll(async () => {
    await Promise.allSettled([withJob?.controller.close(), noJob?.controller.close(), recovery?.close()]);
    await plane?.stop();
    await Promise.all([jobStore.cleanup(), plainStore.cleanup()]);
  });

  it('over one job: evicts only as many nodes as the budget allows, refuses the rest with the reason, and pages a person once', async () => {
    const { controller, url, metricsUrl } = withJob;
    const registered = await post(`${url}/api/v1/jobs`, plane.credentials.operator, {
      name: 'leaf-job',
      nodes: RACK_A,
      ranksPerNode: 1,
      topology: { pp: 4, dp: 8, order: 'tp-dp-pp' },
      launcher: 'accept',
      codeVersion: 'v1',
    });
    expect(registered).toBe(201);
    for (const standby of STANDBYS) await controller.backend.holdStandby(standby);

    // The storm: every rank's NCCL watchdog names the dead port, and Prometheus' port-down alert
    // for each node goes through the real Alertmanager. Two network faults within 5 minutes on a
    // node are what the ladder evicts on (ByteRobust §4.1).
    const now = new Date().toISOString();
    const timeouts = RACK_A.map((node, rank) => ({
      kind: 'nccl_timeout',
      node,
      job: 'leaf-job',
      rank,
      message: `[Rank ${rank}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=81, OpType=ALLREDUCE) ran for 600000 ms; NET/IB: mlx5_0:1 port down`,
      time: now,
    }));
    expect(await post(`${url}/api/v1/signals`, plane.credentials.operator, timeouts)).toBe(202);
    const alerts = RACK_A.map((node) => ({
      labels: { alertname: 'SteadfastRdmaPortDown', node, device: 'mlx5_0', port: '1', severity: 'critical', domain: 'network' },
      annotations: { summary: 'An RDMA port is down.' },
      startsAt: now,
    }));
    const pushed = await fetch(`${alertmanager.url}/api/v2/alerts`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(alerts),
    });
    expect(pushed.status).toBe(200);

    // The ladder tolerates each node's first network fault and evicts on the second; its retry
    // chain runs out after six restarts in the incident (504-GPU report) and it asks for a person.
    // Wait until every alert is in and the steps queue has gone quiet.
    await until(
      'all 32 port-down alerts audited',
      () => controller.audit.read({ limit: 10_000, type: 'signal' }),
      (entries) => entries.filter((entry) => entry.summary.includes('SteadfastRdmaPortDown')).length >= RACK_A.length,
      40_000,
    );
    await settle(controller, recovery);

    const actions = await controller.audit.read({ limit: 10_000, type: 'action' });
    const evicted = actions
      .filter((entry) => entry.data.verb === 'evict' && entry.data.state === 'done' && String(entry.data.detail).startsWith('drained'))
      .map((entry) => entry.node ?? '');
    const refused = actions.filter((entry) => entry.data.verb === 'evict' && entry.data.state === 'refused');

    // The budget held: four nodes out, each drained in Slurm exactly once; nothing else drained.
    expect(evicted).toHaveLength(BUDGET);
    const drains = plane.slurmDrainCounts();
    expect(RACK_A.filter((node) => drains.has(node)).sort()).toEqual([...evicted].sort());
    for (const node of evicted) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
    expect(refused.length).toBeGreaterThan(0);
    for (const entry of refused) expect(entry.data.detail).toBe(`eviction budget exhausted: ${BUDGET} drains per 3600 s already used`);

    // One page for the incident, however many evictions were refused; the audit says why.
    const pages = pageEntries(actions);
    expect(pages.map((entry) => entry.summary)).toHaveLength(1);
    expect(pages[0]?.summary).toBe(
      `leaf-job: page_human: a person is needed: eviction refused (eviction budget exhausted: ${BUDGET} drains per 3600 s already used); later refusals in this window are audited without paging`,
    );
    const metrics = await (await fetch(`${metricsUrl}/metrics`)).text();
    expect(metrics).toMatch(/^steadfast_human_pages_total\{training_job="leaf-job"\} 1$/m);
  }, 60_000);

  it('over no job: port-down alerts alone drain nothing, and a storm of fatal GPU events drains only the budget, each refusal audited with why', async () => {
    const { controller, url, metricsUrl } = noJob;
    const now = Date.now();
    const portDown = {
      version: '4',
      status: 'firing',
      receiver: 'steadfast-controller',
      alerts: RACK_B.map((node) => ({
        status: 'firing',
        labels: { alertname: 'SteadfastRdmaPortDown', node, device: 'mlx5_0', port: '1', severity: 'critical', domain: 'network' },
        annotations: { summary: 'An RDMA port is down.' },
        startsAt: new Date(now).toISOString(),
      })),
    };
    expect(await post(`${url}/api/v1/alerts`, plane.credentials.alertmanager, portDown)).toBe(202);
    await until(
      'the port-down alerts audited',
      () => controller.audit.read({ limit: 10_000, type: 'signal' }),
      (entries) => entries.length >= RACK_B.length,
    );
    expect(await controller.audit.read({ limit: 10_000, type: 'decision' })).toEqual([]);

    // A whole rack's GPUs lost at once (e.g. its power shelf): the fast path reports each.
    const lost = RACK_B.map((node) => ({
      kind: 'gpu_lost',
      node,
      gpu: '0000:18:00',
      message: 'GPU 0000:18:00 no longer listed',
      time: new Date(now + 1000).toISOString(),
    }));
    expect(await post(`${url}/api/v1/signals`, plane.credentials.operator, lost)).toBe(202);
    const actions = await until(
      'a verdict on every drain',
      () => controller.audit.read({ limit: 10_000, type: 'action' }),
      (entries) => entries.filter((entry) => entry.data.verb === 'drain' && ['done', 'refused'].includes(String(entry.data.state))).length >= RACK_B.length,
      40_000,
    );
    const done = actions.filter((entry) => entry.data.verb === 'drain' && entry.data.state === 'done');
    const refused = actions.filter((entry) => entry.data.verb === 'drain' && entry.data.state === 'refused');
    expect(done).toHaveLength(BUDGET);
    expect(refused).toHaveLength(RACK_B.length - BUDGET);
    for (const entry of refused) expect(entry.data.detail).toBe(`eviction budget exhausted: ${BUDGET} drains per 3600 s already used`);
    const drains = plane.slurmDrainCounts();
    expect(RACK_B.filter((node) => drains.has(node))).toHaveLength(BUDGET);
    expect(RACK_B.every((node) => (drains.get(node) ?? 0) <= 1)).toBe(true);
    // 28 refusals, one page: the first refusal of the window.
    const metrics = await (await fetch(`${metricsUrl}/metrics`)).text();
    expect(metrics).toMatch(/^steadfast_human_pages_total\{training_job=""\} 1$/m);
  }, 60_000);
});

describe('paging once per window', () => {
  const stores = [testRedis(), testRedis()];
  afterAll(() => Promise.all(stores.map((store) => store.cleanup())));

  it('claims a page for the first refusal of each gate in a window and for none after it, until the window passes', async () => {
    const store = stores[0] as ReturnType<typeof testRedis>;
    const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: 1, windowSeconds: 1 }, 60);
    expect(await gates.claimPage('budget')).toBe(true);
    expect(await gates.claimPage('budget')).toBe(false);
    expect(await gates.claimPage('pause')).toBe(true);
    await sleep(1100);
    expect(await gates.claimPage('budget')).toBe(true);
  });

  it('pages once when 32 drains are refused by the budget at once, and audits the page with its reason', async () => {
    const store = stores[1] as ReturnType<typeof testRedis>;
    const backend = new DryRunBackend(store.redis, store.keys);
    const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: BUDGET, windowSeconds: 600 }, 60);
    const audit = new AuditLog(store.redis, store.keys);
    const pages: string[] = [];
    const processor = testStepProcessor(store, { backend, audit, gates }, { onPage: (_job, reason) => pages.push(reason) });
    const transitions = RACK_B.map((node, index) => nodeTransition('drain', { id: `d-leaf-${index}`, node, reason: 'GPU 0000:18:00 is lost' }));
    const results = await Promise.all(transitions.map((transition) => processor(queued(transition, 0, 5))));
    expect(results.filter((result) => result.halted === undefined)).toHaveLength(BUDGET);
    expect(
      results.filter((result) => result.halted === 'drain stopped the transition: eviction budget exhausted: 4 drains per 600 s already used'),
    ).toHaveLength(RACK_B.length - BUDGET);
    expect(Object.keys(await backend.recorded())).toHaveLength(BUDGET);
    expect(pages).toEqual(['eviction budget exhausted: 4 drains per 600 s already used']);
    const entries = pageEntries(await audit.read({ limit: 1000 }));
    expect(entries).toHaveLength(1);
    expect(entries[0]?.summary).toMatch(
      /^page_human: a person is needed: drain leaf-b-\d\d refused \(eviction budget exhausted: 4 drains per 600 s already used\); later refusals in this window are audited without paging$/,
    );
  });
});
