import { z } from 'zod';
import type { Keys, Redis } from '../core/redis.js';
import type { AuditLog } from '../core/audit.js';
import type { ClusterBackend } from './backend.js';
import { ForeignHolds } from './foreign-holds.js';
import { standbyPoolSize } from './standby-sizing.js';

/**
 * The warm standby pool (ByteRobust §6.2): sized at the P99 of a binomial over the machines the
 * registered jobs use, each standby provisioned from the spare candidates, held off ordinary
 * work by the backend (a Slurm reservation, a Kubernetes taint), self-checked by its own agent,
 * then ready; on an eviction a ready standby becomes active for the job, and the pool is
 * replenished at the next reconcile.
 */

export const STANDBY_STATES = ['provisioning', 'self_check', 'ready', 'active', 'failed'] as const;
export type StandbyState = (typeof STANDBY_STATES)[number];

const memberSchema = z.object({
  state: z.enum(STANDBY_STATES),
  since: z.number(),
  job: z.string().optional(),
  detail: z.string().optional(),
});
export type StandbyMember = z.infer<typeof memberSchema> & { node: string };

export interface StandbyPoolOptions {
  readonly candidates: readonly string[];
  readonly dailyFailureRate: number;
  readonly quantile: number;
}

export class StandbyPool {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly backend: ClusterBackend,
    private readonly options: StandbyPoolOptions,
  ) {}

  private get foreignHolds(): ForeignHolds {
    return new ForeignHolds(this.redis, this.keys);
  }

  /**
   * Reads the nodes steadfast knows — `inUse` (the jobs' nodes) and the standby candidates — for
   * drains and cordons someone else made and node-problem-detector conditions (foreign-holds.ts),
   * now and then; such a node is not chosen as a standby.
   */
  async scanForeign(audit: AuditLog, inUse: ReadonlySet<string>, now = Date.now()): Promise<string[]> {
    // Without a pool of candidates the standbys are the backend's own (its reservation or taint).
    const known = async () => [...inUse, ...this.options.candidates, ...(this.enabled ? [] : await this.backend.standbys())];
    return this.foreignHolds.scan(this.backend, audit, known, now);
  }

  get enabled(): boolean {
    return this.options.candidates.length > 0;
  }

  /** P99 (or the configured quantile) of Binomial(nodes in use, daily failure rate). */
  target(nodesInUse: number): number {
    return standbyPoolSize(Math.max(1, nodesInUse), this.options.dailyFailureRate, this.options.quantile).standby;
  }

  async members(): Promise<StandbyMember[]> {
    const raw = await this.redis.hgetall(this.keys.standbyPool);
    return Object.entries(raw)
      .flatMap(([node, text]) => {
        const parsed = memberSchema.safeParse(JSON.parse(text));
        return parsed.success ? [{ node, ...parsed.data }] : [];
      })
      .sort((a, b) => a.since - b.since || a.node.localeCompare(b.node));
  }

  async member(node: string): Promise<StandbyMember | undefined> {
    const text = await this.redis.hget(this.keys.standbyPool, node);
    if (text === null) return undefined;
    const parsed = memberSchema.safeParse(JSON.parse(text));
    return parsed.success ? { node, ...parsed.data } : undefined;
  }

  private async set(node: string, state: StandbyState, extra: { job?: string; detail?: string } = {}, now = Date.now()): Promise<void> {
    await this.redis.hset(this.keys.standbyPool, node, JSON.stringify({ state, since: now, ...extra }));
  }

  /**
   * Brings the pool up to its target: each missing standby is taken from the candidates that
   * are free (not in the pool, not quarantined, in service), held by the backend and left
   * waiting for its agent's self-check. Returns the nodes it started provisioning.
   */
  /**
   * `leaving`: nodes in use that a maintenance window takes out now or within the hour; each is a
   * certain loss on top of the P99 of chance failures, so the pool holds one more for each.
   */
  async reconcile(nodesInUse: number, inUse: ReadonlySet<string>, now = Date.now(), leaving = 0): Promise<string[]> {
    if (!this.enabled) return [];
    const members = await this.members();
    const warm = members.filter((member) => ['provisioning', 'self_check', 'ready'].includes(member.state)).length;
    const missing = this.target(nodesInUse) + leaving - warm;
    if (missing <= 0) return [];
    const taken = new Set(members.map((member) => member.node));
    const quarantined = new Set(await this.redis.smembers(this.keys.quarantine));
    const othersHold = await this.foreignHolds.nodes();
    const started: string[] = [];
    for (const candidate of this.options.candidates) {
      if (started.length >= missing) break;
      if (taken.has(candidate) || quarantined.has(candidate) || inUse.has(candidate) || othersHold.has(candidate)) continue;
      const state = await this.backend.nodeState(candidate);
      if (!state.exists || state.drained || (state.conditions?.length ?? 0) > 0) continue;
      await this.set(candidate, 'provisioning', {}, now);
      await this.backend.holdStandby(candidate);
      await this.set(candidate, 'self_check', { detail: "held; waiting for its agent's self-check" }, now);
      started.push(candidate);
    }
    return started;
  }

  /** The standby's agent reports its self-check: healthy → ready, otherwise failed (and not used). */
  async selfCheck(node: string, ok: boolean, detail: string, now = Date.now()): Promise<StandbyMember | undefined> {
    const member = await this.member(node);
    if (!member || (member.state !== 'self_check' && member.state !== 'ready')) return member;
    await this.set(node, ok ? 'ready' : 'failed', { detail }, now);
    return this.member(node);
  }

  /**
   * Hands the oldest ready standby not in `unusable` (held, quarantined) and not held out by
   * someone else (foreign-holds.ts) to `job`; undefined when none is ready.
   */
  async take(job: string, now = Date.now(), unusable: ReadonlySet<string> = new Set()): Promise<string | undefined> {
    const othersHold = await this.foreignHolds.nodes();
    const ready = (await this.members()).find((member) => member.state === 'ready' && !unusable.has(member.node) && !othersHold.has(member.node));
    if (!ready) return undefined;
    await this.backend.activateStandby(ready.node, job);
    await this.set(ready.node, 'active', { job }, now);
    return ready.node;
  }
}
