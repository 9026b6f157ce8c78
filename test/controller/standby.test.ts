import { afterEach, describe, expect, it } from 'vitest';
import { Keys } from '../../core/redis.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { StandbyPool } from '../../actuators/standby-pool.js';
import { selfCheck } from '../../agent/standby-reporter.js';
import type { Controller } from '../../controller/service.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

describe('the warm standby pool (ByteRobust §6.2)', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => Promise.all(stores.splice(0).map((store) => store.cleanup())));

  function pool(candidates: string[]): { pool: StandbyPool; backend: DryRunBackend } {
    const store = testRedis();
    stores.push(store);
    const backend = new DryRunBackend(store.redis, store.keys);
    return { pool: new StandbyPool(store.redis, store.keys as Keys, backend, { candidates, dailyFailureRate: 0.05, quantile: 0.99 }), backend };
  }

  it('provisions the P99 of Binomial(nodes in use, rate) from free candidates and holds them in the backend', async () => {
    const { pool: standby, backend } = pool(['s1', 's2', 's3', 'n1']);
    expect(standby.target(4)).toBe(2);
    expect(await standby.reconcile(4, new Set(['n1']))).toEqual(['s1', 's2']);
    expect(await backend.standbys()).toEqual(['s1', 's2']);
    expect((await standby.members()).map((member) => `${member.node}:${member.state}`)).toEqual(['s1:self_check', 's2:self_check']);
    expect(await standby.reconcile(4, new Set(['n1']))).toEqual([]);
  });

  it('makes a standby ready only after a healthy self-check, hands ready ones to a job, and replenishes', async () => {
    const { pool: standby, backend } = pool(['s1', 's2', 's3']);
    await standby.reconcile(4, new Set());
    expect(await standby.take('llama')).toBeUndefined();
    await standby.selfCheck('s1', true, 'healthy');
    await standby.selfCheck('s2', false, 'GPU 0000:18:00 missing');
    expect(await standby.take('llama')).toBe('s1');
    expect(await backend.standbys()).toEqual(['s2']);
    expect((await standby.member('s1'))?.state).toBe('active');
    // s1 is in use, s2 failed: two are missing and only s3 is left to provision.
    expect(await standby.reconcile(4, new Set(['s1']))).toEqual(['s3']);
  });

  it('judges an agent healthy only with every collector working, its GPUs read and all present, and no fatal Xid', () => {
    expect(
      selfCheck(
        'steadfast_collector_success{collector="gpu"} 1\nsteadfast_gpu_present{gpu="0",pci_bus_id="0000:18:00"} 1\nsteadfast_gpu_last_poll_timestamp_seconds 1795870000\n',
      ).ok,
    ).toBe(true);
    // An agent that serves before its first GPU poll is done is not ready yet.
    expect(selfCheck('steadfast_collector_success{collector="gpu"} 1\nsteadfast_gpu_poll_age_seconds 0.1\n')).toEqual({
      ok: false,
      detail: 'GPUs not read yet',
    });
    expect(selfCheck('steadfast_collector_success{collector="xid"} 0\n')).toEqual({ ok: false, detail: 'collector xid failing' });
    expect(selfCheck('steadfast_gpu_present{gpu="3",pci_bus_id="0000:5d:00"} 0\n').detail).toBe('GPU 0000:5d:00 missing');
    expect(selfCheck('steadfast_gpu_present{gpu="3",pci_bus_id="0000:5d:00",UUID="GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba"} 0\n').detail).toBe(
      'GPU 0000:5d:00 missing',
    );
    expect(selfCheck('steadfast_gpu_present{gpu="2",UUID="GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba"} 0\n').detail).toBe(
      'GPU GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba missing',
    );
    expect(selfCheck('steadfast_xid_errors_total{pci_bus_id="0000:18:00",xid="79",severity="fatal"} 1\n').detail).toBe('fatal Xid 79 seen');
  });
});

describe('standbys through the controller', () => {
  let controller: Controller | undefined;
  afterEach(async () => controller?.close());

  it('provisions standbys on its tick, takes self-checks over HTTP, and evicts onto a ready one', async () => {
    const store = testRedis();
    try {
      const started = await startController(testConfig(store.url, store.prefix, { standby: { candidates: ['s1', 's2'], dailyFailureRate: 0.05 } }));
      controller = started.controller;
      const { url } = started;
      await post(`${url}/api/v1/jobs`, {
        name: 'job-a',
        nodes: ['n1', 'n2', 'n3', 'n4'],
        ranksPerNode: 1,
        launcher: 'accept',
        codeVersion: 'v1',
        topology: { dp: 4 },
      });
      await until(
        'standbys provisioned',
        () => started.controller.pool.members(),
        (members) => members.length === 2,
        20_000,
      );
      const view = await fetch(`${url}/api/v1/standby/s1`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
      expect(await view.json()).toEqual({ node: 's1', role: 'standby', state: 'self_check' });
      const report = await post(`${url}/api/v1/standby/s1/self-check`, { ok: true, detail: 'healthy' });
      expect(report.status).toBe(200);
      expect((await post(`${url}/api/v1/standby/n9/self-check`, { ok: true })).status).toBe(404);
      await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n2', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      const job = await until(
        'job on the standby',
        () => started.controller.jobs.get('job-a'),
        (record) => record.spec.nodes.includes('s1') && record.state === 'running',
      );
      expect(job.spec.nodes).toEqual(['n1', 's1', 'n3', 'n4']);
      expect((await started.controller.pool.member('s1'))?.state).toBe('active');
    } finally {
      await controller?.close();
      controller = undefined;
      await store.cleanup();
    }
  }, 40_000);
});
