import { randomUUID } from 'node:crypto';
import { DelayedError, UnrecoverableError, type Job } from 'bullmq';
import { ZodError } from 'zod';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../../core/errors.js';
import { Locks } from '../../core/locks.js';
import { parseStepsJob, type StepsJob } from '../../core/queues.js';
import { ACTING_VERBS } from '../../core/steps.js';
import type { Logger } from '../../core/log.js';
import { describeIssues } from '../../core/validate.js';
import { conflictReason, type Profile } from '../../core/profiles.js';
import { NodeLeasedError } from '../drain-node.js';
import { DryRunBackend } from '../dry-run.js';
import { recordStep, rememberRemedy, remedyOf, type Halt, type StepActuator, type StepAt, type StepBase, type StepProcessorDeps } from './context.js';
import { DryRunGpuResetter } from './gpu-resetter.js';
import { DryRunNodeValidator } from '../node-validation.js';
import { buildStepActuators, stepBase } from './index.js';
import type { StepVerb } from '../../core/steps.js';

/** The actuators a transition runs through (dry-run or not), and what they record with. */
interface Actuators {
  readonly base: StepBase;
  readonly byVerb: Readonly<Record<StepVerb, StepActuator>>;
}

/** A finished step's marker outlives any redelivery of its transition. */
const STEP_DONE_TTL_SECONDS = 7 * 24 * 3600;

/** How long a job's transition holds the job (renewed while it runs): a dead controller's hold lapses within it. */
const JOB_HOLD_MS = 30_000;

/** The verbs that act on the nodes they name (a job's stop or restart acts on the job, whatever nodes it lists). */
const ON_NODES: ReadonlySet<StepVerb> = new Set(['evict', 'hot_swap', 'drain', 'reset_gpu', 'reboot', 'hand_off', 'quarantine']);

/** How soon a transition that found its job busy with another tries again. */
const JOB_BUSY_RETRY_MS = 100;

export interface StepOutcome {
  /** Steps carried out by this delivery (not counting those an earlier one finished). */
  readonly done: number;
  /** Why the transition stopped or was refused, when it was. */
  readonly halted?: string | undefined;
}

/**
 * Carries out one transition's steps in order, each at most once, whichever ladder queued it (a
 * job's or the node ladder): a per-step marker in Redis survives a crash mid-transition, so a
 * redelivered job resumes where it stopped and acts on nothing twice. Each step is its verb's
 * actuator (index.ts); the gates (pause, holds, budget, the node's lease) are each actuator's
 * first move. Dry-run is decided here, once per transition (the controller's dry-run backend, a
 * job's dry-run policy): every actuator then acts through what it is given.
 *
 * A job's transitions run one at a time, in the order the queue hands them over (a line per job
 * in the process, and a hold on the job in Redis against other processes: a transition that
 * finds the job held elsewhere waits its turn on the queue), those of different jobs and nodes
 * side by side. A job whose automatic
 * recovery the operator turned off has its acting steps refused; notifying, paging, tolerating
 * and reading stacks still run. When an acting step of a job was refused, or stopped the
 * transition, the ladder is told (`recovery_refused`): it waits for nothing that will not come.
 */
export function createStepProcessor(baseDeps: StepProcessorDeps): (job: Job, token?: string) => Promise<StepOutcome> {
  const { redis, keys, logger } = baseDeps;
  const locks = new Locks(redis, keys);
  const holdMs = baseDeps.jobHoldMs ?? JOB_HOLD_MS;
  // The one dry-run decision. A dry-run controller (its backend records) asks no agent to reset a
  // GPU either; a job whose policy asks for dry-run also launches nothing and takes no standby.
  const recording = baseDeps.backend.name === 'dry-run';
  // Dry-run asks no agent to validate a node either.
  const dryRunValidator = baseDeps.validator === undefined ? undefined : new DryRunNodeValidator();
  const recordingDeps: StepProcessorDeps = recording ? { ...baseDeps, resetter: new DryRunGpuResetter(), validator: dryRunValidator } : baseDeps;
  const dryRunJobDeps: StepProcessorDeps = {
    ...baseDeps,
    backend: recording ? baseDeps.backend : new DryRunBackend(redis, keys),
    resetter: new DryRunGpuResetter(),
    validator: dryRunValidator,
    pool: undefined,
  };
  const acting: Actuators = { base: stepBase(recordingDeps), byVerb: buildStepActuators(recordingDeps, { dryRun: false }) };
  const dryRunJob: Actuators = { base: stepBase(dryRunJobDeps), byVerb: buildStepActuators(dryRunJobDeps, { dryRun: true }) };
  const inProcess = new Map<string, Promise<void>>();
  // Each profile's actuators, built once: its dry-run (a recording backend and resetter, as a
  // dry-run controller has) and its own budget, with its name on what they audit. A global
  // dry-run stays what it is: the profile cannot make a recording controller act.
  /** `own`'s actuators for a profile's nodes: its budget where it has one, its name on what they audit. */
  const forProfile = (own: StepProcessorDeps, profile: Profile, dryRun: boolean): Actuators => {
    const safety = profile.safety;
    const budget = safety === undefined ? undefined : { maxPerWindow: safety.maxDrainsPerWindow, windowSeconds: safety.windowSeconds };
    const deps: StepProcessorDeps = { ...own, gates: budget === undefined ? own.gates : own.gates.withBudget(profile.name, budget), profile: profile.name };
    return { base: stepBase(deps), byVerb: buildStepActuators(deps, { dryRun }) };
  };
  const byProfile = new Map<string, Actuators>();
  const profileActuators = (profile: Profile): Actuators => {
    const known = byProfile.get(profile.name);
    if (known !== undefined) return known;
    const dryRun = profile.dryRun === true && !recording;
    const own = dryRun ? { ...baseDeps, backend: new DryRunBackend(redis, keys), resetter: new DryRunGpuResetter(), pool: undefined } : recordingDeps;
    const built = forProfile(own, profile, dryRun);
    byProfile.set(profile.name, built);
    return built;
  };
  // A job's step on a node whose profile has a budget of its own spends that budget (and names the
  // profile in what it audits); how it acts — the job's dry-run or not — stays the job's.
  const jobBudgeted = new Map<string, Actuators>();
  const jobStepActuators = async (actuators: Actuators, step: StepsJob['steps'][number]): Promise<Actuators> => {
    const node = step.nodes?.[0];
    if (baseDeps.profiles === undefined || node === undefined || !ON_NODES.has(step.verb)) return actuators;
    const match = await baseDeps.profiles.resolve(node);
    if (match.kind !== 'profile' || match.profile.safety === undefined) return actuators;
    const dryRun = actuators === dryRunJob;
    const key = `${dryRun ? 'dry-run' : 'acting'}:${match.profile.name}`;
    const known = jobBudgeted.get(key);
    if (known !== undefined) return known;
    const built = forProfile(dryRun ? dryRunJobDeps : recordingDeps, match.profile, dryRun);
    jobBudgeted.set(key, built);
    return built;
  };
  return async (queued, token) => {
    let transition: StepsJob;
    try {
      transition = parseStepsJob(queued.data);
    } catch (error) {
      const why = error instanceof ZodError ? describeIssues(error.issues) : errorMessage(error);
      throw new UnrecoverableError(`invalid steps job payload: ${why}`);
    }
    if (transition.job === undefined) return runSteps(await nodeActuators(transition), transition, queued);
    const job = transition.job;
    // In this process, a job's transitions queue up behind each other in the order the queue gave
    // them; across processes (controller replicas), the hold in Redis keeps them apart.
    const before = inProcess.get(job) ?? Promise.resolve();
    let finished = (): void => undefined;
    const mine = new Promise<void>((resolve) => (finished = resolve));
    inProcess.set(job, mine);
    try {
      await before;
      return await runJobTransition(transition, job, queued, token);
    } finally {
      finished();
      if (inProcess.get(job) === mine) inProcess.delete(job);
    }
  };

  async function runJobTransition(transition: StepsJob, job: string, queued: Job, token: string | undefined): Promise<StepOutcome> {
    const hold = await holdJob(locks, holdMs, logger, job, queued, token);
    try {
      // The operator's per-job policy, read as the transition starts (an unregistered job has none).
      const policy = await baseDeps.jobs.get(job).then(
        (record) => record.policy,
        () => undefined,
      );
      const actuators = policy?.dryRun === true ? dryRunJob : acting;
      const paused = await baseDeps.gates.paused();
      if (paused !== undefined) {
        // Paused: nothing of the transition runs; the refusal is on record and the ladder told.
        const why = `actions are paused: ${paused}`;
        for (const [index, step] of transition.steps.entries()) await recordStep(actuators.base, atOf(transition, index, step, queued), 'refused', why);
        if (transition.steps.some((step) => ACTING_VERBS.has(step.verb))) await tellRefused(baseDeps, job, transition.transitionId, why);
        return { done: 0, halted: why };
      }
      const recoveryOff = policy?.recovery === false ? `automatic recovery is off for job ${job} (the operator's job policy); not acting` : undefined;
      const outcome = await runSteps(actuators, transition, queued, recoveryOff, (step) => jobStepActuators(actuators, step));
      if (outcome.halted !== undefined) await tellRefused(baseDeps, job, transition.transitionId, outcome.halted);
      return outcome;
    } finally {
      await hold.release();
    }
  }

  /** A node ladder's transition runs with its node's profile's actuators, or the controller's for a node in none. */
  async function nodeActuators(transition: StepsJob): Promise<Actuators> {
    const node = transition.node ?? transition.steps[0]?.nodes?.[0];
    if (baseDeps.profiles === undefined || node === undefined) return acting;
    const match = await baseDeps.profiles.resolve(node);
    return match.kind === 'profile' ? profileActuators(match.profile) : acting;
  }

  /** Why an acting step may not touch its nodes: one of them is matched by two profiles (a configuration error). */
  async function profileConflict(step: StepsJob['steps'][number]): Promise<string | undefined> {
    if (baseDeps.profiles === undefined || !ON_NODES.has(step.verb)) return undefined;
    for (const node of step.nodes ?? []) {
      const match = await baseDeps.profiles.resolve(node);
      if (match.kind === 'conflict') {
        const reason = conflictReason(node, match.profiles);
        logger.error({ node, profiles: match.profiles, step: step.verb }, reason);
        return reason;
      }
    }
    return undefined;
  }

  async function runSteps(
    transitionActuators: Actuators,
    transition: StepsJob,
    queued: Job,
    recoveryOff?: string,
    forStep?: (step: StepsJob['steps'][number]) => Promise<Actuators>,
  ): Promise<StepOutcome> {
    let done = 0;
    let halted: Halt;
    for (const [index, step] of transition.steps.entries()) {
      const actuators = forStep === undefined ? transitionActuators : await forStep(step);
      const marker = keys.recoveryStep(transition.transitionId, index);
      // A step already carried out is not again; how it ended still counts (a redelivery stops where the first delivery stopped).
      const earlier = parseMarker(await redis.get(marker));
      if (earlier !== undefined) {
        halted ??= earlier.refused ?? earlier.halt;
        if (earlier.halt !== undefined) break;
        continue;
      }
      const at = atOf(transition, index, step, queued);
      let halt: Halt;
      let refusal: Halt;
      const conflict = await profileConflict(step);
      if (conflict !== undefined) {
        // No automatic action on a node two profiles claim; a node ladder's claim on it is given back.
        refusal = conflict;
        await recordStep(actuators.base, at, 'refused', refusal);
        const node = step.nodes?.[0];
        if (transition.job === undefined && node !== undefined) await locks.releaseNodeClaim(node, transition.transitionId);
      } else if (recoveryOff !== undefined && ACTING_VERBS.has(step.verb)) {
        refusal = recoveryOff;
        await recordStep(actuators.base, at, 'refused', refusal);
      } else {
        halt = await runStep(actuators, logger, at, queued);
        if (halt !== undefined) halt = `${step.verb} stopped the transition: ${halt}`;
      }
      await redis.set(marker, markerOf({ halt, refused: refusal }), 'EX', STEP_DONE_TTL_SECONDS);
      done += 1;
      halted ??= refusal ?? halt;
      if (halt !== undefined) {
        logger.warn({ transitionId: transition.transitionId, step: step.verb, reason: halt }, 'a transition stopped: a step was refused or failed');
        break;
      }
    }
    return { done, halted };
  }
}

function atOf(transition: StepsJob, index: number, step: StepsJob['steps'][number], queued: Job): StepAt {
  return {
    transitionId: transition.transitionId,
    index,
    step,
    job: transition.job,
    origin: transition.origin,
    attempt: queued.attemptsMade ?? 0,
    delivery: queued.id ?? transition.transitionId,
  };
}

/**
 * One step through its verb's actuator. A failure is audited (and, for a node's remedy that will
 * not be retried, kept in the node's history) and thrown for the queue to retry; a node's lease
 * held by another actuator is only a later try.
 */
async function runStep(actuators: Actuators, logger: Logger, at: StepAt, queued: Job): Promise<Halt> {
  const deps = actuators.base;
  try {
    return await actuators.byVerb[at.step.verb](at);
  } catch (error) {
    if (error instanceof NodeLeasedError) throw error;
    const final = error instanceof DoNotRetryError || queued.attemptsMade + 1 >= (queued.opts?.attempts ?? 1);
    await recordStep(deps, at, 'failed', `${errorMessage(error)}${final ? '' : '; will retry'}`).catch((auditError: unknown) =>
      logger.error({ err: auditError }, 'could not record a failed step'),
    );
    const node = at.step.nodes?.[0];
    const remedy = remedyOf(at.step.verb);
    if (final && at.job === undefined && node !== undefined && remedy !== undefined && remedy !== 'drain') {
      await rememberRemedy(deps, at, node, remedy, 'failed', errorMessage(error), 'failed').catch((historyError: unknown) =>
        logger.error({ err: historyError }, 'could not record the failed remediation in the node history'),
      );
    }
    if (error instanceof DoNotRetryError) throw new UnrecoverableError(error.message);
    throw error;
  }
}

/**
 * Holds the job for this transition, renewed while it runs. A job busy with another transition
 * sends this one back to wait its turn (BullMQ's delayed set; not a failed try).
 */
async function holdJob(
  locks: Locks,
  holdMs: number,
  logger: Logger,
  job: string,
  queued: Job,
  token: string | undefined,
): Promise<{ release(): Promise<void> }> {
  const holder = `${queued.id ?? ''}:${randomUUID()}`;
  if (!(await locks.holdJob(job, holder, holdMs))) {
    if (token === undefined) throw new RetryLaterError(`job ${job} is busy with another transition`);
    await queued.moveToDelayed(Date.now() + JOB_BUSY_RETRY_MS, token);
    throw new DelayedError();
  }
  const renewal = setInterval(() => {
    locks.renewJobHold(job, holder, holdMs).catch((error: unknown) => logger.warn({ job, err: error }, 'could not renew the hold on the job'));
  }, holdMs / 3);
  renewal.unref();
  return {
    async release() {
      clearInterval(renewal);
      await locks.releaseJobHold(job, holder);
    },
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
async function tellRefused(deps: Pick<StepProcessorDeps, 'feedback'>, job: string, transitionId: string, detail: string): Promise<void> {
  await deps.feedback({
    job,
    event: { type: 'recovery_refused', time: Date.now(), transitionId, detail: detail.slice(0, 500) },
    eventId: `${transitionId}:refused`,
  });
}
