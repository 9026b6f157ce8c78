import { InputError } from '../core/errors.js';
import type { Keys, Redis } from '../core/redis.js';
import { CHECKPOINT_TIERS, checkpointShardSchema, type CheckpointShard } from '../core/checkpoint.js';
import type { StepCopies } from '../actuators/restore-plan.js';
import { z } from 'zod';
import { parseOrThrow } from '../core/validate.js';

/**
 * The checkpoint copies a registered job's training side reports (which step, rank, tier and
 * holder), in one sorted set per job scored by step, bounded per report, per step and per job so
 * that reading them for a restore plan is bounded too. The job store (job-store.ts) checks the
 * job exists and passes its ranks and current nodes.
 */

/** How many checkpoint steps are kept per job at most; older ones cannot matter for a restore. */
export const CHECKPOINT_STEPS_KEPT = 64;
/**
 * Copies a job keeps over its steps: a job of more than 1,024 ranks keeps fewer steps than
 * CHECKPOINT_STEPS_KEPT (4,096 ranks: 16), and at least its newest one.
 */
export const CHECKPOINT_COPIES_PER_JOB = 262_144;
/**
 * Copies of one rank's shard a step keeps, in different places: its own node, peers (DeadPool §V
 * replicates each rank's state to k peers; k is 1 or 2 in practice) and remote storage.
 */
export const CHECKPOINT_COPIES_PER_RANK = 4;
/** Most copies one report carries (the Python client sends at most 200 at once): a report holds Redis for milliseconds. */
export const CHECKPOINT_SHARDS_PER_REPORT = 1000;
/** Copies decoded at once when a step is read (the planner gives the event loop a turn after each chunk). */
const CHECKPOINT_CHUNK = 4096;
const checkpointReportSchema = z.array(checkpointShardSchema).min(1).max(CHECKPOINT_SHARDS_PER_REPORT);
/**
 * Adds a report's checkpoint copies in one step, or nothing: refused (`full`, the step and what it
 * would hold) when a step would keep more than its bound. A copy replaces the one of the same
 * step, rank and holder in another tier; the same copy again changes nothing. Then only the
 * newest steps are kept: a walk down from the newest step, one lookup per kept step, and what
 * lies below the oldest goes. About six commands a new copy, one a copy already kept.
 * KEYS: the job's checkpoint copies (score: step). ARGV: the copies a step may hold, the steps
 * kept, then six strings per copy: its step, its member, the four members it replaces ('' none).
 */
const ADD_CHECKPOINTS = `
local cap, kept = tonumber(ARGV[1]), tonumber(ARGV[2])
local added, steps, replaces = {}, {}, {}
for i = 3, #ARGV, 6 do
  if redis.call('zscore', KEYS[1], ARGV[i + 1]) then
    replaces[i] = false
  else
    for j = i + 2, i + 5 do
      if replaces[i] == nil and ARGV[j] ~= '' and redis.call('zscore', KEYS[1], ARGV[j]) then replaces[i] = ARGV[j] end
    end
    if replaces[i] == nil then
      if added[ARGV[i]] == nil then
        added[ARGV[i]] = 0
        table.insert(steps, ARGV[i])
      end
      added[ARGV[i]] = added[ARGV[i]] + 1
    end
  end
end
for _, step in ipairs(steps) do
  local holds = redis.call('zcount', KEYS[1], step, step) + added[step]
  if holds > cap then return {'full', step, tostring(holds)} end
end
for i = 3, #ARGV, 6 do
  if replaces[i] ~= false then
    if replaces[i] then redis.call('zrem', KEYS[1], replaces[i]) end
    redis.call('zadd', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
local below, oldest = '+inf', nil
for _ = 1, kept do
  local newest = redis.call('zrevrangebyscore', KEYS[1], below, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if #newest == 0 then break end
  oldest = newest[2]
  below = '(' .. oldest
end
if oldest then redis.call('zremrangebyscore', KEYS[1], '-inf', '(' .. oldest) end
return {'ok'}`;

export class CheckpointStore {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {}

  /**
   * Keeps checkpoint copies the training side reports for job `name` of `ranks` ranks on `nodes`.
   * Each names one of its ranks and, unless it is remote, a holder among its nodes; a copy of the
   * same step, rank and holder replaces the one kept (its tier changed). A step keeps at most ranks × CHECKPOINT_COPIES_PER_RANK
   * copies and the job its newest checkpointStepsKept(ranks) steps (at most CHECKPOINT_COPIES_PER_JOB
   * copies, or one step's), so a restore plan reads a bounded amount. Throws InputError naming the
   * field; nothing of a refused report is kept.
   */
  async add(name: string, job: { readonly ranks: number; readonly nodes: ReadonlySet<string> }, body: unknown): Promise<number> {
    const { ranks, nodes } = job;
    const list = Array.isArray(body)
      ? parseOrThrow(checkpointReportSchema, body, 'checkpoint shards')
      : [parseOrThrow(checkpointShardSchema, body, 'checkpoint shards')];
    const latest = new Map<string, CheckpointShard>();
    for (const [index, shard] of list.entries()) {
      const at = Array.isArray(body) ? `${index}.` : '';
      if (shard.rank >= ranks)
        throw new InputError(`invalid checkpoint shards: ${at}rank: ${shard.rank} is not a rank of job ${name}, which has ranks 0-${ranks - 1}`, `${at}rank`);
      if (shard.holder !== undefined && !nodes.has(shard.holder))
        throw new InputError(`invalid checkpoint shards: ${at}holder: ${shard.holder} is not a node of job ${name}`, `${at}holder`);
      // The last report of a copy wins, as it would in two requests.
      latest.set(`${shard.step}/${shard.rank}/${shard.holder ?? ''}`, shard);
    }
    const perStep = ranks * CHECKPOINT_COPIES_PER_RANK;
    const args = [...latest.values()].flatMap((shard) => [String(shard.step), copyMember(shard), ...replacedMembers(shard)]);
    const answer = (await this.redis.eval(
      ADD_CHECKPOINTS,
      1,
      this.keys.jobCheckpoints(name),
      String(perStep),
      String(checkpointStepsKept(ranks)),
      ...args,
    )) as string[];
    if (answer[0] === 'full') {
      throw new InputError(
        `invalid checkpoint shards: step ${answer[1] ?? ''} would hold ${answer[2] ?? ''} copies; job ${name} keeps at most ${perStep} a step (${ranks} ranks × ${CHECKPOINT_COPIES_PER_RANK} copies)`,
        'step',
      );
    }
    return list.length;
  }

  /** Every kept checkpoint copy of the job, oldest step first. */
  async all(name: string): Promise<CheckpointShard[]> {
    const chunks: StepCopies[] = [];
    for await (const chunk of this.steps(name)) chunks.push(chunk);
    // Newest step first, its copies in order: put the steps back in order, keeping each step's chunks in theirs.
    return chunks.sort((a, b) => a.step - b.step).flatMap((chunk) => chunk.copies);
  }

  /**
   * The job's kept checkpoint steps, newest first, one read per step (at most CHECKPOINT_STEPS_KEPT),
   * each decoded and handed over in chunks of CHECKPOINT_CHUNK copies.
   */
  async *steps(name: string): AsyncGenerator<StepCopies> {
    const key = this.keys.jobCheckpoints(name);
    let below = '+inf';
    for (let read = 0; read < CHECKPOINT_STEPS_KEPT; read += 1) {
      const [, score] = await this.redis.zrevrangebyscore(key, below, '-inf', 'WITHSCORES', 'LIMIT', 0, 1);
      if (score === undefined) return;
      const members = await this.redis.zrangebyscore(key, score, score);
      for (let from = 0; from < members.length; from += CHECKPOINT_CHUNK) {
        yield { step: Number(score), copies: members.slice(from, from + CHECKPOINT_CHUNK).map((text) => checkpointShardSchema.parse(JSON.parse(text))) };
      }
      below = `(${score}`;
    }
  }
}

/** The newest steps a job of `ranks` ranks keeps: CHECKPOINT_STEPS_KEPT, fewer where its full steps would pass CHECKPOINT_COPIES_PER_JOB, at least one. */
export function checkpointStepsKept(ranks: number): number {
  return Math.max(1, Math.min(CHECKPOINT_STEPS_KEPT, Math.floor(CHECKPOINT_COPIES_PER_JOB / (ranks * CHECKPOINT_COPIES_PER_RANK))));
}

/** How a copy is kept: its fields in one order, so that the same copy reported twice is one member. */
function copyMember(shard: CheckpointShard): string {
  return JSON.stringify({ step: shard.step, rank: shard.rank, tier: shard.tier, ...(shard.holder !== undefined ? { holder: shard.holder } : {}) });
}

/** The members a copy replaces: the same step, rank and holder in each other tier ('' for a remote copy without holder, which has none). */
function replacedMembers(shard: CheckpointShard): string[] {
  const others = CHECKPOINT_TIERS.filter((tier) => tier !== shard.tier);
  return shard.holder === undefined ? others.map(() => '') : others.map((tier) => copyMember({ ...shard, tier }));
}
