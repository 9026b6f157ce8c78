import { luaScript, type Keys, type Redis } from '../core/redis.js';
import type { Retention } from '../core/retention.js';

/** The states a finished job is kept in, each with its own share of the budget. */
export type FinishedState = 'completed' | 'failed';

/**
 * What Redis holds for a kept job beside its hash: its entry in the queue's finished set and its
 * two in this ledger (measured on Redis 7.0: about 370 bytes for the three, rounded up).
 */
const LEDGER_ENTRY_BYTES = 512;
/** Most ledger entries one call goes through: each finished job adds one, so a few a call keep up. */
const ENTRIES_PER_CALL = 64;

// KEYS: the queue's set of jobs in the state (completed or failed), the ledger's order (job id by
// finish time), its bytes per job and its total.
// ARGV: the job id, the prefix of the queue's job keys, LEDGER_ENTRY_BYTES, the share, the most
// entries one call goes through.
//
// Enters a finished job (one not in the state's set is not finished: a failed attempt that will
// be retried) weighed by Redis itself, then goes through the oldest entries: one whose job is no
// longer in the set (removed by BullMQ's own count or age limit, or stored again since by a
// sender's retry, which is work still to do) is forgotten; while the total is over the share, the
// oldest kept job is removed as BullMQ removes a finished job without parent or dependencies (its
// hash, its log: BullMQ's removeJobKeys, and its entry in the set).
const KEEP_WITHIN = `
local finishedAt = redis.call('ZSCORE', KEYS[1], ARGV[1])
if finishedAt and redis.call('HEXISTS', KEYS[3], ARGV[1]) == 0 then
  local bytes = (redis.call('MEMORY', 'USAGE', ARGV[2] .. ARGV[1], 'SAMPLES', '0') or 0) + tonumber(ARGV[3])
  redis.call('ZADD', KEYS[2], finishedAt, ARGV[1])
  redis.call('HSET', KEYS[3], ARGV[1], bytes)
  redis.call('INCRBY', KEYS[4], bytes)
end
local total = tonumber(redis.call('GET', KEYS[4]) or '0')
local share = tonumber(ARGV[4])
local removed = 0
for _ = 1, tonumber(ARGV[5]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if not oldest then
    total = 0
    break
  end
  local kept = redis.call('ZSCORE', KEYS[1], oldest)
  if kept and total <= share then
    break
  end
  if kept then
    redis.call('ZREM', KEYS[1], oldest)
    local key = ARGV[2] .. oldest
    redis.call('DEL', key, key .. ':logs')
    removed = removed + 1
  end
  total = total - tonumber(redis.call('HGET', KEYS[3], oldest) or '0')
  redis.call('HDEL', KEYS[3], oldest)
  redis.call('ZREM', KEYS[2], oldest)
end
redis.call('SET', KEYS[4], total)
return {total, removed}
`;

/** Where a queue keeps its jobs: BullMQ's `toKey` of the signals queue (a job's hash by its id, the `completed` and `failed` sets by their names). */
export interface QueueKeys {
  readonly toKey: (name: string) => string;
}

/**
 * Keeps the finished signal jobs within their bytes of redis.retentionBudgetMB (core/retention.ts).
 * BullMQ keeps finished jobs by count and age only, and a signal job's size is its sender's
 * choice: 100 agent events whose messages are control characters take 1.2 MB as JSON where the
 * count assumed 300 KiB. So each job, once finished, is weighed by Redis (MEMORY USAGE of its
 * hash, every field) into a ledger per state, and the oldest are removed while a state's total
 * is over its share. A job bigger than its whole share is removed as soon as it is entered.
 *
 * Called for every job the policy worker finishes; one script run, atomic, so replicas sharing
 * the Redis may call it side by side.
 */
export class SignalRetention {
  private readonly keepWithin: (...args: (string | number)[]) => Promise<unknown>;

  constructor(
    redis: Redis,
    private readonly keys: Keys,
    private readonly queue: QueueKeys,
    private readonly shares: Retention['signalBytes'],
  ) {
    this.keepWithin = luaScript(redis, 'steadfastSignalsKeepWithin', 4, KEEP_WITHIN);
  }

  /** Enters a job that finished in `state` and trims that state's jobs to its share: the bytes kept after, and the jobs removed. */
  async finished(jobId: string, state: FinishedState): Promise<{ readonly total: number; readonly removed: number }> {
    const ledger = this.keys.signalsKept(state);
    const answer = await this.keepWithin(
      this.queue.toKey(state),
      ledger.order,
      ledger.bytes,
      ledger.total,
      jobId,
      this.queue.toKey(''),
      LEDGER_ENTRY_BYTES,
      this.shares[state],
      ENTRIES_PER_CALL,
    );
    const [total, removed] = Array.isArray(answer) ? answer.map(Number) : [];
    return { total: total ?? 0, removed: removed ?? 0 };
  }
}
