import { InputError } from '../core/errors.js';
import { DEFAULT_JOB_POLICY, jobPolicySchema, parseJobSpec, replaceNodeInSpec, worldSize, type JobPolicy, type JobSpec, type JobState } from '../core/job.js';
import type { Keys, Redis } from '../core/redis.js';
import type { CheckpointShard } from '../core/checkpoint.js';
import { CheckpointStore } from './checkpoint-store.js';
import { WorldStore } from './world-store.js';
import type { StepCopies } from '../actuators/restore-plan.js';
import { z } from 'zod';
import { nodeNameSchema } from '../core/names.js';

/**
 * Registered training jobs in Redis: their spec, state, the time they spent productive (for
 * ETTR, ByteRobust §8.1.3) and their reported checkpoint shards. Every controller replica reads
 * the same records, so the controller itself stays stateless.
 */

export class JobExistsError extends InputError {
  constructor(name: string) {
    super(`job ${name} is already registered`, 'name');
    this.name = 'JobExistsError';
  }
}

/** A registration naming nodes that belong to another registered job, which is not finished. */
export class NodesBusyError extends InputError {
  constructor(
    name: string,
    readonly busy: ReadonlyMap<string, string>,
  ) {
    const owners = [...new Set(busy.values())];
    super(
      `job ${name} cannot be registered: ${[...busy].map(([node, job]) => `${node} belongs to job ${job}`).join(', ')}; a node joins another job only once ${owners.length === 1 ? 'that job finished or was' : 'those jobs finished or were'} unregistered`,
      'nodes',
    );
    this.name = 'NodesBusyError';
  }
}

export class JobNotFoundError extends InputError {
  constructor(name: string) {
    super(`no job named ${name}`, 'name');
    this.name = 'JobNotFoundError';
  }
}

export interface JobRecord {
  readonly spec: JobSpec;
  readonly state: JobState;
  readonly stateReason: string;
  readonly createdAt: string;
  readonly stateSince: string;
  readonly policy: JobPolicy;
  /**
   * Nodes of `spec.nodes` that left the job with no one in their place (evicted when no warm
   * standby was left): the spec keeps its shape, but they no longer belong to the job.
   */
  readonly vacant: readonly string[];
}

/** A hot-swap job's unused spares: nodes of its allocation outside its members, none for another job. */
export function jobSpares(record: Pick<JobRecord, 'spec'>): string[] {
  return [...(record.spec.hotSwap?.spares ?? [])];
}

/** The nodes whose agents may call the job's training routes: its members and its hot-swap spares. */
export function trainingNodes(record: Pick<JobRecord, 'spec' | 'vacant'>): string[] {
  return [...jobMembers(record), ...jobSpares(record)];
}

/** The nodes that belong to the job now: its spec's nodes less those it lost without a replacement. */
export function jobMembers(record: Pick<JobRecord, 'spec' | 'vacant'>): string[] {
  return record.spec.nodes.filter((node) => !record.vacant.includes(node));
}

export interface Ettr {
  /** Productive time over wall time since the job was registered. */
  readonly cumulative: number;
  /** The same over the last hour (or since registration, if younger). */
  readonly window1h: number;
}

const TRANSITIONS_KEPT = 10_000;
const HOUR_MS = 3600_000;

const transitionSchema = z.object({ at: z.number(), productive: z.boolean() });
const WORKLOAD_SEEN_FIELD = 'workloadSeenAt';
/**
 * Registers a job in one step, or nothing: refused when the name is taken, or when one of its
 * nodes points at another registered job that has not finished (a node of a running job is never
 * taken from it). KEYS: the job's hash, the job set, its transitions, then each node's node→job
 * key; ARGV: the job-hash key prefix, the spec, the time, the first transition, then the node names.
 */
const REGISTER_JOB = `
if redis.call('hexists', KEYS[1], 'spec') == 1 then return {'exists'} end
local busy = {'busy'}
for i = 4, #KEYS do
  local owner = redis.call('get', KEYS[i])
  if owner and redis.call('hexists', ARGV[1] .. owner, 'spec') == 1 and redis.call('hget', ARGV[1] .. owner, 'state') ~= 'finished' then
    table.insert(busy, ARGV[i + 1])
    table.insert(busy, owner)
  end
end
if #busy > 1 then return busy end
redis.call('hset', KEYS[1], 'spec', ARGV[2], 'state', 'running', 'stateReason', 'registered', 'createdAt', ARGV[3], 'stateSince', ARGV[3], 'productiveMs', '0')
redis.call('sadd', KEYS[2], cjson.decode(ARGV[2]).name)
redis.call('rpush', KEYS[3], ARGV[4])
for i = 4, #KEYS do redis.call('set', KEYS[i], cjson.decode(ARGV[2]).name) end
return {'ok'}`;

/**
 * A node leaves a registered job with no one in its place: it is noted in the job's `vacant`
 * list (once), and its node → job entry goes if it still names this job. KEYS: the job's hash,
 * the node's node → job key; ARGV: the job's name, the node.
 */
const VACATE_NODE = `
if redis.call('hexists', KEYS[1], 'spec') == 0 then return 0 end
local vacant = cjson.decode(redis.call('hget', KEYS[1], 'vacant') or '[]')
local listed = false
for _, node in ipairs(vacant) do
  if node == ARGV[2] then listed = true end
end
if not listed then
  table.insert(vacant, ARGV[2])
  redis.call('hset', KEYS[1], 'vacant', cjson.encode(vacant))
end
if redis.call('get', KEYS[2]) == ARGV[1] then redis.call('del', KEYS[2]) end
return 1`;

/** HSETNX on a job's hash only while the job is registered (its spec is there), so a deleted job is not half re-created. */
const SET_FIELD_IF_JOB_EXISTS = "if redis.call('hexists', KEYS[1], 'spec') == 1 then return redis.call('hsetnx', KEYS[1], ARGV[1], ARGV[2]) end return 0";

export class JobStore {
  private readonly copies: CheckpointStore;
  /** Hot-swap jobs' worlds (world-store.ts): created with the job, deleted with it. */
  readonly world: WorldStore;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {
    this.copies = new CheckpointStore(redis, keys);
    this.world = new WorldStore(redis, keys);
  }

  /**
   * Registers a job; it starts `running`. Throws JobExistsError when the name is taken, and
   * NodesBusyError when a node belongs to another job that is registered and not finished.
   */
  async create(body: unknown, now = Date.now()): Promise<JobRecord> {
    const { spec } = parseJobSpec(body);
    if (spec.hotSwap?.spares.length === 0) throw new InputError('job.hotSwap.spares: a registration names at least one spare', 'hotSwap.spares');
    // A hot-swap spare is reserved for the job as its nodes are: busy in another job, it is refused.
    const reserved = [...spec.nodes, ...jobSpares({ spec })];
    const keys = [this.keys.job(spec.name), this.keys.jobs, this.keys.jobTransitions(spec.name), ...reserved.map((node) => this.keys.nodeJob(node))];
    const answer = (await this.redis.eval(
      REGISTER_JOB,
      keys.length,
      ...keys,
      this.keys.job(''),
      JSON.stringify(spec),
      String(now),
      JSON.stringify({ at: now, productive: true }),
      ...reserved,
    )) as string[];
    if (answer[0] === 'exists') throw new JobExistsError(spec.name);
    if (answer[0] === 'busy') {
      const busy = new Map<string, string>();
      for (let index = 1; index + 1 < answer.length; index += 2) busy.set(answer[index] as string, answer[index + 1] as string);
      throw new NodesBusyError(spec.name, busy);
    }
    if (spec.hotSwap) await this.world.create(spec.name);
    return this.get(spec.name);
  }

  async get(name: string): Promise<JobRecord> {
    const fields = await this.redis.hgetall(this.keys.job(name));
    if (!fields.spec) throw new JobNotFoundError(name);
    return {
      spec: JSON.parse(fields.spec) as JobSpec,
      state: (fields.state ?? 'running') as JobState,
      stateReason: fields.stateReason ?? '',
      createdAt: new Date(Number(fields.createdAt)).toISOString(),
      stateSince: new Date(Number(fields.stateSince)).toISOString(),
      policy: readPolicy(fields.policy),
      vacant: readVacant(fields.vacant),
    };
  }

  async policy(name: string): Promise<JobPolicy> {
    return (await this.get(name)).policy;
  }

  /** Changes the operator's policy for the job; fields left out keep their value. */
  async setPolicy(name: string, change: Partial<JobPolicy>): Promise<JobPolicy> {
    const policy = { ...(await this.policy(name)), ...change };
    await this.redis.hset(this.keys.job(name), 'policy', JSON.stringify(policy));
    return policy;
  }

  /**
   * Unregisters the job: its record, ladder, progress watch, checkpoints and eviction history go,
   * and its nodes no longer point at it. Returns the record it had.
   */
  async delete(name: string): Promise<JobRecord> {
    const record = await this.get(name);
    const multi = this.redis.multi();
    multi.del(
      this.keys.job(name),
      this.keys.jobTransitions(name),
      this.keys.jobCheckpoints(name),
      this.keys.jobAwaitingProgress(name),
      this.keys.jobProgressReports(name),
      this.keys.jobEvictions(name),
      this.keys.jobLadder(name),
      this.keys.jobLadderUndo(name),
      this.keys.jobMicrobatches(name),
      this.keys.jobFailSlow(name),
      this.keys.jobWorld(name),
      this.keys.jobWorldReports(name),
    );
    multi.srem(this.keys.jobs, name);
    await multi.exec();
    await this.releaseNodes(name, [...record.spec.nodes, ...jobSpares(record)]);
    return record;
  }

  /**
   * The job's workload ended by itself (completed or cancelled): it is finished, its nodes leave
   * it (a fault on one no longer feeds its ladder) and no restart is awaited any more.
   */
  async finish(name: string, reason: string, now = Date.now()): Promise<void> {
    const record = await this.get(name);
    // Its nodes leave it before it reads as finished: whoever sees it finished finds them free,
    // and a finish cut short here is done again (its workload is still gone) at the next tick.
    await this.releaseNodes(name, [...record.spec.nodes, ...jobSpares(record)]);
    await this.redis.del(
      this.keys.jobAwaitingProgress(name),
      this.keys.jobLadder(name),
      this.keys.jobLadderUndo(name),
      this.keys.jobWorld(name),
      this.keys.jobWorldReports(name),
    );
    await this.setState(name, 'finished', reason, now);
  }

  /** Whether the job's workload was read present once (job-end.ts); kept with the job, so a controller restart does not forget it. */
  async workloadSeen(name: string): Promise<boolean> {
    return (await this.redis.hexists(this.keys.job(name), WORKLOAD_SEEN_FIELD)) === 1;
  }

  /** Records that the job's workload was read present; nothing when the job was deleted meanwhile. */
  async markWorkloadSeen(name: string, now = Date.now()): Promise<void> {
    await this.redis.eval(SET_FIELD_IF_JOB_EXISTS, 1, this.keys.job(name), WORKLOAD_SEEN_FIELD, String(now));
  }

  /** Drops node → job entries that still name this job (a node may since serve another). */
  private async releaseNodes(name: string, nodes: readonly string[]): Promise<void> {
    const owners = nodes.length > 0 ? await this.redis.mget(...nodes.map((node) => this.keys.nodeJob(node))) : [];
    const mine = nodes.filter((_, index) => owners[index] === name);
    if (mine.length > 0) await this.redis.del(...mine.map((node) => this.keys.nodeJob(node)));
  }

  async list(): Promise<JobRecord[]> {
    const names = (await this.redis.smembers(this.keys.jobs)).sort();
    return Promise.all(names.map((name) => this.get(name)));
  }

  /** The job running on `node`, if any. */
  async jobOnNode(node: string): Promise<string | undefined> {
    return (await this.redis.get(this.keys.nodeJob(node))) ?? undefined;
  }

  /** Moves the job to `state`, accounting the time spent in the previous one. */
  async setState(name: string, state: JobState, reason: string, now = Date.now()): Promise<void> {
    const fields = await this.redis.hgetall(this.keys.job(name));
    if (!fields.spec) throw new JobNotFoundError(name);
    const wasProductive = fields.state === 'running';
    const productiveMs = Number(fields.productiveMs ?? 0) + (wasProductive ? now - Number(fields.stateSince) : 0);
    const multi = this.redis.multi();
    multi.hset(this.keys.job(name), { state, stateReason: reason, stateSince: String(now), productiveMs: String(productiveMs) });
    if (wasProductive !== (state === 'running')) {
      multi.rpush(this.keys.jobTransitions(name), JSON.stringify({ at: now, productive: state === 'running' }));
      multi.ltrim(this.keys.jobTransitions(name), -TRANSITIONS_KEPT, -1);
    }
    await multi.exec();
  }

  /** Replaces a node of the job (evicted → standby) in the node index and the spec. */
  async replaceNode(name: string, evicted: string, replacement: string): Promise<void> {
    const record = await this.get(name);
    const multi = this.redis.multi();
    multi.hset(this.keys.job(name), 'spec', JSON.stringify(replaceNodeInSpec(record.spec, evicted, replacement)));
    multi.del(this.keys.nodeJob(evicted));
    multi.set(this.keys.nodeJob(replacement), name);
    await multi.exec();
  }

  /**
   * A hot swap put `spare` in the place of `failed` (DeadPool §V-C): the spare becomes one of the
   * job's nodes (and leaves its spares), the failed node leaves the job. Nothing when done before.
   */
  async useSpare(name: string, failed: string, spare: string): Promise<void> {
    const record = await this.get(name);
    if (!record.spec.nodes.includes(failed)) return;
    const replaced = replaceNodeInSpec(record.spec, failed, spare);
    const hotSwap = record.spec.hotSwap ? { ...record.spec.hotSwap, spares: record.spec.hotSwap.spares.filter((node) => node !== spare) } : undefined;
    const multi = this.redis.multi();
    multi.hset(this.keys.job(name), 'spec', JSON.stringify({ ...replaced, ...(hotSwap ? { hotSwap } : {}) }));
    multi.del(this.keys.nodeJob(failed));
    multi.set(this.keys.nodeJob(spare), name);
    await multi.exec();
  }

  /** A node joins the job's hot-swap spares (a standby taking a used spare's place); it runs a spare process from the next launch. */
  async addSpare(name: string, node: string): Promise<void> {
    const record = await this.get(name);
    const hotSwap = record.spec.hotSwap;
    if (!hotSwap || hotSwap.spares.includes(node) || record.spec.nodes.includes(node)) return;
    const multi = this.redis.multi();
    multi.hset(this.keys.job(name), 'spec', JSON.stringify({ ...record.spec, hotSwap: { ...hotSwap, spares: [...hotSwap.spares, node] } }));
    multi.set(this.keys.nodeJob(node), name);
    await multi.exec();
  }

  /**
   * The node leaves the job with no one in its place (evicted, no warm standby left): it no
   * longer belongs to the job (jobMembers), and its node → job entry goes. Nothing when the job
   * was deleted meanwhile.
   */
  async vacate(name: string, node: string): Promise<void> {
    await this.redis.eval(VACATE_NODE, 2, this.keys.job(name), this.keys.nodeJob(node), name, node);
  }

  /** Records the code version the job now runs (an update or a rollback). */
  async setVersion(name: string, version: string): Promise<void> {
    const record = await this.get(name);
    await this.redis.hset(this.keys.job(name), 'spec', JSON.stringify({ ...record.spec, codeVersion: version }));
  }

  async ettr(name: string, now = Date.now()): Promise<Ettr> {
    const fields = await this.redis.hgetall(this.keys.job(name));
    if (!fields.spec) throw new JobNotFoundError(name);
    const createdAt = Number(fields.createdAt);
    const productiveMs = Number(fields.productiveMs ?? 0) + (fields.state === 'running' ? now - Number(fields.stateSince) : 0);
    const cumulative = now > createdAt ? productiveMs / (now - createdAt) : 1;
    const transitions = (await this.redis.lrange(this.keys.jobTransitions(name), 0, -1))
      .map((text) => transitionSchema.safeParse(JSON.parse(text)))
      .flatMap((result) => (result.success ? [result.data] : []));
    return { cumulative, window1h: productiveShare(transitions, Math.max(createdAt, now - HOUR_MS), now) };
  }

  /**
   * Keeps checkpoint copies the training side reports for a registered job (checkpoint-store.ts):
   * each names a rank of its topology and a holder among its current nodes. Throws InputError
   * naming the field; nothing of a refused report is kept.
   */
  async addCheckpoints(name: string, body: unknown): Promise<number> {
    const record = await this.get(name);
    return this.copies.add(name, { ranks: worldSize(record.spec), nodes: new Set(jobMembers(record)) }, body);
  }

  /** Every kept checkpoint copy of a registered job, oldest step first. */
  async checkpoints(name: string): Promise<CheckpointShard[]> {
    await this.get(name);
    return this.copies.all(name);
  }

  /** A registered job's kept checkpoint steps, newest first, in chunks (checkpoint-store.ts). */
  async *checkpointSteps(name: string): AsyncGenerator<StepCopies> {
    await this.get(name);
    yield* this.copies.steps(name);
  }
}

/** A stored JSON field read back through `schema`, or undefined when it is not JSON or not of that shape. */
function readStored<T>(raw: string, schema: z.ZodType<T>): T | undefined {
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch {
    return undefined;
  }
  const parsed = schema.safeParse(value);
  return parsed.success ? parsed.data : undefined;
}

function readPolicy(raw: string | undefined): JobPolicy {
  if (raw === undefined) return DEFAULT_JOB_POLICY;
  // A policy that does not read back is taken as the most careful one: recover nothing.
  return readStored(raw, jobPolicySchema) ?? { recovery: false, dryRun: true };
}

const vacantSchema = z.array(nodeNameSchema);

/** The job's vacant nodes as stored; none when the field is absent (or does not read back). */
function readVacant(raw: string | undefined): string[] {
  return raw === undefined ? [] : (readStored(raw, vacantSchema) ?? []);
}

/** Share of [from, to] spent productive, from the job's productive/unproductive transitions. */
export function productiveShare(transitions: readonly { at: number; productive: boolean }[], from: number, to: number): number {
  if (to <= from) return 1;
  let productive = false;
  let cursor = from;
  let total = 0;
  for (const transition of transitions) {
    if (transition.at <= from) {
      productive = transition.productive;
      continue;
    }
    if (transition.at >= to) break;
    if (productive) total += transition.at - cursor;
    cursor = transition.at;
    productive = transition.productive;
  }
  if (productive) total += to - cursor;
  return total / (to - from);
}
