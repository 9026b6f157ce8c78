import { recordStep, stepJob, type Halt, type StepAt, type StepJobs, type StepRecording } from './context.js';

/**
 * The rollback and apply_update steps: a hot update in place (ByteRobust §6.1, §4.2 Rollback).
 * The job's code version changes here; the restart step that follows relaunches on it.
 */
export async function setCodeVersion(deps: StepRecording & { readonly jobs: Pick<StepJobs, 'setVersion'> }, at: StepAt): Promise<Halt> {
  const { version } = at.step;
  if (version) await deps.jobs.setVersion(stepJob(at), version);
  await recordStep(deps, at, 'done', `code version set to ${version ?? '(unchanged)'}`);
  return undefined;
}
