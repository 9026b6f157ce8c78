import { recordStep, type Halt, type StepAt, type Pager, type StepRecording } from './context.js';

/** The page_human step: automation hands the incident to a person (steadfast_human_pages_total). */
export async function pageHuman(deps: StepRecording & { readonly pager: Pager }, at: StepAt): Promise<Halt> {
  deps.pager.page(at.job, at.step.reason);
  await recordStep(deps, at, 'done', `paged: ${at.step.reason}`);
  return undefined;
}
