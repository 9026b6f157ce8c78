import { UnrecoverableError, type Job } from 'bullmq';
import { afterEach, describe, expect, it } from 'vitest';
import type { Decision } from '../../core/action.js';
import { AuditLog } from '../../core/audit.js';
import { RetryLaterError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import type { ClusterBackend, NodeState } from '../../actuators/backend.js';
import { createDrainProcessor } from '../../actuators/drain.js';
import type { ActionJob } from '../../core/queues.js';
import { SafetyGates } from '../../actuators/safety.js';
import { testRedis } from '../support/redis.js';

/** A scheduler double that fails its first `failures` drains, then works; counts every call. */
class FlakyBackend implements ClusterBackend {
  readonly name = 'flaky';
  readonly drained = new Map<string, string>();
  calls = 0;
  constructor(private failures: number, private readonly known = ['node-1']) {}
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

function decision(node: string): Decision {
  return {
    id: `d-${node}`,
    verb: 'drain',
    node,
    idempotencyKey: `drain-${node}-d-${node}`,
    reason: 'fatal Xid 48 on GPU 0000:18:00',
    signalId: 's-1',
    fingerprint: `xid/${node}/0000:18:00/48`,
    faultTime: new Date().toISOString(),
    time: new Date().toISOString(),
  };
}

function job(data: ActionJob, attemptsMade: number): Job<ActionJob> {
  return { id: 'job-1', data, attemptsMade, opts: { attempts: 3 } } as unknown as Job<ActionJob>;
}

describe('drain actuator', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => Promise.all(stores.splice(0).map((store) => store.cleanup())));

  function setUp(backend: ClusterBackend): { processor: ReturnType<typeof createDrainProcessor>; audit: AuditLog } {
    const store = testRedis();
    stores.push(store);
    const audit = new AuditLog(store.redis, store.keys);
    const gates = new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 60 }, 30);
    return { processor: createDrainProcessor({ redis: store.redis, keys: store.keys, audit, backend, gates, logger: silentLogger() }), audit };
  }

  it('audits a failed try, retries, and counts the retried decision once against the budget', async () => {
    const backend = new FlakyBackend(1);
    const { processor, audit } = setUp(backend);
    const data = { decision: decision('node-1') };
    await expect(processor(job(data, 0))).rejects.toBeInstanceOf(RetryLaterError);
    await expect(processor(job(data, 1))).resolves.toMatchObject({ state: 'done' });
    const states = (await audit.read({ type: 'action' })).map((entry) => `${String(entry.data.state)}: ${String(entry.data.detail)}`);
    expect(states).toEqual([
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
    await expect(processor(job({ decision: decision('node-9') }, 0))).rejects.toBeInstanceOf(UnrecoverableError);
    const [entry] = await audit.read({ type: 'action' });
    expect(entry?.data.detail).toBe('node node-9 is unknown to the flaky backend');
    expect(backend.calls).toBe(0);
  });

  it('does not call the backend for a node that is already out of service', async () => {
    const backend = new FlakyBackend(0);
    backend.drained.set('node-1', 'drained by an admin');
    const { processor } = setUp(backend);
    await expect(processor(job({ decision: decision('node-1') }, 0))).resolves.toEqual({
      state: 'done',
      detail: 'already out of service (drained: drained by an admin); nothing to do',
    });
    expect(backend.calls).toBe(0);
  });
});
