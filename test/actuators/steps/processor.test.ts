import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import { JobStore } from '../../../controller/job-store.js';
import { AuditLog } from '../../../core/audit.js';
import { RetryLaterError } from '../../../core/errors.js';
import { testRedis } from '../../support/redis.js';
import { queued, recordingBackend, testStepProcessor } from '../../support/steps.js';

describe('the step processor', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => Promise.all(stores.splice(0).map((store) => store.cleanup())));

  async function setUp() {
    const store = testRedis();
    stores.push(store);
    const jobs = new JobStore(store.redis, store.keys);
    await jobs.create({ name: 'llama', nodes: ['n00', 'n01'], ranksPerNode: 1, launcher: 'accept', codeVersion: 'v1' });
    const audit = new AuditLog(store.redis, store.keys);
    return { store, jobs, audit, processor: testStepProcessor(store, { backend: recordingBackend(store), jobs, audit }) };
  }

  const restart = { v: 2, transitionId: 't-restart', job: 'llama', steps: [{ verb: 'restart', job: 'llama', reason: 'relaunch', citation: '§6.2' }] };

  it('fails a payload it cannot read for good, naming what is wrong, and acts on nothing', async () => {
    const { processor, audit } = await setUp();
    await expect(
      processor(queued({ v: 2, transitionId: 't-bad', job: 'llama', steps: [{ verb: 'format_disk', reason: 'x', citation: 'x' }] })),
    ).rejects.toThrow(UnrecoverableError);
    await expect(
      processor(queued({ v: 2, transitionId: 't-bad', job: 'llama', steps: [{ verb: 'format_disk', reason: 'x', citation: 'x' }] })),
    ).rejects.toThrow(/^invalid steps job payload: steps\.0\.verb/);
    await expect(processor(queued('garbage'))).rejects.toThrow(UnrecoverableError);
    expect(await audit.read({ type: 'action' })).toEqual([]);
  });

  it('runs one transition of a job at a time: another one waits its turn on the delayed set, not as a failed try', async () => {
    const { store, processor, audit } = await setUp();
    // Another transition of the job is under way (its hold, as the processor takes it).
    await store.redis.set(store.keys.jobStepsHold('llama'), 'another-transition', 'PX', 60_000);
    const delays: number[] = [];
    const waiting = { ...queued(restart), moveToDelayed: async (until: number) => void delays.push(until) } as unknown as Job;
    await expect(processor(waiting, 'token-1')).rejects.toBeInstanceOf(DelayedError);
    expect(delays).toHaveLength(1);
    // Without a worker's token (a direct call), a retry later.
    await expect(processor(queued(restart))).rejects.toBeInstanceOf(RetryLaterError);
    expect(await audit.read({ type: 'action' })).toEqual([]);
    // Its turn: the other transition let go of the job.
    await store.redis.del(store.keys.jobStepsHold('llama'));
    await expect(processor(queued(restart))).resolves.toEqual({ done: 1 });
    expect((await audit.read({ type: 'action' })).map((entry) => entry.summary)).toEqual(['llama: restart: done (launched v1 on n00,n01: ok)']);
    // and lets go of the job when done.
    expect(await store.redis.exists(store.keys.jobStepsHold('llama'))).toBe(0);
  });
});
