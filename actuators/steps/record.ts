import { recordStep, type Halt, type StepAt, type StepDeps } from './context.js';

/** The notify and tolerate steps: on the record only (the audit trail and the decision that chose them say why). */
export async function recordOnly(deps: StepDeps, at: StepAt): Promise<Halt> {
  await recordStep(deps, at, 'done', 'recorded');
  return undefined;
}
