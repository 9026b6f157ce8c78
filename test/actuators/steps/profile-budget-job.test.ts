import type { Job } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { AuditLog } from '../../../core/audit.js';
import { profilesSchema } from '../../../core/profiles.js';
import type { StepsJob } from '../../../core/queues.js';
import { JobStore } from '../../../controller/job-store.js';
import { ProfileResolver } from '../../../controller/profile-resolver.js';
import { LLAMA, testStepProcessor } from '../../support/steps.js';
import { testRedis } from '../../support/redis.js';

/** One eviction of `node` from the test job, as the ladder queues it. */
function eviction(transitionId: string, node: string): Job<StepsJob> {
  const data: StepsJob = {
    v: 2,
    transitionId,
    job: 'llama',
    steps: [{ verb: 'evict', job: 'llama', nodes: [node], reason: 'machine fault', citation: '§4.1' }],
  };
  return { id: transitionId, data, attemptsMade: 0, opts: { attempts: 5 } } as unknown as Job<StepsJob>;
}

/**
 * A job's evictions spend the evicted node's profile budget where its profile has one: the
 * training partition's budget runs out for its own nodes, while a node of the same job in no
 * profile is still evicted under the global budget.
 */
describe("a job's eviction and its node's profile budget", () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  it("takes the eviction from the node's profile budget, refusing past it, and names the profile in the audit", async () => {
    const store = testRedis();
    stores.push(store);
    const jobs = new JobStore(store.redis, store.keys);
    await jobs.create(LLAMA);
    const backend = new DryRunBackend(store.redis, store.keys);
    for (const spare of ['spare-1', 'spare-2', 'spare-3']) await backend.holdStandby(spare);
    const audit = new AuditLog(store.redis, store.keys);
    const profiles = new ProfileResolver(
      profilesSchema.parse([{ name: 'h100-train', match: { nodes: ['n01', 'n02'] }, safety: { maxDrainsPerWindow: 1, windowSeconds: 3600 } }]),
      {},
    );
    const steps = testStepProcessor(store, { backend, jobs, audit }, { profiles });

    await steps(eviction('t-1', 'n01'));
    await steps(eviction('t-2', 'n02'));
    await steps(eviction('t-3', 'n03'));

    const drained = Object.keys(await backend.recorded()).sort();
    expect(drained).toEqual(['n01', 'n03']);
    const actions = (await audit.read({ type: 'action', limit: 50 })).map((entry) => entry.summary);
    expect(actions).toContainEqual(expect.stringMatching(/^llama: evict n01: done .*\[profile h100-train\]$/));
    expect(actions).toContainEqual('llama: evict: refused (eviction budget exhausted: 1 drains per 3600 s already used) [profile h100-train]');
    expect(actions).toContainEqual(expect.stringMatching(/^llama: evict n03: done (?!.*\[profile)/));
  });
});
