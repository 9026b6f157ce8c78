import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { AuditLog } from '../core/audit.js';
import { errorMessage, InputError } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import { nothingFound, type AnalysisJob } from '../controller/analysis.js';
import type { JobStore } from '../controller/job-store.js';
import type { LadderEvent, LadderStep } from '../controller/ladder.js';
import { recoveryJobSchema, type LadderEventJob, type RecoveryJob } from '../controller/recovery.js';
import type { ClusterBackend } from './backend.js';
import { launchArgv, parseJobSpec } from '../core/job.js';
import { planRestore, type CheckpointShard } from './restore-plan.js';
import type { SafetyGates } from './safety.js';
import type { StandbyPool } from './standby-pool.js';
import type { ProgressWatch } from '../controller/progress.js';

const run = promisify(execFile);
const STEP_DONE_TTL_SECONDS = 7 * 24 * 3600;
const LAUNCH_TIMEOUT_MS = 120_000;
const EXCLUSION_WINDOW_MS = 7 * 24 * 3600_000;
const QUARANTINE_AFTER = 3;

export interface RecoveryActuatorDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly jobs: JobStore;
  readonly logger: Logger;
  /** Feeds a step's outcome back into the job's ladder (RecoveryDispatcher.apply). */
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  readonly onPage?: (job: string, reason: string) => void;
  /** Most of a job's nodes one window may evict, in percent (safety.maxJobEvictionPercent). */
  readonly maxJobEvictionPercent?: number;
  /** The managed standby pool; when it has no candidates, standbys held by hand are used. */
  readonly pool?: StandbyPool;
  /** Judges restarts by training progress; without it, an accepted launch counts as success. */
  readonly progress?: ProgressWatch;
  /** Hands diagnostics, replay and stack aggregation to the analysis queue (controller/analysis.ts). */
  readonly analyze?: (request: AnalysisJob) => Promise<void>;
}

/**
 * Carries out one ladder transition's steps in order, each at most once (a per-step marker in
 * Redis survives a crash mid-transition, so a redelivered job resumes where it stopped and
 * evicts nothing twice). Evictions pass the safety gates: pause, budget, per-node lease.
 */
export function createRecoveryProcessor(deps: RecoveryActuatorDeps): (job: Job<RecoveryJob>) => Promise<{ done: number }> {
  const { redis, keys, audit, backend, gates, jobs, logger } = deps;

  async function record(transitionId: string, index: number, step: LadderStep, state: 'done' | 'refused' | 'failed', detail: string, node?: string): Promise<void> {
    await audit.append(
      {
        type: 'action',
        ref: `${transitionId}:${index}`,
        node: node ?? step.nodes?.[0],
        summary: `${step.job}: ${step.verb}${node ? ` ${node}` : ''}: ${state} (${detail})`,
        data: { job: step.job, verb: step.verb, state, detail, backend: backend.name, step },
      },
      `action:${transitionId}:${index}:${node ?? ''}:${state}`,
    );
  }

  /**
   * Exclusion history across every job (504-GPU report: three nodes caused half of all
   * exclusions): a node evicted QUARANTINE_AFTER times within a week is quarantined — never
   * again a standby, and reported — whichever jobs it served.
   */
  async function noteExclusion(transitionId: string, index: number, step: LadderStep, node: string): Promise<void> {
    const key = keys.nodeExclusions(node);
    const now = Date.now();
    await redis.zadd(key, String(now), `${transitionId}:${index}`);
    await redis.zremrangebyscore(key, '-inf', String(now - EXCLUSION_WINDOW_MS));
    await redis.pexpire(key, EXCLUSION_WINDOW_MS);
    const count = await redis.zcard(key);
    if (count >= QUARANTINE_AFTER && (await redis.sadd(keys.quarantine, node)) === 1) {
      const reason = `${node} was excluded ${count} times within 7 days; quarantined until an operator returns it`;
      await record(transitionId, index, step, 'done', reason, node);
      deps.onPage?.(step.job, reason);
    }
  }

  async function evict(transitionId: string, index: number, step: LadderStep): Promise<boolean> {
    const jobSize = (await jobs.get(step.job)).spec.nodes.length;
    const share = await gates.admitJobShare(step.job, `${transitionId}:${index}`, step.nodes ?? [], jobSize, deps.maxJobEvictionPercent ?? 100);
    const admitted = share.ok ? await gates.admit(`${transitionId}:${index}`) : share;
    if (!admitted.ok) {
      await record(transitionId, index, step, 'refused', admitted.reason);
      // Many refusals at once are one incident (a leaf switch down): page for the first in the window.
      if (await gates.claimPage(admitted.gate)) {
        deps.onPage?.(step.job, admitted.reason);
        await audit.append(
          {
            type: 'action',
            ref: `${transitionId}:${index}:page`,
            node: step.nodes?.[0],
            summary: `${step.job}: page_human: a person is needed: eviction refused (${admitted.reason}); later refusals in this window are audited without paging`,
            data: { job: step.job, verb: 'page_human', state: 'done', detail: admitted.reason, gate: admitted.gate, backend: backend.name },
          },
          `action:${transitionId}:${index}:page`,
        );
      }
      return false;
    }
    const quarantined = new Set(await redis.smembers(keys.quarantine));
    for (const node of step.nodes ?? []) {
      const holder = `${transitionId}:${index}`;
      const lease = await gates.acquireLease(node, holder);
      if (!lease.ok) throw new Error(lease.reason);
      try {
        const before = await backend.nodeState(node);
        if (!before.drained) await backend.drain(node, `steadfast: ${step.reason} audit=${transitionId}`);
        await record(transitionId, index, step, 'done', before.drained ? `already out of service (${before.raw})` : `drained through ${backend.name}`, node);
        await noteExclusion(transitionId, index, step, node);
      } finally {
        await gates.releaseLease(node, holder);
      }
      // ByteRobust §6.2: a warm standby takes the evicted machine's place.
      const standby = deps.pool?.enabled
        ? await deps.pool.take(step.job)
        : (await backend.standbys()).find((candidate) => !quarantined.has(candidate));
      if (!standby) {
        const reason = `no warm standby left to replace ${node}; provision one (steadfast plan standby sizes the pool)`;
        await record(transitionId, index, step, 'failed', reason, node);
        deps.onPage?.(step.job, reason);
        continue;
      }
      if (!deps.pool?.enabled) await backend.activateStandby(standby, step.job);
      await jobs.replaceNode(step.job, node, standby);
      await record(transitionId, index, step, 'done', `standby ${standby} activated in place of ${node}`, standby);
    }
    return true;
  }

  /**
   * Where the restarted job resumes from: the newest checkpoint step every rank can still load
   * after the evictions, and each rank's cheapest surviving copy (ByteRobust §6.3).
   */
  async function recordRestorePlan(transitionId: string, index: number, step: LadderStep): Promise<void> {
    const shards = await jobs.checkpoints(step.job);
    if (shards.length === 0) return;
    const jobRecord = await jobs.get(step.job);
    const { topology } = parseJobSpec(jobRecord.spec);
    const evicted = new Set(await evictedHolders(shards));
    // The spec already names the standbys, so each rank's node is where it runs after the restart.
    const plan = planRestore(shards, { ranks: topology.ranks.length, evicted, rankNodes: new Map(topology.ranks.map((rank) => [rank.rank, rank.node])) });
    const detail = plan
      ? `restore from step ${plan.step}: ${plan.sources.filter((source) => !source.local).length} of ${plan.sources.length} ranks load from another node or remote storage${plan.skipped.length ? `; newer steps ${plan.skipped.map((skip) => skip.step).join(', ')} lost a shard` : ''}`
      : 'no checkpoint step survives the evictions: the job restarts from its last persistent checkpoint';
    await audit.append(
      { type: 'action', ref: `${transitionId}:${index}:restore`, summary: `${step.job}: restore plan: ${detail}`, data: { job: step.job, verb: 'restore_plan', state: 'done', detail, plan } },
      `action:${transitionId}:${index}:restore`,
    );
  }

  /** Holders of the shards that the backend shows out of service (evicted, drained, gone). */
  async function evictedHolders(shards: readonly CheckpointShard[]): Promise<string[]> {
    const holders = [...new Set(shards.flatMap((shard) => (shard.holder ? [shard.holder] : [])))];
    const states = await Promise.all(holders.map(async (holder) => ({ holder, state: await backend.nodeState(holder) })));
    return states.filter(({ state }) => state.drained || !state.exists).map(({ holder }) => holder);
  }

  async function launch(transitionId: string, index: number, step: LadderStep): Promise<void> {
    const jobRecord = await jobs.get(step.job);
    const launcher = jobRecord.spec.launcher;
    let outcome: LadderEvent;
    await recordRestorePlan(transitionId, index, step);
    if (launcher.kind === 'slurm') {
      try {
        // Inside the try: a stored value launchArgv refuses is a failed restart on record, not a crashed step.
        const argv = launchArgv(launcher, { job: step.job, nodes: jobRecord.spec.nodes, version: jobRecord.spec.codeVersion });
        const { stdout } = await run(argv[0] as string, argv.slice(1), { timeout: LAUNCH_TIMEOUT_MS, maxBuffer: 1024 * 1024 });
        await record(transitionId, index, step, 'done', `launched ${jobRecord.spec.codeVersion} on ${jobRecord.spec.nodes.join(',')}: ${stdout.trim().slice(0, 200) || 'ok'}`);
        // Accepted by the launcher; with a ProgressWatch the verdict waits for new iterations.
        outcome = { type: 'restart_succeeded', time: Date.now() };
      } catch (error) {
        const said = (error as { stderr?: string }).stderr?.trim() || errorMessage(error);
        await record(transitionId, index, step, 'failed', `launcher failed: ${said.slice(0, 300)}`);
        outcome = { type: 'restart_failed', time: Date.now(), detail: said.slice(0, 300) };
      }
    } else if (backend.relaunchWorkload) {
      try {
        const deleted = await backend.relaunchWorkload(launcher.namespace, launcher.podSelector);
        await record(transitionId, index, step, 'done', `relaunched ${launcher.workload} in ${launcher.namespace}: ${deleted} pods deleted for its controller to recreate`);
        outcome = { type: 'restart_succeeded', time: Date.now() };
      } catch (error) {
        await record(transitionId, index, step, 'failed', `relaunch of ${launcher.workload} failed: ${errorMessage(error).slice(0, 300)}`);
        outcome = { type: 'restart_failed', time: Date.now(), detail: errorMessage(error).slice(0, 300) };
      }
    } else {
      await record(transitionId, index, step, 'failed', `the ${backend.name} backend cannot relaunch Kubernetes workload ${launcher.workload}; restart it by hand`);
      deps.onPage?.(step.job, 'relaunch needs a person');
      return;
    }
    if (outcome.type === 'restart_succeeded' && deps.progress) {
      // Launched: whether it trains again is decided later, from Prometheus (controller/progress.ts).
      await deps.progress.watch(step.job, `${transitionId}:${index}`);
      return;
    }
    await deps.feedback({ job: step.job, event: outcome, eventId: `${transitionId}:${index}:${outcome.type}` });
  }

  async function runStep(transitionId: string, index: number, step: LadderStep): Promise<boolean> {
    switch (step.verb) {
      case 'evict':
        return evict(transitionId, index, step);
      case 'rollback':
      case 'apply_update':
        // A hot update in place (ByteRobust §6.1): the version changes here, the restart step
        // that follows relaunches on it.
        if (step.version) await jobs.setVersion(step.job, step.version);
        await record(transitionId, index, step, 'done', `code version set to ${step.version ?? '(unchanged)'}`);
        return true;
      case 'restart':
      case 'reattempt':
        await launch(transitionId, index, step);
        return true;
      case 'run_diagnostics':
      case 'run_replay':
      case 'analyze_stacks': {
        // The analyzers run on their own queue (controller/analysis.ts) and report back to the
        // ladder; this step only hands the work over, once.
        const kind = step.verb === 'run_diagnostics' ? 'diagnostics' : step.verb === 'run_replay' ? 'replay' : 'stacks';
        if (deps.analyze) {
          await deps.analyze({ kind, job: step.job, ref: `${transitionId}:${index}`, reason: step.reason });
          await record(transitionId, index, step, 'done', `${kind} analysis queued`);
        } else if (kind === 'stacks') {
          await record(transitionId, index, step, 'done', 'recorded; this controller runs no analysis worker');
        } else {
          // Without analyzers the ladder goes on as ByteRobust §4.2 does when checks find nothing.
          await record(transitionId, index, step, 'done', `this controller runs no analysis worker; ${kind} reported as finding nothing`);
          await deps.feedback({ job: step.job, event: nothingFound(kind, Date.now()), eventId: `${transitionId}:${index}:${kind}` });
        }
        return true;
      }
      case 'quarantine':
        if (step.nodes?.length) await redis.sadd(keys.quarantine, ...step.nodes);
        await record(transitionId, index, step, 'done', `quarantined ${step.nodes?.join(',') ?? ''}`);
        return true;
      case 'page_human':
        deps.onPage?.(step.job, step.reason);
        await record(transitionId, index, step, 'done', `paged: ${step.reason}`);
        return true;
      case 'stop':
      case 'notify':
      case 'tolerate':
        await record(transitionId, index, step, 'done', 'recorded');
        return true;
      default:
        throw new UnrecoverableError(`unknown recovery step ${String(step.verb)}`);
    }
  }

  return async (job) => {
    const parsed = recoveryJobSchema.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(new InputError(`invalid recovery job payload: ${parsed.error.message}`).message);
    const { transitionId, steps } = parsed.data;
    if ((await gates.paused()) !== undefined) {
      // Paused: nothing of the transition runs; the refusal is on record and a person is told.
      for (const [index, step] of steps.entries()) await record(transitionId, index, step, 'refused', `actions are paused: ${String(await gates.paused())}`);
      return { done: 0 };
    }
    let done = 0;
    for (const [index, step] of steps.entries()) {
      const marker = keys.recoveryStep(transitionId, index);
      if ((await redis.get(marker)) === 'done') continue;
      const proceed = await runStep(transitionId, index, step);
      await redis.set(marker, 'done', 'EX', STEP_DONE_TTL_SECONDS);
      done += 1;
      if (!proceed) {
        logger.warn({ transitionId, step: step.verb }, 'recovery stopped: a step was refused');
        break;
      }
    }
    return { done };
  };
}
