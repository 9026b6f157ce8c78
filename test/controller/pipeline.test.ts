import { Queue } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import { QUEUE_NAMES, type StepsJob } from '../../core/queues.js';
import type { Controller } from '../../controller/service.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { post, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { signal } from '../support/signal.js';
import { until } from '../support/until.js';

function xidEvent(node: string, gpu = '0000:3a:00', xid = 79): Record<string, unknown> {
  return { kind: 'xid', node, gpu, xid, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
}

function xidAlert(node: string, gpu = '0000:3a:00', xid = '79', startsAt = new Date().toISOString()): Record<string, unknown> {
  return {
    version: '4',
    status: 'firing',
    receiver: 'steadfast-controller',
    alerts: [{ labels: { alertname: 'SteadfastXidFatal', node, pci_bus_id: gpu, xid, severity: 'critical' }, annotations: {}, startsAt }],
  };
}

const finished = (entries: AuditEntry[]): boolean =>
  entries.some((entry) => entry.type === 'action' && ['done', 'refused', 'failed'].includes(String(entry.data.state)));

describe('signal → decision → action on a real Redis', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(
    overrides: Parameters<typeof testConfig>[2] = {},
  ): Promise<{ store: ReturnType<typeof testRedis>; controller: Controller; url: string }> {
    const store = testRedis();
    stores.push(store);
    const { controller, url } = await startController(testConfig(store.url, store.prefix, overrides));
    controllers.push(controller);
    return { store, controller, url };
  }

  it('drains a node exactly once when the fast path and the Prometheus alert report the same Xid', async () => {
    const { store, controller, url } = await setUp();
    expect((await post(`${url}/api/v1/signals`, xidEvent('node-3'))).status).toBe(202);
    expect((await post(`${url}/api/v1/alerts`, xidAlert('node-3'))).status).toBe(202);
    const entries = await until(
      'both signals audited',
      () => controller.audit.read({ node: 'node-3' }),
      (list) => list.filter((entry) => entry.type === 'signal').length === 2 && finished(list),
    );

    const decisions = entries.filter((entry) => entry.type === 'decision');
    expect(decisions).toHaveLength(1);
    expect(decisions[0]?.summary).toBe('drain node-3: fatal Xid 79 (GPU has fallen off the bus) on GPU 0000:3a:00');
    const duplicate = entries.find((entry) => entry.type === 'signal' && entry.data.duplicateOf !== undefined);
    expect(duplicate?.data.sameFault).toBe(true);
    expect(duplicate?.summary).toContain(`same fault as decision ${decisions[0]?.ref}`);
    const drained = await new DryRunBackend(store.redis, store.keys).recorded();
    expect(Object.keys(drained)).toEqual(['node-3']);
    expect(drained['node-3']).toBe(`steadfast: fatal Xid 79 (GPU has fallen off the bus) on GPU 0000:3a:00 audit=${decisions[0]?.ref}`);
    expect(entries.filter((entry) => entry.type === 'action' && entry.data.state === 'running')).toHaveLength(1);
  });

  it('records a non-fatal Xid as a signal without deciding anything', async () => {
    const { controller, url } = await setUp();
    await post(`${url}/api/v1/signals`, xidEvent('node-5', '0000:18:00', 13));
    const entries = await until(
      'signal audited',
      () => controller.audit.read({ node: 'node-5' }),
      (list) => list.length > 0,
    );
    expect(entries).toHaveLength(1);
    expect(entries[0]?.summary).toContain('no action: no automatic action for xid signals of severity warning');
  });

  it('drains a node once on a node-health alert naming broken hardware (a fatal NVSwitch error), and only watches a reset that is due', async () => {
    const { store, controller, url } = await setUp();
    const payload = (alertname: string, node: string, severity: string): Record<string, unknown> =>
      xidAlertPayload({
        groupLabels: { alertname },
        alerts: [
          {
            status: 'firing',
            labels: { alertname, node, nvswitch: '0', sxid: '12028', severity },
            annotations: { summary: alertname },
            startsAt: '2026-11-23T10:00:00.000Z',
            fingerprint: `${alertname}-${node}`,
          },
        ],
      });
    expect((await post(`${url}/api/v1/alerts`, payload('SteadfastNvswitchFatal', 'node-9', 'critical'))).status).toBe(202);
    expect((await post(`${url}/api/v1/alerts`, payload('SteadfastGpuResetRequired', 'node-10', 'warning'))).status).toBe(202);
    const entries = await until('drain done', () => controller.audit.read({ node: 'node-9' }), finished);
    expect(entries.find((entry) => entry.type === 'decision')?.summary).toMatch(/^drain node-9: fatal NVSwitch error \(SXid\)/);
    const watched = await until(
      'reset-due alert audited',
      () => controller.audit.read({ node: 'node-10' }),
      (list) => list.length > 0,
    );
    expect(watched.map((entry) => entry.type)).toEqual(['signal']);
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['node-9']);
  });

  it('records an NCCL watchdog timeout from the agent as a job signal without acting on the node', async () => {
    const { controller, url } = await setUp();
    const event = {
      kind: 'nccl_timeout',
      node: 'node-8',
      job: 'llama-70b',
      rank: 17,
      message: 'Watchdog caught collective operation timeout',
      time: new Date().toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, event)).status).toBe(202);
    const entries = await until(
      'signal audited',
      () => controller.audit.read({ node: 'node-8' }),
      (list) => list.length > 0,
    );
    expect(entries).toHaveLength(1);
    const signal = entries[0]?.data.signal as { kind: string; job: string; fingerprint: string; evidence: { rank: number } };
    expect(signal).toMatchObject({ kind: 'nccl_timeout', job: 'llama-70b', fingerprint: 'nccl_timeout/node-8/-/llama-70b:17', evidence: { rank: 17 } });
    expect(entries[0]?.summary).toContain('no action: no automatic action for nccl_timeout signals');
  });

  it('refuses to act while paused and says so in the audit', async () => {
    const { store, controller, url } = await setUp();
    await controller.gates.pause('maintenance window');
    await post(`${url}/api/v1/signals`, xidEvent('node-1'));
    const entries = await until('action settled', () => controller.audit.read({ node: 'node-1' }), finished);
    const refused = entries.find((entry) => entry.type === 'action');
    expect(refused?.data.state).toBe('refused');
    expect(refused?.data.detail).toBe('actions are paused: maintenance window');
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
  });

  it('stops draining once the eviction budget for the window is used up', async () => {
    const { store, controller, url } = await setUp({ safety: { maxDrainsPerWindow: 2, windowSeconds: 600 } });
    for (const node of ['node-1', 'node-2', 'node-3']) {
      await post(`${url}/api/v1/signals`, xidEvent(node));
    }
    const settled = (list: AuditEntry[]): AuditEntry[] =>
      list.filter((entry) => entry.data.verb === 'drain' && ['done', 'refused'].includes(String(entry.data.state)));
    const entries = await until(
      'three drains settled',
      () => controller.audit.read({ type: 'action' }),
      (list) => settled(list).length === 3,
    );
    const states = settled(entries).map((entry) => entry.data.state);
    expect(states.filter((state) => state === 'done')).toHaveLength(2);
    const refusal = entries.find((entry) => entry.data.state === 'refused');
    expect(refusal?.data.detail).toBe('eviction budget exhausted: 2 drains per 600 s already used');
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toHaveLength(2);
    // The refusal pages a person once, and says so on the record.
    const pages = entries.filter((entry) => entry.data.verb === 'page_human');
    expect(pages).toHaveLength(1);
    expect(pages[0]?.summary).toBe(
      `page_human: a person is needed: drain ${String(refusal?.node)} refused (eviction budget exhausted: 2 drains per 600 s already used); later refusals in this window are audited without paging`,
    );
  });

  it('does nothing when the steps of a decision already carried out are delivered again', async () => {
    const { store, controller, url } = await setUp();
    await post(`${url}/api/v1/signals`, xidEvent('node-4'));
    const entries = await until('drain done', () => controller.audit.read({ node: 'node-4' }), finished);
    const decision = entries.find((entry) => entry.type === 'decision')?.data.decision as StepsJob;
    const steps = new Queue(QUEUE_NAMES.steps, { connection: store.redis, prefix: store.prefix });
    // A redelivery under a new job id (the original id would be deduplicated by BullMQ itself).
    const again = await steps.add('node', decision, { jobId: `${decision.transitionId}-again` });
    await until(
      'redelivered job finished',
      async () => (await again.getState()) as string,
      (state) => state === 'completed',
    );
    const rerun = await steps.getJob(again.id ?? '');
    expect(rerun?.returnvalue).toEqual({ done: 0 });
    expect((await controller.audit.read({ node: 'node-4', type: 'action' })).filter((entry) => entry.data.state === 'running')).toHaveLength(1);
    await steps.close();
  });

  it('loses no accepted signal when the controller stops before processing it', async () => {
    const store = testRedis();
    stores.push(store);
    const config = testConfig(store.url, store.prefix);
    const intakeOnly = await startController(config, { workers: false });
    expect((await post(`${intakeOnly.url}/api/v1/signals`, xidEvent('node-6'))).status).toBe(202);
    await intakeOnly.controller.close();

    const restarted = await startController(config);
    controllers.push(restarted.controller);
    const entries = await until('drain after restart', () => restarted.controller.audit.read({ node: 'node-6' }), finished);
    expect(entries.find((entry) => entry.type === 'action' && entry.data.state === 'done')).toBeDefined();
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['node-6']);
  });

  it('rejects a malformed queue payload without retrying it', async () => {
    const { store, controller } = await setUp();
    const signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    const job = await signals.add('signals', { signal: { kind: 'xid', node: 'node-1' } });
    await until(
      'job failed',
      async () => (await job.getState()) as string,
      (state) => state === 'failed',
    );
    const failed = await signals.getJob(job.id ?? '');
    expect(failed?.attemptsMade).toBe(1);
    expect(failed?.failedReason).toMatch(/^invalid signal job payload: .*signals/);
    expect(await controller.audit.read({})).toEqual([]);
    await signals.close();
  });

  it('acts on the valid signals of a job, then fails it for good naming the malformed one', async () => {
    const { store, controller } = await setUp();
    const signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    const valid = { ...signal({ kind: 'nccl_timeout', node: 'node-2' }), id: 's-valid-one', source: 'agent' as const };
    const job = await signals.add('signals', { signals: [{ kind: 'xid', node: 'node-1; rm -rf /' }, valid] });
    await until(
      'job failed',
      async () => (await job.getState()) as string,
      (state) => state === 'failed',
    );
    const failed = await signals.getJob(job.id ?? '');
    expect(failed?.attemptsMade).toBe(1);
    expect(failed?.failedReason).toMatch(/^invalid signal job payload: signals\.0\..*node/);
    const audited = await controller.audit.read({});
    expect(audited.map((entry) => entry.ref)).toEqual(['s-valid-one']);
    await signals.close();
  });
});
