import type { Keys, Redis } from '../core/redis.js';
import type { ClusterBackend, NodeState, ResumeOptions } from './backend.js';
import { appendOwnReason, splitReason } from './drain-reason.js';

/**
 * Records what it would do instead of doing it. Its state lives in Redis so that every worker
 * sees the same "drained" nodes and the actuator stays idempotent under dry-run too.
 */
export class DryRunBackend implements ClusterBackend {
  readonly name = 'dry-run';

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    /** The nodes the operator listed (backend.dryRun.nodes); undefined: every node name is known. */
    private readonly knownNodes?: ReadonlySet<string>,
  ) {}

  async nodeState(node: string): Promise<NodeState> {
    if (this.knownNodes !== undefined && !this.knownNodes.has(node)) return { node, exists: false, drained: false, raw: 'not in backend.dryRun.nodes' };
    const reason = await this.redis.hget(this.keys.dryRunNodes(), node);
    return reason === null
      ? { node, exists: true, drained: false, raw: 'in service (dry-run)' }
      : { node, exists: true, drained: true, reason, raw: 'drained (dry-run)', foreign: splitReason(reason).foreign };
  }

  /** As Slurm's drain: someone else's reason kept first (drain-reason.ts). */
  async drain(node: string, reason: string): Promise<void> {
    const current = await this.redis.hget(this.keys.dryRunNodes(), node);
    await this.redis.hset(this.keys.dryRunNodes(), node, appendOwnReason(current ?? undefined, reason));
  }

  /** As Slurm's resume: with someone else's reason, only steadfast's part goes. */
  async resume(node: string, options: ResumeOptions = {}): Promise<void> {
    const foreign = splitReason((await this.redis.hget(this.keys.dryRunNodes(), node)) ?? undefined).foreign;
    if (foreign !== undefined && options.force !== true) await this.redis.hset(this.keys.dryRunNodes(), node, foreign);
    else await this.redis.hdel(this.keys.dryRunNodes(), node);
  }

  /** Records the reboot; the node stays out of service, as Slurm's ASAP reboot drains it first. */
  async reboot(node: string, reason: string, nextState: 'resume' | 'down'): Promise<void> {
    await this.redis.hset(this.keys.dryRunNodes(), node, `${reason} (reboot, then ${nextState})`);
  }

  async holdStandby(node: string): Promise<void> {
    await this.redis.sadd(this.keys.dryRunStandbys(), node);
  }

  async activateStandby(node: string, _job: string): Promise<void> {
    await this.redis.srem(this.keys.dryRunStandbys(), node);
  }

  async standbys(): Promise<string[]> {
    return (await this.redis.smembers(this.keys.dryRunStandbys())).sort();
  }

  /** Records the relaunch instead of deleting pods. */
  async relaunchWorkload(namespace: string, podSelector: string): Promise<number> {
    await this.redis.rpush(this.keys.dryRunRelaunches(), `${namespace}/${podSelector}`);
    return 0;
  }

  async relaunches(): Promise<string[]> {
    return this.redis.lrange(this.keys.dryRunRelaunches(), 0, -1);
  }

  /** Everything this backend was asked to drain, for `steadfast audit` and tests. */
  async recorded(): Promise<Record<string, string>> {
    return this.redis.hgetall(this.keys.dryRunNodes());
  }
}
