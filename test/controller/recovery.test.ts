import { afterEach, describe, expect, it } from 'vitest';
import type { AuditEntry } from '../../core/audit.js';
import type { Controller } from '../../controller/service.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import type { LadderState } from '../../controller/policy/ladder/index.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { LLAMA as JOB } from '../support/steps.js';
import { until } from '../support/until.js';

const summaries = (entries: AuditEntry[]): string[] => entries.map((entry) => `${entry.type}: ${entry.summary}`);

describe('recovery of a registered job on a real Redis', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(
    overrides: Parameters<typeof testConfig>[2] = {},
  ): Promise<{ store: ReturnType<typeof testRedis>; controller: Controller; url: string; metricsUrl: string }> {
    const store = testRedis();
    stores.push(store);
    const { controller, url, metricsUrl } = await startController(testConfig(store.url, store.prefix, overrides));
    controllers.push(controller);
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
    await controller.backend.holdStandby('spare-1');
    return { store, controller, url, metricsUrl };
  }

  it('evicts the node of a fatal Xid, activates a warm standby in its place and restarts the job, without diagnostics', async () => {
    const { store, controller, url } = await setUp();
    const event = { kind: 'xid', node: 'n01', gpu: '0000:18:00', xid: 79, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
    expect((await post(`${url}/api/v1/signals`, event)).status).toBe(202);
    const job = await until(
      'job back to running on the standby',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
    );
    expect(job.spec.nodes).toEqual(['n00', 'spare-1', 'n02', 'n03']);
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['n01']);
    expect(await controller.backend.standbys()).toEqual([]);
    const audit = summaries(await controller.audit.read({ limit: 100 }));
    expect(audit.filter((line) => line.startsWith('decision:')).map((line) => /^decision: llama: (\S+)/.exec(line)?.[1])).toEqual(['stop', 'evict', 'restart']);
    expect(audit.some((line) => line.includes('run_diagnostics'))).toBe(false);
    expect(audit.some((line) => /action: llama: evict spare-1: done \(standby spare-1 activated in place of n01\)/.test(line))).toBe(true);
    expect((await controller.jobs.ettr('llama')).cumulative).toBeLessThan(1);
  });

  it('resets the GPU of a fault whose cure is a reset and restarts on the same nodes when GPU resets are on; evicts when they are off', async () => {
    const { store, controller, url } = await setUp({ remedies: { gpuReset: { enabled: true } } });
    const dbe = {
      kind: 'xid',
      node: 'n01',
      gpu: '0000:3a:00',
      xid: 48,
      message: 'An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer.',
      time: new Date().toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, dbe)).status).toBe(202);
    await until(
      'the job relaunched',
      () => controller.audit.read({ limit: 100 }),
      (entries) =>
        summaries(entries).some((line) => /^decision: llama: restart/.test(line)) && summaries(entries).some((line) => /action: llama: restart/.test(line)),
    );
    const audit = summaries(await controller.audit.read({ limit: 100 }));
    expect(audit.filter((line) => line.startsWith('decision:')).map((line) => /^decision: llama: (\S+)/.exec(line)?.[1])).toEqual([
      'stop',
      'reset_gpu',
      'restart',
    ]);
    // Dry-run backend: the reset is recorded, no agent asked; the node stays, the standby is not used.
    expect((await controller.jobs.get('llama')).spec.nodes).toEqual(['n00', 'n01', 'n02', 'n03']);
    expect(await controller.backend.standbys()).toEqual(['spare-1']);
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual([]);
    expect(audit.some((line) => /action: llama: reset_gpu n01: done \(GPU 0000:3a:00 of n01 reset through its agent/.test(line))).toBe(true);

    // The same fault with resets off (the default) evicts, as before.
    const off = await setUp();
    expect((await post(`${off.url}/api/v1/signals`, { ...dbe, time: new Date().toISOString() })).status).toBe(202);
    await until(
      'job back to running on the standby',
      () => off.controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
    );
  });

  it('rolls back to the last good version when the job fails with a Python exception after a code update', async () => {
    const { controller, url } = await setUp();
    // v1 ran fine; an urgent update brings v2.
    await controller.jobs.setState('llama', 'running', 'trained');
    const update = await post(`${url}/api/v1/jobs/llama/code-updates`, { version: 'v2', urgent: true });
    expect(update.status).toBe(202);
    await until(
      'v2 running',
      () => controller.jobs.get('llama'),
      (record) => record.spec.codeVersion === 'v2' && record.state === 'running',
    );
    const failure = {
      kind: 'worker_failed',
      node: 'n02',
      job: 'llama',
      rank: 2,
      message: 'ChildFailedError: train.py FAILED; root cause: rank 2 exitcode 1: TypeError: unsupported operand type(s)',
      time: new Date().toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, failure)).status).toBe(202);
    const job = await until(
      'rolled back to v1',
      () => controller.jobs.get('llama'),
      (record) => record.spec.codeVersion === 'v1' && record.state === 'running',
    ).catch(async (error: unknown) => {
      throw new Error(`${String(error)}\n${summaries(await controller.audit.read({ limit: 100 })).join('\n')}`);
    });
    expect(job.spec.nodes).toEqual(JOB.nodes);
    const decisions = (await controller.audit.read({ type: 'decision', limit: 100 })).map((entry) => entry.summary);
    expect(decisions.some((summary) => /^llama: rollback to v1/.test(summary))).toBe(true);
  });

  it('releases a held-back rollback on the recovery clock even when the progress check of the same job fails', async () => {
    // Nothing answers on port 9: the progress check waits for Prometheus, and its record is then made unreadable.
    const { store, controller, url } = await setUp({
      progress: { prometheusUrl: 'http://127.0.0.1:9/', timeoutSeconds: 600 },
      recovery: { retryInitialBackoffSeconds: 1 },
    });
    await controller.jobs.setState('llama', 'running', 'trained');
    expect((await post(`${url}/api/v1/jobs/llama/code-updates`, { version: 'v2', urgent: true })).status).toBe(202);
    await until(
      'v2 relaunched, its progress awaited',
      () => store.redis.get(store.keys.jobAwaitingProgress('llama')),
      (raw) => raw !== null,
    );
    await store.redis.set(store.keys.jobAwaitingProgress('llama'), '{"not": "a progress record"}');
    const failure = {
      kind: 'worker_failed',
      node: 'n02',
      job: 'llama',
      rank: 2,
      message: 'srun: task 2 on n02 exited with exit code 1; TypeError: unsupported operand type(s)',
      time: new Date().toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, failure)).status).toBe(202);
    const decisions = async (): Promise<string[]> => (await controller.audit.read({ type: 'decision', limit: 100 })).map((entry) => entry.summary);
    // The update used the incident's first restart; the rollback is the second, held back by the retry chain.
    await until('the rollback held back', decisions, (summaries) =>
      summaries.some((summary) => /^llama: tolerate — restart 2 of at most \d+ held back/.test(summary)),
    );
    // The rollback decision is recorded first, its relaunch on v1 next: wait for both.
    const rolledBack = await until(
      'the rollback released by a tick and relaunched on v1',
      decisions,
      (summaries) =>
        summaries.some((summary) => summary.startsWith('llama: rollback to v1')) &&
        summaries.some((summary) => summary.startsWith('llama: restart — relaunch on v1')),
      20_000,
    );
    expect(rolledBack.findIndex((summary) => summary.startsWith('llama: restart — relaunch on v1'))).toBeGreaterThan(
      rolledBack.findIndex((summary) => summary.startsWith('llama: rollback to v1')),
    );
  });

  it('rolls back a crash on the standby that replaced an evicted node, but diagnoses an unrelated crash after the same eviction', async () => {
    const { store, controller, url } = await setUp();
    await controller.jobs.setState('llama', 'running', 'trained');
    expect((await post(`${url}/api/v1/jobs/llama/code-updates`, { version: 'v2', urgent: true })).status).toBe(202);
    await until(
      'v2 running',
      () => controller.jobs.get('llama'),
      (record) => record.spec.codeVersion === 'v2' && record.state === 'running',
    );
    await post(`${url}/api/v1/signals`, {
      kind: 'xid',
      node: 'n01',
      gpu: '0000:18:00',
      xid: 79,
      message: 'GPU has fallen off the bus.',
      time: new Date().toISOString(),
    });
    await until(
      'n01 replaced by spare-1',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
    );
    // The evict step told the ladder who took n01's place.
    const stored = JSON.parse((await store.redis.get(store.keys.jobLadder('llama'))) ?? '{}') as { replacements?: unknown; lastEviction?: unknown };
    expect(stored.replacements).toEqual([{ node: 'spare-1', replaced: 'n01', at: expect.any(Number) }]);
    expect(stored.lastEviction).toMatchObject({ nodes: ['n01'], signatures: ['machine:xid:79'] });

    const crash = (node: string): Record<string, unknown> => ({
      kind: 'worker_failed',
      node,
      job: 'llama',
      message: 'RuntimeError: CUDA error: an illegal memory access was encountered',
      time: new Date().toISOString(),
    });
    expect((await post(`${url}/api/v1/signals`, crash('spare-1'))).status).toBe(202);
    await until(
      'rolled back to v1',
      () => controller.jobs.get('llama'),
      (record) => record.spec.codeVersion === 'v1' && record.state === 'running',
    );
    const decisions = async (): Promise<string[]> => (await controller.audit.read({ type: 'decision', limit: 200 })).map((entry) => entry.summary);
    expect((await decisions()).find((summary) => summary.startsWith('llama: rollback to v1'))).toMatch(/on spare-1, the standby that replaced n01/);

    // The same eviction, minutes ago, and a crash elsewhere that is not its failure: a new incident.
    expect((await post(`${url}/api/v1/signals`, crash('n03'))).status).toBe(202);
    const diagnosed = await until('stop-time diagnostics asked for', decisions, (summaries) =>
      summaries.some((summary) => summary.startsWith('llama: run_diagnostics')),
    );
    expect(diagnosed.find((summary) => summary.startsWith('llama: run_diagnostics'))).toMatch(
      /a different failure and not on a standby that replaced an evicted node/,
    );
    expect((await controller.jobs.get('llama')).spec.codeVersion).toBe('v1');
  });

  const flap = (startsAt: string): Record<string, unknown> => ({
    version: '4',
    status: 'firing',
    receiver: 'steadfast-controller',
    alerts: [
      {
        labels: { alertname: 'SteadfastRdmaPortFlapping', node: 'n03', device: 'mlx5_0', port: '1', severity: 'critical', domain: 'network' },
        annotations: {},
        startsAt,
      },
    ],
  });

  it('tolerates a first NIC flap and evicts the node on the second within five minutes', async () => {
    const { store, controller, url } = await setUp();
    await post(`${url}/api/v1/alerts`, flap(new Date(Date.now() - 60_000).toISOString()));
    await until(
      'first flap recorded',
      () => controller.audit.read({ type: 'decision' }),
      (entries) => entries.some((entry) => entry.summary.includes('tolerate')),
    );
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
    await post(`${url}/api/v1/alerts`, flap(new Date().toISOString()));
    await until(
      'node evicted',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (drained) => 'n03' in drained,
    );
    await until(
      'standby in place',
      () => controller.jobs.get('llama'),
      (record) => record.spec.nodes.includes('spare-1') && record.state === 'running',
    );
  });

  it("evicts on the first NIC flap when the operator's recovery config tolerates none", async () => {
    const { store, controller, url } = await setUp({ recovery: { networkAlertsBeforeEviction: 1 } });
    await post(`${url}/api/v1/alerts`, flap(new Date().toISOString()));
    await until(
      'node evicted',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (drained) => 'n03' in drained,
    );
    const decisions = (await controller.audit.read({ type: 'decision', limit: 100 })).map((entry) => entry.summary);
    expect(decisions.some((summary) => summary.startsWith('llama: tolerate'))).toBe(false);
    expect(decisions.some((summary) => /^llama: evict n03 — .*1 network alerts within 5 min/.test(summary))).toBe(true);
  });

  it('refuses the eviction while paused, says so, and leaves the node in service', async () => {
    const { store, controller, url } = await setUp();
    await controller.gates.pause('maintenance');
    const event = { kind: 'gpu_lost', node: 'n00', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() };
    await post(`${url}/api/v1/signals`, event);
    // Every step of the transition is refused in order; wait for the eviction's refusal itself.
    const refused = await until(
      'eviction refusal recorded',
      () => controller.audit.read({ type: 'action' }),
      (entries) => entries.some((entry) => entry.data.verb === 'evict' && entry.data.state === 'refused'),
    );
    expect(refused.find((entry) => entry.data.verb === 'evict')?.data.detail).toBe('actions are paused: maintenance');
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
  });

  it('undoes the transition refused while paused, and evicts when the fault is reported again after the pause', async () => {
    const { store, controller, url } = await setUp();
    await controller.gates.pause('maintenance');
    const lost = (time: number): object => ({ kind: 'gpu_lost', node: 'n00', gpu: '0000:18:00', message: 'gone', time: new Date(time).toISOString() });
    await post(`${url}/api/v1/signals`, lost(Date.now()));
    await until(
      'the refusal told to the ladder',
      () => controller.audit.read({ type: 'decision' }),
      (entries) => entries.some((entry) => entry.summary.startsWith('llama: notify — recovery refused (actions are paused: maintenance): nothing was done;')),
    );
    // The ladder stands as before the fault: no incident, no eviction counted against n00.
    const ladder = JSON.parse((await store.redis.get(store.keys.jobLadder('llama'))) ?? 'null') as LadderState;
    expect(ladder.phase).toBe('running');
    expect(ladder.incident).toBeNull();
    expect(ladder.exclusions).toEqual([]);
    expect((await controller.jobs.get('llama')).state).toBe('running');
    expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});

    await controller.gates.unpause();
    await post(`${url}/api/v1/signals`, lost(Date.now() + 1000));
    await until(
      'node evicted after the pause',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (drained) => 'n00' in drained,
    );
  });

  it('restores from the newest step every rank still has after the eviction, and says where ranks load from', async () => {
    const { controller, url } = await setUp();
    // Each rank keeps its shard in host memory and a peer copy on the mirror node (0↔3, 1↔2).
    const shards = [100, 110].flatMap((step) =>
      [0, 1, 2, 3].flatMap((rank) => [
        { step, rank, tier: 'host', holder: `n0${rank}` },
        { step, rank, tier: 'peer', holder: `n0${3 - rank}` },
      ]),
    );
    expect((await post(`${url}/api/v1/jobs/llama/checkpoints`, shards)).status).toBe(202);
    await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n01', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
    const plan = await until(
      'restore plan recorded',
      () => controller.audit.read({ type: 'action' }),
      (entries) => entries.some((entry) => entry.summary.includes('restore plan')),
    );
    expect(plan.find((entry) => entry.summary.includes('restore plan'))?.summary).toBe(
      'llama: restore plan: restore from step 110: 1 of 4 ranks load from another node or remote storage',
    );
  });

  it('refuses the eviction past the budget and pages a person, leaving that node in service', async () => {
    const { store, controller, url, metricsUrl } = await setUp({ safety: { maxDrainsPerWindow: 1, windowSeconds: 600 } });
    await controller.backend.holdStandby('spare-2');
    await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n00', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
    await until(
      'first eviction',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (drained) => 'n00' in drained,
    );
    await until(
      'job running again',
      () => controller.jobs.get('llama'),
      (record) => record.state === 'running' && !record.spec.nodes.includes('n00'),
    );
    await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n02', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
    const refused = await until(
      'second eviction refused',
      () => controller.audit.read({ type: 'action' }),
      (entries) => entries.some((entry) => entry.data.state === 'refused'),
    );
    expect(refused.find((entry) => entry.data.state === 'refused')?.data.detail).toBe('eviction budget exhausted: 1 drains per 600 s already used');
    expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['n00']);
    // The page follows the refusal on record; wait for it, then check it came once.
    const metrics = await until(
      'the page counted',
      async () => (await fetch(`${metricsUrl}/metrics`)).text(),
      (text) => /steadfast_human_pages_total\{training_job="llama"\} \d/.test(text),
    );
    expect(metrics).toMatch(/steadfast_human_pages_total\{training_job="llama"\} 1$/m);
  });
});

describe('a job run by Kubernetes', () => {
  it('is relaunched through the backend: its pods deleted for their controller to recreate', async () => {
    const store = testRedis();
    const launchers = {
      pytorchjob: { kind: 'kubernetes', namespace: 'train', workload: 'pytorchjobs.kubeflow.org/llama', podSelector: 'training.kubeflow.org/job-name=llama' },
    };
    const { controller, url } = await startController(testConfig(store.url, store.prefix, { launchers }));
    try {
      expect((await post(`${url}/api/v1/jobs`, { ...JOB, launcher: 'pytorchjob' })).status).toBe(201);
      await controller.backend.holdStandby('spare-1');
      await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n03', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      await until(
        'job running on the standby',
        () => controller.jobs.get('llama'),
        (record) => record.state === 'running' && record.spec.nodes.includes('spare-1'),
      );
      expect(await new DryRunBackend(store.redis, store.keys).relaunches()).toEqual(['train/training.kubeflow.org/job-name=llama']);
    } finally {
      await controller.close();
      await store.cleanup();
    }
  });
});

describe('the job eviction budget', () => {
  it("refuses to evict more than the allowed share of a job's nodes within the window", async () => {
    const store = testRedis();
    const { controller, url } = await startController(testConfig(store.url, store.prefix, { safety: { maxJobEvictionPercent: 25 } }));
    try {
      await post(`${url}/api/v1/jobs`, JOB);
      await controller.backend.holdStandby('spare-1');
      await controller.backend.holdStandby('spare-2');
      await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n00', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      await until(
        'first eviction',
        () => controller.jobs.get('llama'),
        (record) => record.state === 'running' && !record.spec.nodes.includes('n00'),
      );
      await post(`${url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n01', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      const refused = await until(
        'refusal',
        () => controller.audit.read({ type: 'action' }),
        (entries) => entries.some((entry) => entry.data.state === 'refused'),
      );
      expect(refused.find((entry) => entry.data.state === 'refused')?.data.detail).toBe(
        'job eviction budget exhausted: 1 of 4 nodes already evicted in 3600 s, at most 25 % (1) may go',
      );
      expect(Object.keys(await new DryRunBackend(store.redis, store.keys).recorded())).toEqual(['n00']);
    } finally {
      await controller.close();
      await store.cleanup();
    }
  });
});
