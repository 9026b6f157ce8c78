import { afterEach, describe, expect, it } from 'vitest';
import { DoNotRetryError, RetryLaterError } from '../../core/errors.js';
import type { ClusterBackend, NodeState } from '../../actuators/backend.js';
import { NodeLeasedError, drainNode } from '../../actuators/drain-node.js';
import { SafetyGates } from '../../actuators/safety.js';
import { testRedis } from '../support/redis.js';

/** A scheduler double: knows `known`, starts with `drained` out of service, and may ignore drains. */
class SchedulerDouble implements ClusterBackend {
  readonly name = 'double';
  readonly drainCalls: string[] = [];
  constructor(
    private readonly known: readonly string[],
    private readonly drained = new Set<string>(),
    private readonly ignoresDrains = false,
  ) {}
  async nodeState(node: string): Promise<NodeState> {
    const out = this.drained.has(node);
    return { node, exists: this.known.includes(node), drained: out, raw: out ? 'drained' : 'idle' };
  }
  async drain(node: string, reason: string): Promise<void> {
    this.drainCalls.push(`${node}: ${reason}`);
    if (!this.ignoresDrains) this.drained.add(node);
  }
  async resume(): Promise<void> {}
  async holdStandby(): Promise<void> {}
  async activateStandby(): Promise<void> {}
  async standbys(): Promise<string[]> {
    return [];
  }
}

describe('drainNode, the one way a step takes a node out (drain, evict, hand_off, a reset fallback)', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => Promise.all(stores.splice(0).map((store) => store.cleanup())));

  function gates(): SafetyGates {
    const store = testRedis();
    stores.push(store);
    return new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 60 }, 30);
  }

  const request = { node: 'node-1', holder: 'd-1:1', reason: 'fatal Xid 79', auditId: 'd-1' };

  it('drains a node in service with the audit id in the reason, and says so', async () => {
    const backend = new SchedulerDouble(['node-1']);
    await expect(drainNode(backend, gates(), request)).resolves.toMatchObject({ already: false, state: { drained: true, raw: 'drained' } });
    expect(backend.drainCalls).toEqual(['node-1: steadfast: fatal Xid 79 audit=d-1']);
  });

  it('leaves a node that is already out of service alone', async () => {
    const backend = new SchedulerDouble(['node-1'], new Set(['node-1']));
    await expect(drainNode(backend, gates(), request)).resolves.toMatchObject({ already: true });
    expect(backend.drainCalls).toEqual([]);
  });

  it('asks for a later try when the scheduler still shows the node in service after the drain, and frees the lease', async () => {
    const backend = new SchedulerDouble(['node-1'], new Set(), true);
    const held = gates();
    await expect(drainNode(backend, held, request)).rejects.toThrow(new RetryLaterError('double still shows node-1 as idle after the drain'));
    await expect(held.acquireLease('node-1', 'someone-else')).resolves.toEqual({ ok: true });
  });

  it('does not touch a node another actuator holds, and names the holder', async () => {
    const backend = new SchedulerDouble(['node-1']);
    const held = gates();
    await held.acquireLease('node-1', 'other-decision');
    const refused = drainNode(backend, held, request);
    await expect(refused).rejects.toBeInstanceOf(NodeLeasedError);
    await expect(refused).rejects.toThrow(/leased by other-decision/);
    expect(backend.drainCalls).toEqual([]);
  });

  it('refuses for good a node the scheduler does not know', async () => {
    const backend = new SchedulerDouble([]);
    await expect(drainNode(backend, gates(), request)).rejects.toBeInstanceOf(DoNotRetryError);
    expect(backend.drainCalls).toEqual([]);
  });
});
