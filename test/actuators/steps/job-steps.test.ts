import { describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import type { ClusterBackend } from '../../../actuators/backend.js';
import { AuditLog } from '../../../core/audit.js';
import { JobStore } from '../../../controller/job-store.js';
import type { Step } from '../../../core/steps.js';
import type { LadderEventJob, StepsJob } from '../../../core/queues.js';
import { LLAMA as JOB, testStepProcessor } from '../../support/steps.js';
import { testRedis } from '../../support/redis.js';

/**
 * A job's steps on a real Redis, without the controller around them: a transition interrupted
 * half way, the replacement reported to the ladder, evictions the scheduler cannot carry out, and
 * the exclusion history across jobs.
 */

/** The step processor alone, on the test Redis, with a generous budget and no ladder behind it. */
function recoveryProcessor(
  store: ReturnType<typeof testRedis>,
  backend: ClusterBackend,
  jobs: JobStore,
  onPage?: (job: string | undefined, reason: string) => void,
  feedback: (event: LadderEventJob) => Promise<unknown> = async () => undefined,
): ReturnType<typeof testStepProcessor> {
  return testStepProcessor(store, { backend, jobs }, { feedback, onPage });
}

/** A BullMQ job as the step processor receives it, first delivery. */
function recoveryJob(transitionId: string, job: string, steps: Step[]): Job<StepsJob> {
  return { id: transitionId, data: { v: 2, transitionId, job, steps }, attemptsMade: 0, opts: { attempts: 5 } } as unknown as Job<StepsJob>;
}

/** The test job registered on a fresh key prefix, with the dry-run backend holding one standby. */
/** The dry-run backend, but `missing` is a node it does not know. */
function withUnknownNode(backend: DryRunBackend, missing: string): DryRunBackend {
  return Object.assign(Object.create(backend) as DryRunBackend, {
    nodeState: async (node: string) => ({ ...(await backend.nodeState(node)), exists: node !== missing }),
  });
}

async function registeredJobOnDryRun(): Promise<{ store: ReturnType<typeof testRedis>; jobs: JobStore; backend: DryRunBackend }> {
  const store = testRedis();
  const jobs = new JobStore(store.redis, store.keys);
  await jobs.create(JOB);
  const backend = new DryRunBackend(store.redis, store.keys);
  await backend.holdStandby('spare-1');
  return { store, jobs, backend };
}

describe('a recovery interrupted half way', () => {
  it('resumes after a crash without draining the node a second time', async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      let drains = 0;
      let crashes = 1;
      const flaky = Object.assign(Object.create(backend) as DryRunBackend, {
        drain: async (node: string, reason: string) => {
          drains += 1;
          await backend.drain(node, reason);
        },
        // The controller dies right after draining, before the standby is activated.
        activateStandby: async (node: string, job: string) => {
          if (crashes > 0) {
            crashes -= 1;
            throw new Error('controller killed');
          }
          await backend.activateStandby(node, job);
        },
      });
      const processor = recoveryProcessor(store, flaky, jobs);
      const steps = [
        { verb: 'stop' as const, job: 'llama', reason: 'machine fault', citation: '§4.1' },
        { verb: 'evict' as const, job: 'llama', nodes: ['n01'], reason: 'machine fault', citation: '§4.1' },
        { verb: 'restart' as const, job: 'llama', reason: 'relaunch', citation: '§6.2' },
      ];
      const job = recoveryJob('t-1', 'llama', steps);
      await expect(processor(job)).rejects.toThrow('controller killed');
      await expect(processor(job)).resolves.toEqual({ done: 2 });
      expect(drains).toBe(1);
      expect((await jobs.get('llama')).spec.nodes).toEqual(['n00', 'spare-1', 'n02', 'n03']);
    } finally {
      await store.cleanup();
    }
  });
});

describe('the replacement reported to the ladder', () => {
  const steps = [{ verb: 'evict' as const, job: 'llama', nodes: ['n01'], reason: 'machine fault', citation: '§4.1' }];

  it("tells the ladder which standby took the evicted node's place, once per step", async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      const events: LadderEventJob[] = [];
      const processor = recoveryProcessor(store, backend, jobs, undefined, async (event) => events.push(event));
      await expect(processor(recoveryJob('t-standby', 'llama', steps))).resolves.toEqual({ done: 1 });
      expect(events).toEqual([
        { job: 'llama', event: { type: 'standby_activated', time: expect.any(Number), replaced: 'n01', by: 'spare-1' }, eventId: 't-standby:0:standby:n01' },
      ]);
    } finally {
      await store.cleanup();
    }
  });

  it('tells the ladder that no replay ran on a controller without an analysis worker, rather than that it isolated no machine', async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      const events: LadderEventJob[] = [];
      const processor = recoveryProcessor(store, backend, jobs, undefined, async (event) => events.push(event));
      const replay = [{ verb: 'run_replay' as const, job: 'llama', reason: 'the reattempt failed', citation: '§4.2' }];
      await expect(processor(recoveryJob('t-replay', 'llama', replay))).resolves.toEqual({ done: 1 });
      expect(events).toEqual([
        {
          job: 'llama',
          event: { type: 'replay_result', time: expect.any(Number), culprits: [], unrun: 'this controller runs no analysis worker' },
          eventId: 't-replay:0:replay',
        },
      ]);
    } finally {
      await store.cleanup();
    }
  });

  it('finishes the eviction when the report cannot be delivered, rather than take a second standby on a retry', async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      await backend.holdStandby('spare-2');
      const processor = recoveryProcessor(store, backend, jobs, undefined, async () => {
        throw new Error('Redis went away');
      });
      await expect(processor(recoveryJob('t-lost', 'llama', steps))).resolves.toEqual({ done: 1 });
      expect((await jobs.get('llama')).spec.nodes).toEqual(['n00', 'spare-1', 'n02', 'n03']);
      expect(await backend.standbys()).toEqual(['spare-2']);
    } finally {
      await store.cleanup();
    }
  });
});

describe('evictions the scheduler cannot carry out', () => {
  it('records an unknown node as a failed eviction, pages, and stops the transition before its restart', async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      const unknown = withUnknownNode(backend, 'n01');
      const pages: string[] = [];
      const processor = recoveryProcessor(store, unknown, jobs, (_job, reason) => pages.push(reason));
      const steps = [
        { verb: 'evict' as const, job: 'llama', nodes: ['n01'], reason: 'machine fault', citation: '§4.1' },
        { verb: 'restart' as const, job: 'llama', reason: 'relaunch', citation: '§6.2' },
      ];
      await expect(processor(recoveryJob('t-unknown', 'llama', steps))).resolves.toEqual({
        done: 1,
        halted: 'evict stopped the transition: node n01 is unknown to the dry-run backend',
      });
      expect(pages).toEqual(['node n01 is unknown to the dry-run backend']);
      const actions = (await new AuditLog(store.redis, store.keys).read({ type: 'action' })).map((entry) => entry.summary);
      expect(actions).toEqual(['llama: evict n01: failed (node n01 is unknown to the dry-run backend)']);
      expect((await jobs.get('llama')).spec.nodes).toEqual(JOB.nodes);
      expect(await new DryRunBackend(store.redis, store.keys).recorded()).toEqual({});
    } finally {
      await store.cleanup();
    }
  });

  it('stops a redelivered transition where the first delivery stopped, and tells the ladder then if it could not before', async () => {
    const { store, jobs, backend } = await registeredJobOnDryRun();
    try {
      const unknown = withUnknownNode(backend, 'n01');
      const told: LadderEventJob[] = [];
      let reachable = false;
      const processor = recoveryProcessor(store, unknown, jobs, undefined, async (event) => {
        if (!reachable) throw new Error('Redis went away');
        told.push(event);
      });
      const steps = [
        { verb: 'evict' as const, job: 'llama', nodes: ['n01'], reason: 'machine fault', citation: '§4.1' },
        { verb: 'restart' as const, job: 'llama', reason: 'relaunch', citation: '§6.2' },
      ];
      await expect(processor(recoveryJob('t-retold', 'llama', steps))).rejects.toThrow('Redis went away');
      reachable = true;
      // The redelivery: the eviction is not tried again, the restart is not run, the refusal is told.
      await expect(processor(recoveryJob('t-retold', 'llama', steps))).resolves.toEqual({
        done: 0,
        halted: 'evict stopped the transition: node n01 is unknown to the dry-run backend',
      });
      expect(told).toEqual([
        {
          job: 'llama',
          event: {
            type: 'recovery_refused',
            time: expect.any(Number),
            transitionId: 't-retold',
            detail: 'evict stopped the transition: node n01 is unknown to the dry-run backend',
          },
          eventId: 't-retold:refused',
        },
      ]);
      const actions = (await new AuditLog(store.redis, store.keys).read({ type: 'action' })).map((entry) => entry.summary);
      expect(actions).toEqual(['llama: evict n01: failed (node n01 is unknown to the dry-run backend)']);
    } finally {
      await store.cleanup();
    }
  });
});

describe('exclusion history across jobs', () => {
  it('quarantines a node evicted three times within a week, whichever jobs it served', async () => {
    const store = testRedis();
    try {
      const jobs = new JobStore(store.redis, store.keys);
      const backend = new DryRunBackend(store.redis, store.keys);
      const pages: string[] = [];
      const processor = recoveryProcessor(store, backend, jobs, (_job, reason) => pages.push(reason));
      for (const [round, name] of ['job-a', 'job-b', 'job-c'].entries()) {
        await jobs.create({ ...JOB, name, nodes: ['flaky', `x${round}`, `y${round}`, `z${round}`] });
        const steps = [{ verb: 'evict' as const, job: name, nodes: ['flaky'], reason: 'machine fault', citation: '§4.1' }];
        await processor(recoveryJob(`t-${round}`, name, steps));
        // The job ends; the repaired node serves the next one.
        await jobs.finish(name, 'done');
        await backend.resume('flaky');
      }
      expect(await store.redis.smembers(store.keys.quarantine)).toEqual(['flaky']);
      expect(pages.some((reason) => reason === 'flaky was excluded 3 times within 7 days; quarantined until an operator returns it')).toBe(true);
    } finally {
      await store.cleanup();
    }
  });
});
