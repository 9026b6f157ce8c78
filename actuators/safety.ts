import { z } from 'zod';
import type { Config } from '../core/config.js';
import type { MaintenanceWindow } from '../core/remedy-config.js';
import type { Logger } from '../core/log.js';
import { Locks } from '../core/locks.js';
import type { Keys, Redis } from '../core/redis.js';

/** How often the nodes of a maintenance window's partitions are read again from the scheduler. */
const PARTITION_REFRESH_MS = 60_000;

/**
 * The safety gates every actuator passes, in this order (after the Kubernetes
 * remediation controllers): pause, hold, budget, per-node lease. A refusal is a value with a
 * reason, not an exception, so the actuator can audit it.
 */

export type Gate = 'pause' | 'hold' | 'budget' | 'lease';
export type GateVerdict = { readonly ok: true } | { readonly ok: false; readonly gate: Gate; readonly reason: string };

/** An operator's hold on a node (maintenance): no actuator acts on it until `until` or its release. */
export const nodeHoldSchema = z.object({ reason: z.string().min(1).max(500), since: z.string(), until: z.string() }).strict();
export type NodeHold = z.infer<typeof nodeHoldSchema>;

/** Drains per window: the count, and at most `maxDrainPercent` of the cluster when both are set. */
export function drainBudget(safety: Config['safety']): number {
  if (safety.clusterNodes === undefined || safety.maxDrainPercent === undefined) return safety.maxDrainsPerWindow;
  return Math.min(safety.maxDrainsPerWindow, Math.floor((safety.clusterNodes * safety.maxDrainPercent) / 100));
}

export interface BudgetOptions {
  readonly maxPerWindow: number;
  readonly windowSeconds: number;
}

/** The nodes of maintenance windows' partitions as last read, and when: shared by gates that differ only in their budget. */
interface PartitionCache {
  nodes: Map<string, string[]>;
  readAt: number;
}

export class SafetyGates {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly budget: BudgetOptions,
    private readonly leaseSeconds: number,
    /** Scheduled maintenance (remedies.maintenanceWindows): a node in an open window is treated as held. */
    private readonly windows: readonly MaintenanceWindow[] = [],
    /** The nodes of a partition, from the scheduler (ClusterBackend.partitionNodes), for windows by partition. */
    private readonly partitionNodes?: (partition: string) => Promise<string[]>,
    private readonly logger?: Logger,
    /** The profile whose own budget these gates count (withBudget); undefined: the global budget. */
    private readonly budgetProfile?: string,
    /** Shared with the gates this one was made from (withBudget), so the partitions are read once a minute, not once per budget. */
    private readonly partitionCache: PartitionCache = { nodes: new Map(), readAt: Number.NEGATIVE_INFINITY },
  ) {
    if (windows.some((window) => window.partitions !== undefined) && partitionNodes === undefined) {
      throw new Error('remedies.maintenanceWindows names partitions, which only the Slurm backend knows; name the nodes instead');
    }
    this.locks = new Locks(redis, keys);
    this.budgetKey = budgetProfile === undefined ? keys.drainBudget : `${keys.drainBudget}:profile:${budgetProfile}`;
  }

  /** Where the budget's drains are counted: a profile's own key apart from the global one. */
  private readonly budgetKey: string;

  /** The node leases and the budget's slots (core/locks.ts). */
  private readonly locks: Locks;

  /**
   * The same gates (pause, holds, windows, leases) with an eviction budget of their own, counted
   * under its own key: a profile's (config `profiles[].safety`), so that one group of nodes
   * spending its drains leaves every other group's budget whole. Fields it leaves out are the
   * global budget's.
   */
  withBudget(profile: string, budget: Partial<BudgetOptions>): SafetyGates {
    return new SafetyGates(
      this.redis,
      this.keys,
      { maxPerWindow: budget.maxPerWindow ?? this.budget.maxPerWindow, windowSeconds: budget.windowSeconds ?? this.budget.windowSeconds },
      this.leaseSeconds,
      this.windows,
      this.partitionNodes,
      this.logger,
      profile,
      this.partitionCache,
    );
  }

  /**
   * Reads the nodes of every partition a window names, at most once a minute (a node added to a
   * partition is covered from then on). A partition the scheduler does not list, or a read that
   * fails, keeps what was read before and is logged: a window is never silently dropped.
   */
  async refreshPartitions(): Promise<void> {
    const now = Date.now();
    const cache = this.partitionCache;
    if (this.partitionNodes === undefined || now - cache.readAt < PARTITION_REFRESH_MS) return;
    cache.readAt = now;
    const names = new Set(this.windows.flatMap((window) => window.partitions ?? []));
    for (const name of names) {
      try {
        const nodes = await this.partitionNodes(name);
        if (nodes.length === 0)
          this.logger?.warn({ partition: name }, 'a maintenance window names a partition with no nodes (or one the scheduler does not know)');
        if (nodes.length > 0 || !cache.nodes.has(name)) cache.nodes.set(name, nodes);
      } catch (error) {
        this.logger?.warn({ partition: name, err: error }, "could not read the nodes of a maintenance window's partition; keeping the last list");
      }
    }
  }

  /**
   * The nodes in a maintenance window open at `now`, each with the window's name and end. Nodes
   * named by partition are those of the last refreshPartitions().
   */
  inMaintenance(now = Date.now()): Map<string, { readonly window: string; readonly end: string }> {
    const nodes = new Map<string, { window: string; end: string }>();
    for (const window of this.windows) {
      if (Date.parse(window.start) > now || Date.parse(window.end) <= now) continue;
      const covered = [...(window.nodes ?? []), ...(window.partitions ?? []).flatMap((partition) => this.partitionCache.nodes.get(partition) ?? [])];
      for (const node of covered) if (!nodes.has(node)) nodes.set(node, { window: window.name, end: window.end });
    }
    return nodes;
  }

  async paused(): Promise<string | undefined> {
    const reason = await this.redis.get(this.keys.paused);
    return reason ?? undefined;
  }

  async pause(reason: string): Promise<void> {
    await this.redis.set(this.keys.paused, reason || 'paused by operator');
  }

  async unpause(): Promise<void> {
    await this.redis.del(this.keys.paused);
  }

  /** Holds `node` until `until` (ms since the epoch); a second hold replaces the first. */
  async hold(node: string, reason: string, until: number, now = Date.now()): Promise<NodeHold> {
    const hold: NodeHold = { reason, since: new Date(now).toISOString(), until: new Date(until).toISOString() };
    await this.redis.hset(this.keys.holds, node, JSON.stringify(hold));
    return hold;
  }

  /** Releases the node's hold; false when it had none (or it had expired). */
  async release(node: string, now = Date.now()): Promise<boolean> {
    const current = (await this.holds(now)).get(node);
    await this.redis.hdel(this.keys.holds, node);
    return current !== undefined;
  }

  /** The holds in force; expired ones are dropped as they are found. */
  async holds(now = Date.now()): Promise<Map<string, NodeHold>> {
    const raw = await this.redis.hgetall(this.keys.holds);
    const holds = new Map<string, NodeHold>();
    const expired: string[] = [];
    for (const [node, text] of Object.entries(raw)) {
      const hold = readHold(text);
      // A hold that does not read back keeps the node held: acting on a node under maintenance is the worse mistake.
      if (hold === undefined) holds.set(node, { reason: 'held (unreadable hold record)', since: '', until: '' });
      else if (Date.parse(hold.until) <= now) expired.push(node);
      else holds.set(node, hold);
    }
    if (expired.length > 0) await this.redis.hdel(this.keys.holds, ...expired);
    return holds;
  }

  /** The hold gate: refuses when any of `nodes` is held. */
  async checkHolds(nodes: readonly string[], now = Date.now()): Promise<GateVerdict> {
    if (nodes.length === 0) return { ok: true };
    await this.refreshPartitions();
    const maintenance = this.inMaintenance(now);
    const scheduled = nodes.filter((node) => maintenance.has(node));
    if (scheduled.length > 0) {
      const described = scheduled
        .map((node) => `${node} (window ${maintenance.get(node)?.window ?? '?'}, until ${maintenance.get(node)?.end ?? '?'})`)
        .join(', ');
      return { ok: false, gate: 'hold', reason: `in a scheduled maintenance window: ${described}` };
    }
    const holds = await this.holds(now);
    const held = nodes.filter((node) => holds.has(node));
    if (held.length === 0) return { ok: true };
    const described = held.map((node) => `${node} (${holds.get(node)?.reason ?? ''}, until ${holds.get(node)?.until ?? '?'})`).join(', ');
    return { ok: false, gate: 'hold', reason: `held for maintenance by an operator: ${described}` };
  }

  /** Drains counted in the current window. */
  async budgetUsed(now = Date.now()): Promise<number> {
    return this.redis.zcount(this.budgetKey, now - this.budget.windowSeconds * 1000, '+inf');
  }

  /** Pause, then the holds on `nodes`, then budget: the checks that decide whether an action may happen at all. */
  async admit(decisionId: string, nodes: readonly string[] = [], now = Date.now()): Promise<GateVerdict> {
    // Both reads go out together (one wait for Redis, not two); the pause is still judged first,
    // and while paused the holds' answer, or failure, is not looked at.
    const holdsRead = this.checkHolds(nodes, now);
    holdsRead.catch(() => undefined);
    const pausedReason = await this.paused();
    if (pausedReason !== undefined) return { ok: false, gate: 'pause', reason: `actions are paused: ${pausedReason}` };
    const holds = await holdsRead;
    if (!holds.ok) return holds;
    if (!(await this.locks.takeBudgetSlot(decisionId, now, this.budget.windowSeconds * 1000, this.budget.maxPerWindow, this.budgetKey))) {
      return {
        ok: false,
        gate: 'budget',
        reason: `eviction budget exhausted: ${this.budget.maxPerWindow} drains per ${this.budget.windowSeconds} s already used`,
      };
    }
    return { ok: true };
  }

  /**
   * A job may lose at most `percent` of its nodes to evictions within the window (like a
   * min-healthy bound). Counts `nodes` against the job once per `decisionId`.
   */
  async admitJobShare(job: string, decisionId: string, nodes: readonly string[], jobSize: number, percent: number, now = Date.now()): Promise<GateVerdict> {
    // A held node is refused before it is counted against the job's share.
    const holds = await this.checkHolds(nodes, now);
    if (!holds.ok) return holds;
    const key = this.keys.jobEvictions(job);
    const windowMs = this.budget.windowSeconds * 1000;
    await this.redis.zremrangebyscore(key, '-inf', String(now - windowMs));
    const already = await this.redis.zrange(key, '0', '-1');
    const fresh = nodes.filter((node) => !already.includes(`${decisionId}:${node}`));
    const limit = Math.floor((jobSize * percent) / 100);
    if (already.length + fresh.length > limit) {
      return {
        ok: false,
        gate: 'budget',
        reason: `job eviction budget exhausted: ${already.length} of ${jobSize} nodes already evicted in ${this.budget.windowSeconds} s, at most ${percent} % (${limit}) may go`,
      };
    }
    if (fresh.length > 0) {
      const multi = this.redis.multi();
      for (const node of fresh) multi.zadd(key, String(now), `${decisionId}:${node}`);
      multi.pexpire(key, windowMs);
      await multi.exec();
    }
    return { ok: true };
  }

  /** Gives back what admitJobShare counted for `decisionId` when the eviction did not happen after all. */
  async releaseJobShare(job: string, decisionId: string, nodes: readonly string[]): Promise<void> {
    if (nodes.length === 0) return;
    await this.redis.zrem(this.keys.jobEvictions(job), ...nodes.map((node) => `${decisionId}:${node}`));
  }

  /**
   * Whether a refusal by `gate` should page a person now: the first refusal of each kind in a
   * budget window does, later ones do not. A storm of refusals (a leaf switch taking 32 nodes
   * down at once) is one incident and wakes someone once; each refusal is still audited.
   */
  async claimPage(gate: Gate, now = Date.now()): Promise<boolean> {
    // Under the installation's prefix, next to the budget it guards (core/redis.ts Keys).
    // A profile's budget pages on its own: one group's exhausted budget does not silence another's.
    const key = `${this.keys.prefix}:paged:${gate}${gate === 'budget' && this.budgetProfile !== undefined ? `:profile:${this.budgetProfile}` : ''}`;
    return (await this.redis.set(key, String(now), 'PX', this.budget.windowSeconds * 1000, 'NX')) === 'OK';
  }

  /**
   * Takes the node's lease for `holder`; only one actuator works on a node at a time, and none on
   * a held one (every drain, eviction and standby activation passes here).
   */
  async acquireLease(node: string, holder: string): Promise<GateVerdict> {
    const holds = await this.checkHolds([node]);
    if (!holds.ok) return holds;
    const current = await this.locks.takeLease(node, holder, this.leaseSeconds * 1000);
    if (current === undefined) return { ok: true };
    return { ok: false, gate: 'lease', reason: `node ${node} is leased by ${current}` };
  }

  async releaseLease(node: string, holder: string): Promise<void> {
    await this.locks.releaseLease(node, holder);
  }

  /** Keeps `holder`'s lease on the node for `ms` from now, for work that outlasts a lease (a validation under load). */
  async renewLease(node: string, holder: string, ms: number): Promise<void> {
    await this.locks.renewLease(node, holder, ms);
  }
}

function readHold(text: string): NodeHold | undefined {
  try {
    const parsed = nodeHoldSchema.safeParse(JSON.parse(text));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}
