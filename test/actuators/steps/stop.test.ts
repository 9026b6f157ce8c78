import type { Job } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { AuditLog } from '../../../core/audit.js';
import type { Step } from '../../../core/steps.js';
import type { StepsJob } from '../../../core/queues.js';
import { JobStore } from '../../../controller/job-store.js';
import { testStepProcessor } from '../../support/steps.js';
import { testRedis } from '../../support/redis.js';

/**
 * The stop step and the relaunch guard: a Slurm-launched job's previous run is cancelled (by the
 * backend, which finds it by the job's name) before anything else, and again before a relaunch
 * if one is still there; a backend that stops nothing records the stop. test/lab/ runs the same
 * against real Slurm.
 */

const JOB = {
  name: 'llama',
  nodes: ['n00', 'n01'],
  ranksPerNode: 1,
  topology: { dp: 2 },
  launcher: 'accept',
  codeVersion: 'v1',
};

const steps = (...verbs: ('stop' | 'restart' | 'reattempt')[]): Step[] => verbs.map((verb) => ({ verb, job: 'llama', reason: 'test', citation: '§4.1' }));
const recoveryJob = (transitionId: string, list: Step[]): Job<StepsJob> =>
  ({ id: transitionId, data: { v: 2, transitionId, job: 'llama', steps: list }, attemptsMade: 0, opts: { attempts: 5 } }) as unknown as Job<StepsJob>;

describe('the stop step', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(cancel?: (name: string) => Promise<string[]>): Promise<{ processor: ReturnType<typeof testStepProcessor>; audit: AuditLog }> {
    const store = testRedis();
    stores.push(store);
    const jobs = new JobStore(store.redis, store.keys);
    await jobs.create(JOB);
    const dryRun = new DryRunBackend(store.redis, store.keys);
    const backend = cancel ? Object.assign(Object.create(dryRun) as DryRunBackend, { name: 'slurm', cancelJobs: cancel }) : dryRun;
    const audit = new AuditLog(store.redis, store.keys);
    const processor = testStepProcessor(store, { backend, jobs, audit });
    return { processor, audit };
  }

  const actions = async (audit: AuditLog): Promise<string[]> => (await audit.read({ type: 'action' })).map((entry) => entry.summary);

  it("cancels the job's runs by its name, then finds none left before the relaunch", async () => {
    const calls: string[] = [];
    let running = ['41'];
    const { processor, audit } = await setUp(async (name) => {
      calls.push(name);
      const cancelled = running;
      running = [];
      return cancelled;
    });
    await expect(processor(recoveryJob('t-stop', steps('stop', 'restart')))).resolves.toEqual({ done: 2, halted: undefined });
    expect(calls).toEqual(['llama', 'llama']);
    expect(await actions(audit)).toEqual([
      'llama: stop: done (cancelled Slurm job 41 named llama; gone from the queue)',
      'llama: restart: done (launched v1 on n00,n01: ok)',
    ]);
  });

  it('cancels a run still there before a reattempt that has no stop step in front of it, and says so', async () => {
    const { processor, audit } = await setUp(async () => ['42', '43']);
    await processor(recoveryJob('t-again', steps('reattempt')));
    expect(await actions(audit)).toEqual([
      'llama: reattempt: done (launched v1 on n00,n01: ok; before it, cancelled Slurm jobs 42, 43 named llama; gone from the queue)',
    ]);
  });

  it('records the stop when nothing runs, and when the backend stops nothing', async () => {
    const idle = await setUp(async () => []);
    await idle.processor(recoveryJob('t-idle', steps('stop')));
    expect(await actions(idle.audit)).toEqual(['llama: stop: done (no Slurm job named llama was running)']);
    const dryRun = await setUp();
    await dryRun.processor(recoveryJob('t-dry', steps('stop')));
    expect(await actions(dryRun.audit)).toEqual(['llama: stop: done (recorded (the dry-run backend stops nothing for a slurm launcher))']);
  });

  it('does not relaunch while the previous run cannot be confirmed gone: the step fails to be retried', async () => {
    const { processor, audit } = await setUp(async () => {
      throw new Error('Slurm jobs 44 named llama are still listed after scancel');
    });
    await expect(processor(recoveryJob('t-stuck', steps('restart')))).rejects.toThrow('still listed');
    // The failed try is on record; the queue's next try runs the step again.
    expect(await actions(audit)).toEqual(['llama: restart: failed (Slurm jobs 44 named llama are still listed after scancel; will retry)']);
  });
});
