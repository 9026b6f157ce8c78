import type { Keys, Redis } from '../../core/redis.js';
import type { Signal } from '../../core/signal.js';
import { MAX_RULE_COUNT, type XidKind } from '../../core/xid-policy.js';

/**
 * Counts the occurrences of one Xid or SXid code on one node within a policy's window ("drain on
 * the third Xid 13 within 10 minutes"), in a sorted set per node, kind and code scored by time:
 * trimmed to the window and to the largest count a rule may ask for, expiring with the window.
 *
 * Each occurrence is counted once. A signal is a member under its id, added only if absent, so a
 * redelivered signal (a BullMQ retry, an agent's resend of the same event) counts once. The agent's
 * fast-path reports are the occurrences; Alertmanager's alert for the same code is Prometheus'
 * view of them, counted only when no agent report of that node and code was counted within the
 * window (an agent too old to send the code). An alert that arrives before the agent's report of
 * the same occurrence is counted as well: Prometheus trails the fast path by a scrape and an
 * evaluation, so this is rare, and errs towards acting.
 */

export interface OccurrenceCount {
  /** Occurrences within the window, this one included when it was counted. */
  readonly seen: number;
  /**
   * `new`: this signal was counted now; `again`: it was counted before (a redelivery);
   * `agent-counted`: an alert not counted because the agent's reports are.
   */
  readonly counted: 'new' | 'again' | 'agent-counted';
}

export class XidOccurrences {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly now: () => number = Date.now,
  ) {}

  /** Counts `signal` as an occurrence of `kind` `code` on `node` and answers how many fall within the window. */
  async count(signal: Signal, node: string, kind: XidKind, code: number, windowSeconds: number): Promise<OccurrenceCount> {
    const now = this.now();
    const windowMs = windowSeconds * 1000;
    const key = this.keys.xidOccurrences(node, kind, code);
    const agentKey = this.keys.xidAgentCounted(node, kind, code);
    // The fault's own time, never ahead of now: a retry scores the same, an old fault falls out of the window.
    const score = Math.min(Date.parse(signal.time), now);
    const skip = signal.source === 'alertmanager' && (await this.redis.exists(agentKey)) === 1;
    // One transaction (no script: the policy takes its locks through core/locks.ts alone): trim to
    // the window, add this occurrence unless it is there, bound the set, let it expire with the window.
    const transaction = this.redis.multi().zremrangebyscore(key, '-inf', `(${now - windowMs}`);
    if (!skip) transaction.zadd(key, 'NX', score, `${signal.source}:${signal.id}`);
    if (!skip && signal.source === 'agent') transaction.set(agentKey, '1', 'PX', windowMs);
    transaction
      .zremrangebyscore(key, '-inf', `(${now - windowMs}`)
      .zremrangebyrank(key, 0, -(MAX_RULE_COUNT + 1))
      .pexpire(key, windowMs)
      .zcard(key);
    const results = (await transaction.exec()) ?? [];
    const failed = results.find(([error]) => error !== null);
    if (failed?.[0]) throw failed[0];
    const seen = Number(results.at(-1)?.[1] ?? 0);
    const added = skip ? undefined : Number(results[1]?.[1] ?? 0);
    return { seen, counted: added === undefined ? 'agent-counted' : added === 1 ? 'new' : 'again' };
  }
}
