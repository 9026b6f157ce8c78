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

// KEYS[1] the occurrences, KEYS[2] the agent's marker.
// ARGV: now (ms), window (ms), score (ms), member, reporter ('agent' | 'alertmanager' | other), most kept.
const COUNT_OCCURRENCE = `
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - window))
local counted = 0
if ARGV[5] == 'alertmanager' and redis.call('EXISTS', KEYS[2]) == 1 then
  counted = -1
else
  counted = redis.call('ZADD', KEYS[1], 'NX', ARGV[3], ARGV[4])
  if ARGV[5] == 'agent' then redis.call('SET', KEYS[2], '1', 'PX', window) end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - window))
redis.call('ZREMRANGEBYRANK', KEYS[1], 0, -(tonumber(ARGV[6]) + 1))
redis.call('PEXPIRE', KEYS[1], window)
return { redis.call('ZCARD', KEYS[1]), counted }
`;

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
    // The fault's own time, never ahead of now: a retry scores the same, an old fault falls out of the window.
    const score = Math.min(Date.parse(signal.time), now);
    const answer = (await this.redis.eval(
      COUNT_OCCURRENCE,
      2,
      this.keys.xidOccurrences(node, kind, code),
      this.keys.xidAgentCounted(node, kind, code),
      String(now),
      String(windowSeconds * 1000),
      String(score),
      `${signal.source}:${signal.id}`,
      signal.source,
      String(MAX_RULE_COUNT),
    )) as [number, number];
    const [seen, added] = answer;
    return { seen: Number(seen), counted: added === -1 ? 'agent-counted' : added === 1 ? 'new' : 'again' };
  }
}
