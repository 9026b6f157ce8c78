import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import { InputError } from '../../core/errors.js';
import { ACTING_VERBS } from '../../core/ladder.js';
import { recoveryJobSchema, nothingFound, type AnalysisKind, type RecoveryJob } from '../../core/queues.js';
import { DryRunBackend } from '../dry-run.js';
import { recordStep, stepRef, type Halt, type RecoveryActuatorDeps, type StepAt } from './context.js';
import { evict } from './evict.js';
import { resetInPlace } from './reset.js';
import { restart } from './restart.js';
import { stop } from './stop.js';

/** A finished step's marker outlives any redelivery of its transition. */
const STEP_DONE_TTL_SECONDS = 7 * 24 * 3600;

/**
 * Carries out one ladder transition's steps in order, each at most once (a per-step marker in
 * Redis survives a crash mid-transition, so a redelivered job resumes where it stopped and
 * evicts nothing twice). Evictions pass the safety gates: pause, budget, per-node lease. A job
 * whose automatic recovery the operator turned off has its acting steps (ACTING_VERBS) refused;
 * notifying, paging, tolerating and reading stacks still run, so a person hears of the fault.
 * When an acting step was refused, or stopped the transition, the ladder is told
 * (`recovery_refused`): it waits for nothing that will not come.
 */
export function createRecoveryProcessor(baseDeps: RecoveryActuatorDeps): (job: Job<RecoveryJob>) => Promise<{ done: number }> {
  const { redis, keys, gates, logger } = baseDeps;
  // Dry-run swaps the backend for one that records instead of acting; the same steps run.
  const dryRunDeps: RecoveryActuatorDeps = { ...baseDeps, backend: new DryRunBackend(redis, keys), pool: undefined, dryRun: true };
  return async (job) => {
    const parsed = recoveryJobSchema.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(new InputError(`invalid recovery job payload: ${parsed.error.message}`).message);
    const { transitionId, steps, origin } = parsed.data;
    // The operator's per-job policy, read as the transition starts (an unregistered job has none).
    const policy = await baseDeps.jobs.get(parsed.data.job).then(
      (record) => record.policy,
      () => undefined,
    );
    const deps = policy?.dryRun ? dryRunDeps : baseDeps;
    const paused = await gates.paused();
    const jobName = parsed.data.job;
    if (paused !== undefined) {
      // Paused: nothing of the transition runs; the refusal is on record and a person is told.
      const why = `actions are paused: ${paused}`;
      for (const [index, step] of steps.entries()) await recordStep(deps, { transitionId, index, step, origin }, 'refused', why);
      if (steps.some((step) => ACTING_VERBS.has(step.verb))) await tellRefused(deps, jobName, transitionId, why);
      return { done: 0 };
    }
    let done = 0;
    let refused: Halt;
    for (const [index, step] of steps.entries()) {
      const marker = keys.recoveryStep(transitionId, index);
      // A step already carried out is not again; how it ended still counts (a redelivery stops where the first delivery stopped).
      const earlier = parseMarker(await redis.get(marker));
      if (earlier !== undefined) {
        refused ??= earlier.refused ?? earlier.halt;
        if (earlier.halt !== undefined) break;
        continue;
      }
      const at = { transitionId, index, step, origin };
      let halt: Halt;
      let refusal: Halt;
      if (policy?.recovery === false && ACTING_VERBS.has(step.verb)) {
        refusal = `automatic recovery is off for job ${step.job} (the operator's job policy); not acting`;
        await recordStep(deps, at, 'refused', refusal);
      } else {
        halt = await runStep(deps, at);
        if (halt !== undefined) halt = `${step.verb} stopped the transition: ${halt}`;
      }
      await redis.set(marker, markerOf({ halt, refused: refusal }), 'EX', STEP_DONE_TTL_SECONDS);
      done += 1;
      refused ??= refusal ?? halt;
      if (halt !== undefined) {
        logger.warn({ transitionId, step: step.verb, reason: halt }, 'recovery stopped: a step was refused or failed');
        break;
      }
    }
    if (refused !== undefined) await tellRefused(deps, jobName, transitionId, refused);
    return { done };
  };
}

/** How a step ended, as its marker keeps it: `done`, or `halt:` / `refused:` and why. */
interface StepEnd {
  readonly halt?: Halt;
  readonly refused?: Halt;
}

function markerOf(end: StepEnd): string {
  return end.halt !== undefined ? `halt:${end.halt}` : end.refused !== undefined ? `refused:${end.refused}` : 'done';
}

function parseMarker(value: string | null): StepEnd | undefined {
  if (value === null) return undefined;
  if (value.startsWith('halt:')) return { halt: value.slice('halt:'.length) };
  if (value.startsWith('refused:')) return { refused: value.slice('refused:'.length) };
  return {};
}

/** Tells the ladder that what it decided in `transitionId` was not (all) done, once per transition. */
async function tellRefused(deps: RecoveryActuatorDeps, job: string, transitionId: string, detail: string): Promise<void> {
  await deps.feedback({ job, event: { type: 'recovery_refused', time: Date.now(), transitionId, detail: detail.slice(0, 500) }, eventId: `${transitionId}:refused` });
}

/** One step; a Halt stops the transition there (an eviction refused, a node unknown). */
async function runStep(deps: RecoveryActuatorDeps, at: StepAt): Promise<Halt> {
  const { step } = at;
  switch (step.verb) {
    case 'evict':
      return evict(deps, at);
    case 'reset_gpu':
      return resetInPlace(deps, at);
    case 'rollback':
    case 'apply_update':
      // A hot update in place (ByteRobust §6.1): the version changes here, the restart step
      // that follows relaunches on it.
      if (step.version) await deps.jobs.setVersion(step.job, step.version);
      await recordStep(deps, at, 'done', `code version set to ${step.version ?? '(unchanged)'}`);
      return undefined;
    case 'restart':
    case 'reattempt':
      await restart(deps, at);
      return undefined;
    case 'run_diagnostics':
      await handToAnalysis(deps, at, 'diagnostics');
      return undefined;
    case 'run_replay':
      await handToAnalysis(deps, at, 'replay');
      return undefined;
    case 'analyze_stacks':
      await handToAnalysis(deps, at, 'stacks');
      return undefined;
    case 'quarantine':
      if (step.nodes?.length && !deps.dryRun) await deps.redis.sadd(deps.keys.quarantine, ...step.nodes);
      await recordStep(deps, at, 'done', `quarantined ${step.nodes?.join(',') ?? ''}`);
      return undefined;
    case 'page_human':
      deps.onPage?.(step.job, step.reason);
      await recordStep(deps, at, 'done', `paged: ${step.reason}`);
      return undefined;
    case 'stop':
      await stop(deps, at);
      return undefined;
    case 'notify':
    case 'tolerate':
      await recordStep(deps, at, 'done', 'recorded');
      return undefined;
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
    await deps.feedback({ job: step.job, event: nothingFound(kind, Date.now(), 'this controller runs no analysis worker'), eventId: `${stepRef(at)}:${kind}` });
  }
}
