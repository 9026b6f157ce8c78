import { UnrecoverableError } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import { RetryLaterError } from '../../../core/errors.js';
import type { ClusterBackend, NodeState } from '../../../actuators/backend.js';
import { testRedis } from '../../support/redis.js';
import { actionStates, lastAction, nodeTransition, queued, testStepProcessor } from '../../support/steps.js';

/** A scheduler double that fails its first `failures` drains, then works; counts every call. */
class FlakyBackend implements ClusterBackend {
  readonly name = 'flaky';
  readonly drained = new Map<string, string>();
  calls = 0;
  constructor(
    private failures: number,
    private readonly known = ['node-1'],
  ) {}
  async nodeState(node: string): Promise<NodeState> {
    const reason = this.drained.get(node);
    return { node, exists: this.known.includes(node), drained: reason !== undefined, reason, raw: reason ? 'drained' : 'idle' };
  }
  async drain(node: string, reason: string): Promise<void> {
    this.calls += 1;
    if (this.failures > 0) {
      this.failures -= 1;
      throw new RetryLaterError('slurmctld not responding');
    }
    this.drained.set(node, reason);
  }
  async resume(node: string): Promise<void> {
    this.drained.delete(node);
  }
  async holdStandby(): Promise<void> {}
  async activateStandby(): Promise<void> {}
  async standbys(): Promise<string[]> {
    return [];
  }
}

const drainOf = (node: string) => nodeTransition('drain', { id: `d-${node}`, node, reason: 'fatal Xid 48 on GPU 0000:18:00' });

describe('the drain step (a node outside any job)', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => Promise.all(stores.splice(0).map((store) => store.cleanup())));

  function setUp(backend: ClusterBackend): { processor: ReturnType<typeof testStepProcessor>; audit: AuditLog } {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    return { processor: testStepProcessor(store, { backend, audit }), audit };
  }

  it('audits a failed try, retries, and counts the retried decision once against the budget', async () => {
    const backend = new FlakyBackend(1);
    const { processor, audit } = setUp(backend);
    const data = drainOf('node-1');
    await expect(processor(queued(data, 0))).rejects.toBeInstanceOf(RetryLaterError);
    await expect(processor(queued(data, 1))).resolves.toEqual({ done: 1, halted: undefined });
    // Delivered again after it was done: nothing more happens.
    await expect(processor(queued(data, 2))).resolves.toEqual({ done: 0, halted: undefined });
    expect(await actionStates(audit)).toEqual([
      'running: draining through flaky',
      'failed: slurmctld not responding; will retry',
      'running: draining through flaky',
      'done: drained: steadfast: fatal Xid 48 on GPU 0000:18:00 audit=d-node-1',
    ]);
    expect(backend.calls).toBe(2);
  });

  it('fails for good, without retrying, when the scheduler does not know the node', async () => {
    const backend = new FlakyBackend(0);
    const { processor, audit } = setUp(backend);
    await expect(processor(queued(drainOf('node-9'), 0))).rejects.toBeInstanceOf(UnrecoverableError);
    const [entry] = await audit.read({ type: 'action' });
    expect(entry?.data.detail).toBe('node node-9 is unknown to the flaky backend');
    expect(backend.calls).toBe(0);
  });

  it('does not call the backend for a node that is already out of service', async () => {
    const backend = new FlakyBackend(0);
    backend.drained.set('node-1', 'drained by an admin');
    const { processor, audit } = setUp(backend);
    await processor(queued(drainOf('node-1'), 0));
    expect(await lastAction(audit, 'd-node-1')).toEqual({ state: 'done', detail: 'already out of service (drained: drained by an admin); nothing to do' });
    expect(backend.calls).toBe(0);
  });

  it("finds its own lease on a later try (a try cut short before it could let go), but waits for another actuator's", async () => {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const backend = new FlakyBackend(0);
    const processor = testStepProcessor(store, { backend, audit });
    // Another actuator works on node-1: this drain is a later try, not a failure.
    await store.redis.set(store.keys.nodeLease('node-1'), 'someone-else', 'PX', 60_000);
    await expect(processor(queued(drainOf('node-1'), 0))).rejects.toBeInstanceOf(RetryLaterError);
    // The first try of this very transition took the lease and never released it (Redis went away).
    await store.redis.set(store.keys.nodeLease('node-1'), 'd-node-1:job-1', 'PX', 60_000);
    await expect(processor(queued(drainOf('node-1'), 1))).resolves.toEqual({ done: 1 });
    expect(backend.calls).toBe(1);
    expect(await lastAction(audit, 'd-node-1')).toMatchObject({ state: 'done' });
  });
});
