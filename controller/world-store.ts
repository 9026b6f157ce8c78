import { createHash } from 'node:crypto';
import { z } from 'zod';
import { InputError } from '../core/errors.js';
import { HOT_SWAP_TIMEOUT_DEFAULT_SECONDS, parseJobSpec, replaceNodeInSpec, type JobSpec } from '../core/job.js';
import { nodeNameSchema } from '../core/names.js';
import type { LadderEventJob } from '../core/queues.js';
import type { Keys, Redis } from '../core/redis.js';
import type { Topology } from '../core/topology.js';
import { parseOrThrow } from '../core/validate.js';
import { planBackups } from '../actuators/backup-placement.js';

/**
 * A hot-swap job's world (DeadPool §V-C, §VI): which node holds each shard, the idle spares, where
 * each shard's in-memory replica lives (ByteRobust §6.3, backup-placement.ts), and the recovery
 * epoch the ranks meet in. Every rank reads it; each reports joining, stepping or failing in an
 * epoch. The controller opens an epoch for a swap (the hot_swap step) and for every relaunch,
 * and judges the swap from the reports: done when every shard stepped in it, failed at the
 * first `failed` report or when its bound passes.
 *
 * In Redis, per job: a hash (epoch, state, the open swap, recent step times) and the current
 * epoch's reports, one per shard and one per spare node, so a node reporting again and again
 * replaces its report and cannot grow what is kept; an epoch's opening drops the last one's.
 */

export const WORLD_EVENTS = ['joined', 'stepped', 'failed', 'spare'] as const;
/** Step times kept for the swap's bound: the newest reported. */
const STEP_TIMES_KEPT = 32;
/** The shortest bound of a swap, whatever the step time (seconds). */
const MIN_BOUND_SECONDS = 10;
/** A swap may take this many median steps before it falls back (a restore, a rendezvous and a step). */
const BOUND_STEPS = 40;

const reportFields = z
  .object({
    epoch: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER),
    shard: z.number().int().min(0).max(16_777_216).optional(),
    node: nodeNameSchema,
    event: z.enum(WORLD_EVENTS),
    step: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
    stepSeconds: z.number().finite().min(0).max(86_400).optional(),
    detail: z.string().max(512).optional(),
    /** A `failed` report's shards that never arrived at the epoch's rendezvous. */
    missing: z.array(z.number().int().min(0).max(16_777_216)).max(1024).optional(),
  })
  .strict();

export const worldReportSchema = reportFields.superRefine((report, ctx) => {
  if (report.event === 'spare' && report.shard !== undefined)
    ctx.addIssue({ code: 'custom', path: ['shard'], message: 'a spare holds no shard: leave shard out' });
  if (report.event !== 'spare' && report.shard === undefined)
    ctx.addIssue({ code: 'custom', path: ['shard'], message: `a ${report.event} report names its shard` });
  if (report.event !== 'failed' && report.missing !== undefined)
    ctx.addIssue({ code: 'custom', path: ['missing'], message: 'only a failed report names missing shards' });
});
export type WorldReport = z.infer<typeof worldReportSchema>;

/** A report for an epoch that is over (409): kept out of the swap. */
export class StaleEpochError extends InputError {
  constructor(message: string) {
    super(message, 'epoch');
    this.name = 'StaleEpochError';
  }
}

/** The open swap as kept: which failed node each spare replaces, and its bound. */
const swapSchema = z.object({
  replaced: z.record(z.string(), z.string()),
  openedAt: z.number(),
  deadline: z.number(),
  /** The hot_swap step that opened it: the same step again opens nothing more. */
  ref: z.string(),
});
type Swap = z.infer<typeof swapSchema>;

export interface WorldView {
  readonly job: string;
  readonly epoch: number;
  readonly state: 'steady' | 'swapping';
  readonly shards: { shard: number; node: string }[];
  readonly spares: string[];
  readonly replicas: { shard: number; holders: number[] }[];
  readonly swap: null | { epoch: number; replaced: Record<string, string>; openedAt: string; deadline: string };
}

/**
 * How a swap ended, for the ladder: its epoch, `key` (the epoch and when it opened: unique to the
 * swap even across a job registered again) and the figures or why it failed.
 */
export interface SwapEnd {
  readonly epoch: number;
  readonly key: string;
  readonly said: string;
  /** Spares of the swap that failed it (never arrived, or never reported): the fallback evicts them. */
  readonly evict?: readonly string[];
}

/** What a report changed: the swap it finished (the ladder's hot_swap_done) or failed. */
export type ReportOutcome = { readonly done?: SwapEnd; readonly failed?: SwapEnd };

/** The job facts the world is read against. */
export interface WorldJob {
  readonly spec: JobSpec;
}

/** KEYS: world, reports. ARGV: epoch, field, report. {'ok', state} | {'stale'|'ahead', epoch}. */
const REPORT = `
local epoch = tonumber(redis.call('hget', KEYS[1], 'epoch') or '0')
local asked = tonumber(ARGV[1])
if asked < epoch then return {'stale', tostring(epoch)} end
if asked > epoch then return {'ahead', tostring(epoch)} end
redis.call('hset', KEYS[2], ARGV[2], ARGV[3])
return {'ok', redis.call('hget', KEYS[1], 'state') or 'steady'}`;

/** KEYS: world, reports. ARGV: the step's ref, the swap. {'opened'|'already', epoch}. */
const OPEN = `
local epoch = tonumber(redis.call('hget', KEYS[1], 'epoch') or '0')
if redis.call('hget', KEYS[1], 'openedBy') == ARGV[1] then return {'already', tostring(epoch)} end
epoch = epoch + 1
redis.call('hset', KEYS[1], 'epoch', epoch, 'state', 'swapping', 'swap', ARGV[2], 'openedBy', ARGV[1], 'failed', '')
redis.call('del', KEYS[2])
return {'opened', tostring(epoch)}`;

/** KEYS: world, reports. A new steady epoch (a relaunch); returns it. */
const RELAUNCH = `
local epoch = tonumber(redis.call('hget', KEYS[1], 'epoch') or '0') + 1
redis.call('hset', KEYS[1], 'epoch', epoch, 'state', 'steady', 'swap', '', 'failed', '')
redis.call('del', KEYS[2])
return epoch`;

/** KEYS: world. ARGV: epoch, 'done' or the failure. 1 for the one caller that ends the swap of that epoch. */
const END_SWAP = `
if tonumber(redis.call('hget', KEYS[1], 'epoch') or '-1') ~= tonumber(ARGV[1]) then return 0 end
if redis.call('hget', KEYS[1], 'state') ~= 'swapping' or (redis.call('hget', KEYS[1], 'failed') or '') ~= '' then return 0 end
if ARGV[2] == 'done' then redis.call('hset', KEYS[1], 'state', 'steady', 'swap', '') else redis.call('hset', KEYS[1], 'failed', ARGV[2]) end
return 1`;

/** How many worlds' layouts a controller keeps computed (one per job and epoch it was asked about lately). */
const LAYOUTS_KEPT = 64;

export class WorldStore {
  /**
   * Layouts and replica plans by what they are computed from (the job's spec, its epoch and open
   * swap): every rank polls the world about once a second, and neither changes between swaps, so
   * the rank table and the backup plan (quadratic in the ranks) are not rebuilt per request.
   */
  private readonly layouts = new Map<string, { world: WorldView; topology: Topology; replicas?: WorldView['replicas'] }>();

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {}

  /** The world of a job just registered: epoch 0, steady. */
  async create(job: string): Promise<void> {
    await this.redis.hset(this.keys.jobWorld(job), { epoch: '0', state: 'steady', swap: '', failed: '', stepSeconds: '[]' });
  }

  /** The world as the ranks read it (GET /api/v1/jobs/:id/world), with where each shard's replica lives. */
  async view(record: WorldJob): Promise<WorldView> {
    const layout = await this.layout(record);
    layout.replicas ??=
      layout.topology.ranks.length > 1
        ? planBackups(layout.topology, { replicas: 1 }).placements.map((placement) => ({ shard: placement.rank, holders: placement.holders }))
        : [];
    return { ...layout.world, replicas: layout.replicas };
  }

  /** The world without its replicas (which a report does not need), and its topology. */
  private async layout(record: WorldJob): Promise<{ world: WorldView; topology: Topology; replicas?: WorldView['replicas'] }> {
    const raw = await this.redis.hgetall(this.keys.jobWorld(record.spec.name));
    // Hashed: a spec of many thousand nodes is large, and 64 of them would be kept.
    const key = createHash('sha256')
      .update(JSON.stringify([raw.epoch, raw.state, raw.swap, record.spec]))
      .digest('base64');
    const kept = this.layouts.get(key);
    if (kept !== undefined) return kept;
    const computed = this.computeLayout(record, raw);
    if (this.layouts.size >= LAYOUTS_KEPT) this.layouts.delete(this.layouts.keys().next().value as string);
    this.layouts.set(key, computed);
    return computed;
  }

  private computeLayout(record: WorldJob, raw: Record<string, string>): { world: WorldView; topology: Topology } {
    const epoch = Number(raw.epoch ?? 0);
    const swap = raw.state === 'swapping' ? readSwap(raw.swap) : undefined;
    const replaced = swap?.replaced ?? {};
    // Between the epoch's opening and the job record's change the spares already hold the shards.
    const { hotSwap: _spares, ...plain } = record.spec;
    let spec: JobSpec = plain;
    for (const [failed, spare] of Object.entries(replaced)) spec = replaceNodeInSpec(spec, failed, spare);
    const { topology } = parseJobSpec(spec);
    const taken = new Set(Object.values(replaced));
    const world: WorldView = {
      job: record.spec.name,
      epoch,
      state: swap ? 'swapping' : 'steady',
      shards: topology.ranks.map((rank) => ({ shard: rank.rank, node: rank.node })),
      spares: (record.spec.hotSwap?.spares ?? []).filter((node) => !taken.has(node)),
      replicas: [],
      swap: swap ? { epoch, replaced, openedAt: new Date(swap.openedAt).toISOString(), deadline: new Date(swap.deadline).toISOString() } : null,
    };
    return { world, topology };
  }

  /**
   * A rank's report in an epoch. Throws InputError naming the field (a shard the node does not
   * hold in the epoch, a spare report from a node that is not a spare), StaleEpochError for an
   * epoch that is over. Returns what the report finished, if anything.
   */
  async report(record: WorldJob, body: unknown, now = Date.now()): Promise<ReportOutcome> {
    const report = parseOrThrow(worldReportSchema, body, 'world report');
    const { world } = await this.layout(record);
    if (report.epoch < world.epoch) throw new StaleEpochError(`world report: epoch ${report.epoch} is over; job ${world.job} is in epoch ${world.epoch}`);
    if (report.epoch > world.epoch)
      throw new InputError(`invalid world report: epoch: ${report.epoch} is not open; job ${world.job} is in epoch ${world.epoch}`, 'epoch');
    let field: string;
    if (report.event === 'spare') {
      if (!world.spares.includes(report.node))
        throw new InputError(`invalid world report: node: ${report.node} is not a spare of job ${world.job} in epoch ${world.epoch}`, 'node');
      field = `spare:${report.node}`;
    } else {
      const shard = world.shards[report.shard ?? -1];
      if (shard === undefined)
        throw new InputError(
          `invalid world report: shard: ${report.shard ?? ''} is not a shard of job ${world.job}, which has shards 0-${world.shards.length - 1}`,
          'shard',
        );
      if (shard.node !== report.node)
        throw new InputError(`invalid world report: shard: shard ${shard.shard} is on ${shard.node} in epoch ${world.epoch}, not on ${report.node}`, 'shard');
      field = `shard:${shard.shard}`;
    }
    const stored = JSON.stringify({ ...report, at: now });
    const answer = (await this.redis.eval(
      REPORT,
      2,
      this.keys.jobWorld(world.job),
      this.keys.jobWorldReports(world.job),
      String(report.epoch),
      field,
      stored,
    )) as string[];
    if (answer[0] !== 'ok') throw new StaleEpochError(`world report: epoch ${report.epoch} is over; job ${world.job} is in epoch ${answer[1] ?? '?'}`);
    if (report.stepSeconds !== undefined) await this.noteStepTime(world.job, report.stepSeconds);
    if (answer[1] !== 'swapping') return {};
    if (report.event === 'failed') {
      const detail = `shard ${report.shard ?? ''} on ${report.node} could not join epoch ${report.epoch}: ${report.detail ?? 'no reason given'}`;
      // Only the swap's own spares are evicted on a peer's word: a rank cannot have a survivor drained by naming it.
      const spares = new Set(Object.values(world.swap?.replaced ?? {}));
      const evict = [...new Set((report.missing ?? []).map((missing) => world.shards[missing]?.node ?? '').filter((node) => spares.has(node)))];
      return (await this.endSwap(world.job, report.epoch, detail)) ? { failed: { epoch: report.epoch, key: swapKey(world), said: detail, evict } } : {};
    }
    if (report.event !== 'stepped') return {};
    const reports = await this.reports(world.job);
    const stepped = world.shards.map((shard) => reports.get(`shard:${shard.shard}`)).filter((entry) => entry?.event === 'stepped');
    if (stepped.length < world.shards.length || !(await this.endSwap(world.job, report.epoch, 'done'))) return {};
    return { done: { epoch: report.epoch, key: swapKey(world), said: describeDone(world, stepped, now) } };
  }

  /**
   * Opens a swap's epoch for the hot_swap step `ref` (once: the same step again finds it open):
   * `replaced` maps each failed node to its spare; the bound is min(timeoutSeconds, max(10, 40 ×
   * the median step time the ranks reported)).
   */
  async open(job: JobSpec, ref: string, replaced: Record<string, string>, now = Date.now()): Promise<{ epoch: number; opened: boolean; boundSeconds: number }> {
    const boundSeconds = swapBound(job.hotSwap?.timeoutSeconds ?? HOT_SWAP_TIMEOUT_DEFAULT_SECONDS, await this.stepTimes(job.name));
    const swap: Swap = { replaced, openedAt: now, deadline: now + boundSeconds * 1000, ref };
    const answer = (await this.redis.eval(OPEN, 2, this.keys.jobWorld(job.name), this.keys.jobWorldReports(job.name), ref, JSON.stringify(swap))) as string[];
    return { epoch: Number(answer[1]), opened: answer[0] === 'opened', boundSeconds };
  }

  /** The job is (re)launched: its ranks start in a new steady epoch, so no stale rendezvous key is reused. */
  async relaunched(job: string): Promise<number> {
    return Number(await this.redis.eval(RELAUNCH, 2, this.keys.jobWorld(job), this.keys.jobWorldReports(job)));
  }

  /** Why the open swap failed its bound at `now` (once per epoch), or undefined. */
  async overdue(record: WorldJob, now = Date.now()): Promise<SwapEnd | undefined> {
    const raw = await this.redis.hgetall(this.keys.jobWorld(record.spec.name));
    const swap = raw.state === 'swapping' && (raw.failed ?? '') === '' ? readSwap(raw.swap) : undefined;
    if (swap === undefined || now < swap.deadline) return undefined;
    const { world } = await this.layout(record);
    const reports = await this.reports(world.job);
    const waiting = world.shards.filter((shard) => reports.get(`shard:${shard.shard}`)?.event !== 'stepped').map((shard) => shard.shard);
    const shown = waiting.length > 8 ? `${waiting.slice(0, 8).join(', ')} and ${waiting.length - 8} more` : waiting.join(', ');
    const detail = `not done within its bound of ${Math.round((swap.deadline - swap.openedAt) / 1000)} s: shard${waiting.length === 1 ? '' : 's'} ${shown} had not stepped in epoch ${world.epoch}`;
    // A spare whose shard said nothing at all in the epoch never came: it is evicted with the fallback.
    const evict = Object.values(swap.replaced).filter((spare) =>
      world.shards.filter((shard) => shard.node === spare).every((shard) => !reports.has(`shard:${shard.shard}`)),
    );
    return (await this.endSwap(world.job, world.epoch, detail)) ? { epoch: world.epoch, key: swapKey(world), said: detail, evict } : undefined;
  }

  /** The world's epoch and state, for listings (`steadfast jobs`). */
  async summary(job: string): Promise<{ epoch: number; state: 'steady' | 'swapping' }> {
    const [epoch, state] = await this.redis.hmget(this.keys.jobWorld(job), 'epoch', 'state');
    return { epoch: Number(epoch ?? 0), state: state === 'swapping' ? 'swapping' : 'steady' };
  }

  private async endSwap(job: string, epoch: number, outcome: string): Promise<boolean> {
    return Number(await this.redis.eval(END_SWAP, 1, this.keys.jobWorld(job), String(epoch), outcome.slice(0, 1024))) === 1;
  }

  private async reports(job: string): Promise<Map<string, WorldReport & { at: number }>> {
    const fields = await this.redis.hgetall(this.keys.jobWorldReports(job));
    const out = new Map<string, WorldReport & { at: number }>();
    for (const [field, text] of Object.entries(fields)) {
      const parsed = storedReportSchema.safeParse(safeJson(text));
      if (parsed.success) out.set(field, parsed.data);
    }
    return out;
  }

  private async noteStepTime(job: string, seconds: number): Promise<void> {
    const times = [...(await this.stepTimes(job)), seconds].slice(-STEP_TIMES_KEPT);
    await this.redis.hset(this.keys.jobWorld(job), 'stepSeconds', JSON.stringify(times));
  }

  private async stepTimes(job: string): Promise<number[]> {
    const parsed = z.array(z.number()).safeParse(safeJson((await this.redis.hget(this.keys.jobWorld(job), 'stepSeconds')) ?? '[]'));
    return parsed.success ? parsed.data : [];
  }
}

const storedReportSchema = reportFields.extend({ at: z.number() });

/** A swap's bound in seconds: min(timeout, max(10, 40 × median step time)); the timeout without step times. */
export function swapBound(timeoutSeconds: number, stepTimes: readonly number[]): number {
  if (stepTimes.length === 0) return timeoutSeconds;
  const sorted = [...stepTimes].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  const median = sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
  return Math.min(timeoutSeconds, Math.max(MIN_BOUND_SECONDS, Math.ceil(BOUND_STEPS * median)));
}

/** "epoch 3, node-3 in place of node-1, first step 41 in 1.2 s" (or "same shards" for a communication fault's epoch). */
function describeDone(world: WorldView, stepped: readonly ((WorldReport & { at: number }) | undefined)[], now: number): string {
  const pairs = Object.entries(world.swap?.replaced ?? {}).map(([failed, spare]) => `${spare} in place of ${failed}`);
  const first = Math.min(...stepped.map((entry) => entry?.step ?? Number.POSITIVE_INFINITY));
  const openedAt = world.swap ? Date.parse(world.swap.openedAt) : now;
  const seconds = (Math.max(...stepped.map((entry) => entry?.at ?? now)) - openedAt) / 1000;
  return `epoch ${world.epoch}, ${pairs.length > 0 ? pairs.join(', ') : 'same shards'}, first step ${Number.isFinite(first) ? first : '?'} in ${seconds.toFixed(1)} s`;
}

function swapKey(world: WorldView): string {
  return `${world.epoch}@${world.swap ? Date.parse(world.swap.openedAt) : 0}`;
}

function readSwap(raw: string | undefined): Swap | undefined {
  if (raw === undefined || raw === '') return undefined;
  const parsed = swapSchema.safeParse(safeJson(raw));
  return parsed.success ? parsed.data : undefined;
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The ladder's event for a swap that ended: every shard stepped (`done`) or it failed. */
export function swapEndEvent(job: string, outcome: 'done' | 'failed', end: SwapEnd, now = Date.now()): LadderEventJob {
  return outcome === 'done'
    ? { job, event: { type: 'hot_swap_done', time: now, epoch: end.epoch, summary: end.said }, eventId: `hot-swap-done:${end.key}` }
    : {
        job,
        event: { type: 'hot_swap_failed', time: now, detail: end.said, ...(end.evict !== undefined && end.evict.length > 0 ? { evict: [...end.evict] } : {}) },
        eventId: `hot-swap-failed:${end.key}`,
      };
}
