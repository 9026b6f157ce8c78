import { afterEach, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import type { GpuResetReport } from '../../../core/remedy.js';
import { remediesSchema } from '../../../core/remedy-config.js';
import type { ClusterBackend } from '../../../actuators/backend.js';
import { FOREIGN_SCAN_INTERVAL_MS, ForeignHolds } from '../../../actuators/foreign-holds.js';
import { RemediationHistory } from '../../../actuators/remediation-history.js';
import type { GpuResetter } from '../../../actuators/steps/gpu-resetter.js';
import { StandbyPool } from '../../../actuators/standby-pool.js';
import type { Job } from 'bullmq';
import { JobStore } from '../../../controller/job-store.js';
import type { StepsJob } from '../../../core/queues.js';
import { testRedis } from '../../support/redis.js';
import { lastAction, nodeTransition, queued, recordingBackend, testStepProcessor } from '../../support/steps.js';

/** An agent double: runs `during` (someone acting on the node meanwhile), then answers `outcome`. */
function resetter(outcome: GpuResetReport['outcome'], during: () => Promise<void> = async () => undefined): GpuResetter {
  return {
    async reset(node, gpu) {
      await during();
      const reason = outcome === 'reset' ? 'GPU 2 reset and listed again' : 'persistence mode is on';
      return { node, gpu, index: 2, outcome, processes: [], stopped: [], reason, seconds: 0.5 };
    },
  };
}

describe("others' drains: a node outside any job after a GPU reset", () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  function setUp(makeResetter: (backend: ClusterBackend) => GpuResetter) {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const backend = recordingBackend(store);
    const steps = testStepProcessor(
      store,
      { backend, audit },
      {
        history: new RemediationHistory(store.redis, store.keys, 10),
        resetter: makeResetter(backend),
        remedies: remediesSchema.parse({ gpuReset: { busyRetries: 0, busyRetryDelaySeconds: 0 } }),
      },
    );
    const resetStep = async () => {
      await steps(queued(nodeTransition('reset_gpu', { id: 'd-r1' })));
      return lastAction(audit, 'd-r1');
    };
    return { store, audit, backend, resetStep };
  }

  it('does not return a node it took out once an administrator has drained it too during the reset', async () => {
    const { backend, resetStep } = setUp((backend) => resetter('reset', () => backend.drain('node-1', 'admin: BIOS update')));
    const result = await resetStep();
    expect(result.state).toBe('done');
    expect(result.detail).toContain('node left out of service: node-1 is also out of service by someone else (admin: BIOS update); their drain is kept');
    expect(await backend.nodeState('node-1')).toMatchObject({ drained: true, reason: 'admin: BIOS update' });
  });

  it('leaves a node an administrator drained before drained with their reason, after a reset that held', async () => {
    const { backend, resetStep } = setUp(() => resetter('reset'));
    await backend.drain('node-1', 'admin: fan replacement');
    expect((await resetStep()).detail).toContain('node left out of service, as it was before');
    expect(await backend.nodeState('node-1')).toMatchObject({ drained: true, reason: 'admin: fan replacement' });
  });

  it("appends its drain reason after an administrator's when the reset is refused, never overwriting it", async () => {
    const { backend, resetStep } = setUp(() => resetter('refused'));
    await backend.drain('node-1', 'admin: fan replacement');
    const result = await resetStep();
    expect(result.detail).toBe('GPU reset refused (persistence mode is on); node drained instead; someone else\'s drain ("admin: fan replacement") kept first');
    const { reason } = await backend.nodeState('node-1');
    expect(reason).toMatch(/^admin: fan replacement; steadfast: fatal Xid 48 .*GPU reset refused: persistence mode is on audit=d-r1$/);
  });
});

describe("others' drains: a node of a job", () => {
  const store = testRedis();
  afterEach(async () => store.cleanup());

  it('resets the GPU of a node an administrator drained, then evicts it onto a standby instead of relaunching on it, their drain kept', async () => {
    const jobs = new JobStore(store.redis, store.keys);
    await jobs.create({ name: 'llama', nodes: ['n00', 'n01'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' });
    const backend = recordingBackend(store);
    await backend.holdStandby('spare-1');
    await backend.drain('n01', 'admin: fan replacement');
    const audit = new AuditLog(store.redis, store.keys);
    let resets = 0;
    const process = testStepProcessor(
      store,
      { backend, jobs, audit },
      {
        resetter: { reset: async (node, gpu) => ((resets += 1), await resetter('reset').reset(node, gpu, 30)) },
        history: new RemediationHistory(store.redis, store.keys, 20),
        remedies: remediesSchema.parse({ gpuReset: { busyRetries: 0 } }),
      },
    );
    const steps = [
      { verb: 'reset_gpu' as const, job: 'llama', nodes: ['n01'], gpu: '0000:3a:00', reason: 'fatal Xid 48 on n01', citation: 'test' },
      { verb: 'restart' as const, job: 'llama', reason: 'relaunch after the reset', citation: 'test' },
    ];
    await process({ id: 't-1', data: { v: 2, transitionId: 't-1', job: 'llama', steps }, attemptsMade: 0, opts: { attempts: 5 } } as unknown as Job<StepsJob>);
    expect(resets).toBe(1);
    expect((await jobs.get('llama')).spec.nodes).toEqual(['n00', 'spare-1']);
    expect(await backend.nodeState('n01')).toMatchObject({ drained: true, reason: 'admin: fan replacement' });
    const actions = (await audit.read({ type: 'action', limit: 100 })).map((entry) => entry.summary);
    expect(
      actions.some((summary) => /reset_gpu n01: done .*drained by someone else \("admin: fan replacement"\): evicting it, their drain kept/.test(summary)),
    ).toBe(true);
  });
});

describe("others' drains as signals: kept out of the standby choice", () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  it('audits a drain someone else made once per change and never hands that standby to a job', async () => {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const backend = recordingBackend(store);
    const pool = new StandbyPool(store.redis, store.keys, backend, { candidates: ['sb-1'], dailyFailureRate: 0.01, quantile: 0.99 });
    expect(await pool.reconcile(1000, new Set())).toEqual(['sb-1']);
    await pool.selfCheck('sb-1', true, 'healthy');

    await backend.drain('sb-1', 'admin: fan');
    const now = Date.now();
    expect(await pool.scanForeign(audit, new Set(['node-1']), now)).toEqual(['node-1', 'sb-1']);
    // Within the interval no replica reads again; a later read of the same hold audits nothing new.
    expect(await pool.scanForeign(audit, new Set(['node-1']), now + 1000)).toEqual([]);
    await new ForeignHolds(store.redis, store.keys).note(
      audit,
      backend.name,
      'sb-1',
      'drained by someone else (reason "admin: fan")',
      now + FOREIGN_SCAN_INTERVAL_MS,
    );

    const signals = await audit.read({ type: 'signal', limit: 100 });
    expect(signals.map((entry) => entry.summary)).toEqual(['sb-1: drained by someone else (reason "admin: fan"); kept out of standby choice']);
    expect(await pool.take('llama')).toBeUndefined();

    await backend.resume('sb-1', { force: true });
    await new ForeignHolds(store.redis, store.keys).note(audit, backend.name, 'sb-1', '', now + 2 * FOREIGN_SCAN_INTERVAL_MS);
    expect(await pool.take('llama')).toBe('sb-1');
  });
});
