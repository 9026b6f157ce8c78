import { describe, expect, it } from 'vitest';
import type { Job } from 'bullmq';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { SafetyGates } from '../../../actuators/safety.js';
import { AuditLog } from '../../../core/audit.js';
import { JobStore } from '../../../controller/job-store.js';
import type { LadderEventJob, StepsJob } from '../../../core/queues.js';
import type { Step } from '../../../core/steps.js';
import { LLAMA, actionStates, recordingBackend, testStepProcessor } from '../../support/steps.js';
import { testRedis } from '../../support/redis.js';

/**
 * The hot_swap step on a real Redis with the recording backend: the epoch opened before the
 * failed node is drained and replaced, the gates of an eviction, dry-run, a swap that cannot
 * start, and a redelivery that acts on nothing twice.
 */

const JOB = { ...LLAMA, hotSwap: { spares: ['s-1', 's-2'], timeoutSeconds: 30 } };
const SWAP: Step = {
  verb: 'hot_swap',
  job: 'llama',
  nodes: ['n01'],
  spares: ['s-1'],
  reason: 'machine fault: fatal Xid 79 on n01',
  citation: 'DeadPool §V-C, §VI',
};

function transition(transitionId: string, steps: Step[] = [SWAP]): Job<StepsJob> {
  return { id: transitionId, data: { v: 2, transitionId, job: 'llama', steps }, attemptsMade: 0, opts: { attempts: 5 } } as unknown as Job<StepsJob>;
}

async function setUp(options: { maxJobEvictionPercent?: number } = {}) {
  const store = testRedis();
  const jobs = new JobStore(store.redis, store.keys);
  await jobs.create(JOB);
  const recorder = recordingBackend(store);
  await recorder.holdStandby('spare-9');
  const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 600 }, 30);
  const events: LadderEventJob[] = [];
  const processor = (backend = recorder) =>
    testStepProcessor(
      store,
      { backend, jobs, gates },
      {
        world: jobs.world,
        feedback: async (event) => events.push(event),
        ...(options.maxJobEvictionPercent !== undefined ? { maxJobEvictionPercent: options.maxJobEvictionPercent } : {}),
      },
    );
  return { store, jobs, recorder, gates, events, processor };
}

describe('the hot_swap step', () => {
  it("opens the epoch, then drains the failed node, puts the spare in its place and a free standby in the used spare's", async () => {
    const { store, jobs, recorder, processor } = await setUp();
    try {
      await recorder.holdStandby('spare-8');
      await expect(processor()(transition('t-swap'))).resolves.toEqual({ done: 1 });
      const record = await jobs.get('llama');
      expect(record.spec.nodes).toEqual(['n00', 's-1', 'n02', 'n03']);
      expect(record.spec.hotSwap?.spares).toEqual(['s-2', 'spare-8']);
      expect(await jobs.jobOnNode('s-1')).toBe('llama');
      expect(await jobs.jobOnNode('n01')).toBeUndefined();
      expect(await jobs.jobOnNode('spare-8')).toBe('llama');
      expect(Object.keys(await recorder.recorded())).toEqual(['n01']);
      const world = await jobs.world.view(record);
      expect(world).toMatchObject({ epoch: 1, state: 'swapping', spares: ['s-2', 'spare-8'], swap: { epoch: 1, replaced: { n01: 's-1' } } });
      expect(world.shards.map((shard) => shard.node)).toEqual(['n00', 's-1', 'n02', 'n03']);
      const states = await actionStates(new AuditLog(store.redis, store.keys), 't-swap:0');
      expect(states).toEqual([
        'done: opened recovery epoch 1 with s-1 in place of n01 (bound 30 s)',
        'done: drained through recorder',
        'done: spare s-1 in place of n01 in epoch 1',
        "done: standby spare-8 becomes a spare of llama in place of used spare s-1; it joins the allocation at the job's next launch",
      ]);
    } finally {
      await store.cleanup();
    }
  });

  it('acts on nothing twice when redelivered after a crash half way: one epoch, one drain, one standby taken', async () => {
    const { store, jobs, recorder, processor } = await setUp();
    try {
      await recorder.holdStandby('spare-8');
      let drains = 0;
      let crashes = 1;
      const flaky = Object.assign(Object.create(recorder) as DryRunBackend, {
        name: 'recorder',
        drain: async (node: string, reason: string) => {
          drains += 1;
          await recorder.drain(node, reason);
        },
        // The controller dies while the used spare is replaced.
        activateStandby: async (node: string, job: string) => {
          if (crashes > 0) {
            crashes -= 1;
            throw new Error('controller killed');
          }
          await recorder.activateStandby(node, job);
        },
      });
      await expect(processor(flaky)(transition('t-twice'))).rejects.toThrow('controller killed');
      await expect(processor(flaky)(transition('t-twice'))).resolves.toEqual({ done: 1 });
      const record = await jobs.get('llama');
      expect((await jobs.world.summary('llama')).epoch).toBe(1);
      expect(drains).toBe(1);
      expect(record.spec.nodes).toEqual(['n00', 's-1', 'n02', 'n03']);
      // The marker was taken before the crash: the used spare stays unreplaced rather than take two standbys.
      expect(record.spec.hotSwap?.spares).toEqual(['s-2']);
      expect((await recorder.standbys()).length).toBe(2);
    } finally {
      await store.cleanup();
    }
  });

  it('leaves the last free standby in the pool for evictions (a failed swap falls back to one): the job has a spare fewer', async () => {
    const { store, jobs, recorder, processor } = await setUp();
    try {
      await expect(processor()(transition('t-last'))).resolves.toEqual({ done: 1 });
      const record = await jobs.get('llama');
      expect(record.spec.nodes).toEqual(['n00', 's-1', 'n02', 'n03']);
      expect(record.spec.hotSwap?.spares).toEqual(['s-2']);
      expect(await recorder.standbys()).toEqual(['spare-9']);
      expect((await actionStates(new AuditLog(store.redis, store.keys), 't-last:0')).join('\n')).toContain(
        'done: the last free warm standby stays for evictions: used spare s-1 is not replaced; the job has one spare fewer',
      );
    } finally {
      await store.cleanup();
    }
  });

  it('in dry-run opens no epoch and changes no record, and the ladder hears the swap described', async () => {
    const { store, jobs, events, processor } = await setUp();
    try {
      await jobs.setPolicy('llama', { dryRun: true });
      await expect(processor()(transition('t-dry'))).resolves.toEqual({ done: 1 });
      expect(await jobs.world.summary('llama')).toEqual({ epoch: 0, state: 'steady' });
      expect((await jobs.get('llama')).spec).toMatchObject({ nodes: JOB.nodes, hotSwap: { spares: ['s-1', 's-2'] } });
      expect(events.map((event) => event.event.type)).toEqual(['hot_swap_done']);
    } finally {
      await store.cleanup();
    }
  });

  it("is refused, opening nothing, while actions are paused, with recovery off, or past the job's eviction share", async () => {
    for (const gate of ['pause', 'recovery', 'share'] as const) {
      const { store, jobs, gates, events, processor } = await setUp(gate === 'share' ? { maxJobEvictionPercent: 10 } : {});
      try {
        if (gate === 'pause') await gates.pause('maintenance');
        if (gate === 'recovery') await jobs.setPolicy('llama', { recovery: false });
        const outcome = await processor()(transition(`t-${gate}`));
        expect(outcome.halted).toBeDefined();
        expect(await jobs.world.summary('llama')).toEqual({ epoch: 0, state: 'steady' });
        expect((await jobs.get('llama')).spec.nodes).toEqual(JOB.nodes);
        expect(events.map((event) => event.event.type)).toEqual(['recovery_refused']);
      } finally {
        await store.cleanup();
      }
    }
  });

  it('tells the ladder the swap failed, naming the node to evict, when its spare is out of service', async () => {
    const { store, jobs, recorder, events, processor } = await setUp();
    try {
      await recorder.drain('s-1', 'broken');
      await expect(processor()(transition('t-broken'))).resolves.toEqual({ done: 1 });
      expect(await jobs.world.summary('llama')).toEqual({ epoch: 0, state: 'steady' });
      expect(events).toEqual([
        {
          job: 'llama',
          event: {
            type: 'hot_swap_failed',
            time: expect.any(Number),
            detail: expect.stringMatching(/^it could not start: spare s-1 is out of service/),
            evict: ['n01'],
          },
          eventId: 't-broken:0:cannot-start',
        },
      ]);
    } finally {
      await store.cleanup();
    }
  });

  it('opens an epoch with the same shards for a step without nodes, taking no node out', async () => {
    const { store, jobs, recorder, processor } = await setUp();
    try {
      await expect(
        processor()(transition('t-flap', [{ verb: 'hot_swap', job: 'llama', reason: 'network flap', citation: 'DeadPool §VI-B' }])),
      ).resolves.toEqual({ done: 1 });
      expect(await jobs.world.summary('llama')).toEqual({ epoch: 1, state: 'swapping' });
      expect((await jobs.get('llama')).spec.nodes).toEqual(JOB.nodes);
      expect(await recorder.recorded()).toEqual({});
    } finally {
      await store.cleanup();
    }
  });
});
