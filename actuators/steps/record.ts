import { recordStep, type Halt, type StepAt, type StepRecording } from './context.js';

/** The notify and tolerate steps: on the record only (the audit trail and the decision that chose them say why). */
export async function recordOnly(deps: StepRecording, at: StepAt): Promise<Halt> {
  await recordStep(deps, at, 'done', 'recorded');
  return undefined;
}
