import type { JobSpec } from '../../core/job.js';
import { launcherOf } from '../launcher.js';
import type { Launchers } from '../../core/launcher.js';
import type { ClusterBackend } from '../backend.js';
import { recordStep, stepJob, type Halt, type StepAt, type StepJobs, type StepRecording } from './context.js';

/** What stopping a job's run works with. */
export interface StopDeps extends StepRecording {
  readonly jobs: Pick<StepJobs, 'get'>;
  readonly launchers: Launchers;
  readonly backend: ClusterBackend;
  /** A hot-swap job's ranks meet in a new epoch (the controller's worlds); nothing under dry-run or without worlds. */
  readonly relaunched: (job: string) => Promise<void>;
}

/**
 * The stop step (ByteRobust §4.1: the job is halted before anything is done about the fault),
 * and the same guarantee before every relaunch: the job's previous run must be gone, or the
 * relaunch would wait for its nodes (or run twice). A Slurm launcher's runs are the Slurm jobs
 * named after the registered job (`--job-name={job}`), which the backend cancels and awaits.
 * A Kubernetes relaunch replaces the pods itself, and dry-run touches nothing: there the stop is
 * recorded only.
 */

/** The scheduler's job ids that were cancelled (and are gone); undefined when this backend stops nothing for this launcher. */
export async function endPreviousRuns(deps: Pick<StopDeps, 'launchers' | 'backend'>, spec: JobSpec): Promise<string[] | undefined> {
  if (launcherOf(deps.launchers, spec)?.kind !== 'slurm' || !deps.backend.cancelJobs) return undefined;
  return deps.backend.cancelJobs(spec.name);
}

export function describeCancelled(spec: JobSpec, cancelled: readonly string[]): string {
  return `cancelled Slurm job${cancelled.length === 1 ? '' : 's'} ${cancelled.join(', ')} named ${spec.name}; gone from the queue`;
}

/** A hot-swap job's ranks meet in a new epoch once its run is gone (a swap under way is over); dry-run changes nothing. */
export async function newEpochFor(deps: Pick<StopDeps, 'relaunched'>, spec: JobSpec): Promise<void> {
  if (spec.hotSwap !== undefined) await deps.relaunched(spec.name);
}

export async function stop(deps: StopDeps, at: StepAt): Promise<Halt> {
  const { spec } = await deps.jobs.get(stepJob(at));
  const cancelled = await endPreviousRuns(deps, spec);
  await newEpochFor(deps, spec);
  const detail =
    cancelled === undefined
      ? `recorded (the ${deps.backend.name} backend stops nothing for a ${launcherOf(deps.launchers, spec)?.kind ?? 'missing'} launcher)`
      : cancelled.length === 0
        ? `no Slurm job named ${spec.name} was running`
        : describeCancelled(spec, cancelled);
  await recordStep(deps, at, 'done', detail);
  return undefined;
}
