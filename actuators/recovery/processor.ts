import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import { InputError } from '../../core/errors.js';
import { recoveryJobSchema, nothingFound, type AnalysisKind, type RecoveryJob } from '../../core/queues.js';
import { recordStep, stepRef, type RecoveryActuatorDeps, type StepAt } from './context.js';
import { evict } from './evict.js';
import { restart } from './restart.js';
import { stop } from './stop.js';

/** A finished step's marker outlives any redelivery of its transition. */
const STEP_DONE_TTL_SECONDS = 7 * 24 * 3600;

/**
 * Carries out one ladder transition's steps in order, each at most once (a per-step marker in
 * Redis survives a crash mid-transition, so a redelivered job resumes where it stopped and
 * evicts nothing twice). Evictions pass the safety gates: pause, budget, per-node lease.
 */
export function createRecoveryProcessor(deps: RecoveryActuatorDeps): (job: Job<RecoveryJob>) => Promise<{ done: number }> {
  const { redis, keys, gates, logger } = deps;
  return async (job) => {
    const parsed = recoveryJobSchema.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(new InputError(`invalid recovery job payload: ${parsed.error.message}`).message);
    const { transitionId, steps, origin } = parsed.data;
    const paused = await gates.paused();
    if (paused !== undefined) {
      // Paused: nothing of the transition runs; the refusal is on record and a person is told.
      for (const [index, step] of steps.entries()) await recordStep(deps, { transitionId, index, step, origin }, 'refused', `actions are paused: ${paused}`);
      return { done: 0 };
    }
    let done = 0;
    for (const [index, step] of steps.entries()) {
      const marker = keys.recoveryStep(transitionId, index);
      if ((await redis.get(marker)) === 'done') continue;
      const proceed = await runStep(deps, { transitionId, index, step, origin });
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

/** One step; false stops the transition (an eviction refused). */
async function runStep(deps: RecoveryActuatorDeps, at: StepAt): Promise<boolean> {
  const { step } = at;
  switch (step.verb) {
    case 'evict':
      return evict(deps, at);
    case 'rollback':
    case 'apply_update':
      // A hot update in place (ByteRobust §6.1): the version changes here, the restart step
      // that follows relaunches on it.
      if (step.version) await deps.jobs.setVersion(step.job, step.version);
      await recordStep(deps, at, 'done', `code version set to ${step.version ?? '(unchanged)'}`);
      return true;
    case 'restart':
    case 'reattempt':
      await restart(deps, at);
      return true;
    case 'run_diagnostics':
      await handToAnalysis(deps, at, 'diagnostics');
      return true;
    case 'run_replay':
      await handToAnalysis(deps, at, 'replay');
      return true;
    case 'analyze_stacks':
      await handToAnalysis(deps, at, 'stacks');
      return true;
    case 'quarantine':
      if (step.nodes?.length) await deps.redis.sadd(deps.keys.quarantine, ...step.nodes);
      await recordStep(deps, at, 'done', `quarantined ${step.nodes?.join(',') ?? ''}`);
      return true;
    case 'page_human':
      deps.onPage?.(step.job, step.reason);
      await recordStep(deps, at, 'done', `paged: ${step.reason}`);
      return true;
    case 'stop':
      await stop(deps, at);
      return true;
    case 'notify':
    case 'tolerate':
      await recordStep(deps, at, 'done', 'recorded');
      return true;
    default:
      throw new UnrecoverableError(`unknown recovery step ${String(step.verb)}`);
  }
}

/**
 * The analyzers run on their own queue (controller/analysis.ts) and report back to the ladder;
 * this step only hands the work over, once.
 */
async function handToAnalysis(deps: RecoveryActuatorDeps, at: StepAt, kind: AnalysisKind): Promise<void> {
  const { step } = at;
  if (deps.analyze) {
    await deps.analyze({ kind, job: step.job, ref: stepRef(at), reason: step.reason });
    await recordStep(deps, at, 'done', `${kind} analysis queued`);
  } else if (kind === 'stacks') {
    await recordStep(deps, at, 'done', 'recorded; this controller runs no analysis worker');
  } else {
    // Without analyzers the ladder goes on as ByteRobust §4.2 does when checks find nothing.
    await recordStep(deps, at, 'done', `this controller runs no analysis worker; ${kind} reported as finding nothing`);
    await deps.feedback({ job: step.job, event: nothingFound(kind, Date.now()), eventId: `${stepRef(at)}:${kind}` });
  }
}
