import { DoNotRetryError } from '../../core/errors.js';
import { evictionShareSize } from '../../core/job.js';
import { drainNode } from '../drain-node.js';
import { ForeignHolds } from '../foreign-holds.js';
import type { LadderEventJob } from '../../core/queues.js';
import type { Keys, Redis } from '../../core/redis.js';
import type { Logger } from '../../core/log.js';
import { recordStep, refuseStep, stepJob, stepRef, type Halt, type QuarantinePolicy, type StepAt } from './context.js';
import type { StepBase, StepJobs, Standbys } from './context.js';

/** What an eviction works with. */
export interface EvictDeps extends StepBase {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly jobs: StepJobs;
  readonly logger: Logger;
  /** Feeds a step's outcome back into the job's ladder. */
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  readonly quarantine: QuarantinePolicy;
  /** Most of a job's nodes one window may evict, in percent. */
  readonly maxJobEvictionPercent: number;
  readonly standbys: Standbys;
  /** The transition runs in dry-run (processor.ts): no standby is taken. */
  readonly dryRun: boolean;
}

/**
 * The evict step: pass the gates (pause, holds, the job's share, the cluster budget), then for each node
 * drain it (drain-node.ts), note the eviction in its cross-job history, and put a warm standby in
 * its place (ByteRobust §6.2). Undefined when the transition may go on to its restart. A node no
 * standby was left for leaves the job, the ladder hands the job to a person, and the transition
 * stops before its restart: the job is not relaunched on a node taken out of service (a dry-run
 * job, which takes no standby and takes no node out, goes on to its described relaunch).
 */
export async function evict(deps: EvictDeps, at: StepAt): Promise<Halt> {
  const { step } = at;
  const { backend, gates, jobs } = deps;
  const job = stepJob(at);
  const ref = stepRef(at);
  const jobSize = evictionShareSize((await jobs.get(job)).spec);
  const share = await gates.admitJobShare(job, ref, step.nodes ?? [], jobSize, deps.maxJobEvictionPercent);
  const admitted = share.ok ? await gates.admit(ref) : share;
  // Nodes the cluster's gates then refused were not evicted: they must not use up the job's share.
  if (share.ok && !admitted.ok) await gates.releaseJobShare(job, ref, step.nodes ?? []);
  if (!admitted.ok) return refuseStep(deps, at, admitted, { what: 'eviction', node: step.nodes?.[0] });
  const quarantined = new Set(await deps.redis.smembers(deps.keys.quarantine));
  // A held node is not chosen as a standby either (the hold gate, actuators/safety.ts).
  for (const node of (await gates.holds()).keys()) quarantined.add(node);
  // Nor one someone else drained or cordoned, or node-problem-detector flags (foreign-holds.ts).
  for (const node of await new ForeignHolds(deps.redis, deps.keys).nodes()) quarantined.add(node);
  const unreplaced: string[] = [];
  for (const node of step.nodes ?? []) {
    try {
      const { already, state } = await drainNode(backend, gates, {
        node,
        holder: ref,
        reason: step.reason,
        auditId: at.transitionId,
        ownDrains: deps.ownDrains,
      });
      await recordStep(deps, at, 'done', already ? `already out of service (${state.raw})` : `drained through ${backend.name}`, { node });
    } catch (error) {
      if (!(error instanceof DoNotRetryError)) throw error;
      // A node the scheduler does not know cannot be drained or replaced: a person decides.
      await recordStep(deps, at, 'failed', error.message, { node });
      deps.pager.page(job, error.message);
      return error.message;
    }
    await noteExclusion(deps, at, node);
    if (await replaceWithStandby(deps, at, node, quarantined)) unreplaced.push(node);
  }
  if (unreplaced.length === 0) return undefined;
  // One page for the incident: the ladder's page_human step, which this event leads to.
  await deps.feedback({ job, event: { type: 'standby_missing', time: Date.now(), nodes: unreplaced }, eventId: `${ref}:standby-missing` });
  return `no warm standby left to replace ${unreplaced.join(', ')}: the job is not relaunched without ${unreplaced.length === 1 ? 'it' : 'them'}`;
}

/** Puts a warm standby in the node's place. True when none was left and the node left the job. */
async function replaceWithStandby(deps: EvictDeps, at: StepAt, node: string, unusable: ReadonlySet<string>): Promise<boolean> {
  const job = stepJob(at);
  const standby = await deps.standbys.take(job, unusable);
  if (!standby && deps.dryRun) {
    // A dry-run job takes no standby and took no node out: it keeps its node, and its relaunch is described.
    const reason = `no warm standby left to replace ${node}; provision one (steadfast plan standby sizes the pool)`;
    await recordStep(deps, at, 'failed', reason, { node });
    deps.pager.page(at.job, reason);
    return false;
  }
  if (!standby) {
    await deps.jobs.vacate(job, node);
    await recordStep(
      deps,
      at,
      'failed',
      `no warm standby left to replace ${node}; ${node} left the job, which waits for a person (provision a standby: steadfast plan standby sizes the pool)`,
      { node },
    );
    return true;
  }
  await deps.jobs.replaceNode(job, node, standby);
  await recordStep(deps, at, 'done', `standby ${standby} activated in place of ${node}`, { node: standby });
  await reportReplacement(deps, at, node, standby);
  return false;
}

/**
 * Tells the job's ladder which standby took the node's place: a crash on it soon after says the
 * eviction did not help (ByteRobust §4.2 step ⑦). Best effort: the standby is taken and the job
 * record changed, so failing the step here would take another standby on the retry; a lost
 * report only leaves a later crash on this standby to the stop-time checks.
 */
async function reportReplacement(deps: Pick<EvictDeps, 'feedback' | 'logger'>, at: StepAt, replaced: string, by: string): Promise<void> {
  try {
    await deps.feedback({
      job: stepJob(at),
      event: { type: 'standby_activated', time: Date.now(), replaced, by },
      eventId: `${stepRef(at)}:standby:${replaced}`,
    });
  } catch (error) {
    deps.logger.warn({ job: at.job, replaced, by, err: error }, 'could not report the replacement to the ladder');
  }
}

type ExclusionDeps = Pick<EvictDeps, 'redis' | 'keys' | 'quarantine' | 'pager' | 'audit' | 'backend' | 'onFinished'>;

/**
 * Exclusion history across every job (504-GPU report: three nodes caused half of all
 * exclusions): a node evicted `quarantine.afterEvictions` times within the window is quarantined —
 * never again a standby, and reported — whichever jobs it served.
 */
export async function noteExclusion(deps: ExclusionDeps, at: StepAt, node: string): Promise<void> {
  const { redis, keys, quarantine } = deps;
  const key = keys.nodeExclusions(node);
  const now = Date.now();
  await redis.zadd(key, String(now), stepRef(at));
  await redis.zremrangebyscore(key, '-inf', String(now - quarantine.windowMs));
  await redis.pexpire(key, quarantine.windowMs);
  const count = await redis.zcard(key);
  if (count >= quarantine.afterEvictions && (await redis.sadd(keys.quarantine, node)) === 1) {
    const reason = `${node} was excluded ${count} times within ${Math.round(quarantine.windowMs / 86_400_000)} days; quarantined until an operator returns it`;
    await recordStep(deps, at, 'done', reason, { node });
    deps.pager.page(at.job, reason);
  }
}
