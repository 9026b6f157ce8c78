import { recordStep, type Halt, type StepAt, type StepDeps } from './context.js';

/** The page_human step: automation hands the incident to a person (steadfast_human_pages_total). */
export async function pageHuman(deps: StepDeps, at: StepAt): Promise<Halt> {
  deps.onPage?.(at.job, at.step.reason);
  await recordStep(deps, at, 'done', `paged: ${at.step.reason}`);
  return undefined;
}
