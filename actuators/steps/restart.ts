import { parseJobSpec } from '../../core/job.js';
import type { LadderEvent } from '../../core/ladder.js';
import { launchJob } from '../launcher.js';
import { planRestoreByStep } from '../restore-plan.js';
import type { LadderEventJob } from '../../core/queues.js';
import { recordStep, stepJob, stepRef, type Halt, type Pager, type StepAt, type StepJobs } from './context.js';
import { describeCancelled, endPreviousRuns, newEpochFor, type StopDeps } from './stop.js';

/** What a restart works with. */
export interface RestartDeps extends StopDeps {
  readonly jobs: Pick<StepJobs, 'get' | 'checkpointSteps'>;
  /** Launches are only described (processor.ts). */
  readonly dryRun: boolean;
  readonly pager: Pager;
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  /**
   * How an accepted launch is judged: by training progress (the controller's ProgressWatch, from
   * `since`), or, without one, the launcher's acceptance is the verdict.
   */
  readonly judgeLaunch: (job: string, ref: string, since: number) => Promise<void>;
}

/**
 * The restart and reattempt steps: put the restore plan on record, make sure the job's previous
 * run is gone (stop.ts), start the job through its launcher (launcher.ts), and tell the ladder how it went — at once when the launch failed, or
 * after new iterations when a progress watch judges restarts.
 */
export async function restart(deps: RestartDeps, at: StepAt): Promise<Halt> {
  const job = stepJob(at);
  const { spec } = await deps.jobs.get(job);
  await recordRestorePlan(deps, at);
  // A run still there (no stop step before this restart, or a relaunch judged failed while it
  // waits or trains) would hold the nodes the relaunch needs.
  const ended = await endPreviousRuns(deps, spec);
  // The relaunched ranks start in a new epoch: no rendezvous key of the last run is reused.
  await newEpochFor(deps, spec);
  // Iterations recorded from here on are the relaunched run's: the previous one has ended.
  const launchedFrom = Date.now();
  const launched = await launchJob(spec, deps.launchers, deps.backend, { recordOnly: deps.dryRun });
  if (launched.state === 'needs_person') {
    await recordStep(deps, at, 'failed', launched.detail);
    deps.pager.page(job, 'relaunch needs a person');
    return undefined;
  }
  const previous = ended !== undefined && ended.length > 0 ? `; before it, ${describeCancelled(spec, ended)}` : '';
  await recordStep(deps, at, launched.state === 'launched' ? 'done' : 'failed', `${launched.detail}${previous}`);
  if (launched.state === 'launched') {
    // Launched: whether it trains again is judged by the progress watch, or at once (judgeLaunch).
    await deps.judgeLaunch(job, stepRef(at), launchedFrom);
    return undefined;
  }
  const outcome: LadderEvent = { type: 'restart_failed', time: Date.now(), detail: launched.reason };
  await deps.feedback({ job, event: outcome, eventId: `${stepRef(at)}:${outcome.type}` });
  return undefined;
}

/**
 * Where the restarted job resumes from: the newest checkpoint step every rank can still load
 * after the evictions, and each rank's cheapest surviving copy (ByteRobust §6.3).
 */
async function recordRestorePlan(deps: RestartDeps, at: StepAt): Promise<void> {
  const job = stepJob(at);
  const record = await deps.jobs.get(job);
  const { topology } = parseJobSpec(record.spec);
  const members = new Set(record.spec.nodes.filter((node) => !record.vacant.includes(node)));
  // The spec already names the standbys, so each rank's node is where it runs after the restart.
  const target = { ranks: topology.ranks.length, rankNodes: new Map(topology.ranks.map((rank) => [rank.rank, rank.node] as const)) };
  const { plan, stepsRead } = await planRestoreByStep(deps.jobs.checkpointSteps(job), target, (holders) => lostHolders(deps, holders, members));
  if (stepsRead === 0) return;
  const detail = plan
    ? `restore from step ${plan.step}: ${plan.sources.filter((source) => !source.local).length} of ${plan.sources.length} ranks load from another node or remote storage${plan.skipped.length ? `; newer steps ${plan.skipped.map((skip) => skip.step).join(', ')} lost a shard` : ''}`
    : 'no checkpoint step survives the evictions: the job restarts from its last persistent checkpoint';
  await deps.audit.append(
    {
      type: 'action',
      ref: `${stepRef(at)}:restore`,
      summary: `${job}: restore plan: ${detail}`,
      data: { job, verb: 'restore_plan', state: 'done', detail, plan },
    },
    `action:${stepRef(at)}:restore`,
  );
}

/** Node states asked of the backend at once (each is an sinfo or a GET). */
const NODE_STATES_AT_ONCE = 16;

/**
 * Which of these holders lost their copies: a node no longer in the job (an evicted one was
 * replaced in it) without asking, and a node of the job that the backend shows out of service
 * (drained, gone). The backend is asked only about the job's own nodes.
 */
async function lostHolders(deps: Pick<RestartDeps, 'backend'>, holders: readonly string[], members: ReadonlySet<string>): Promise<string[]> {
  const lost = holders.filter((holder) => !members.has(holder));
  const queue = holders.filter((holder) => members.has(holder));
  const worker = async (): Promise<void> => {
    for (let node = queue.pop(); node !== undefined; node = queue.pop()) {
      const state = await deps.backend.nodeState(node);
      if (state.drained || !state.exists) lost.push(node);
    }
  };
  await Promise.all(Array.from({ length: Math.min(NODE_STATES_AT_ONCE, queue.length) }, worker));
  return lost;
}
