import { nothingFound, type AnalysisKind } from '../../core/queues.js';
import type { StepVerb } from '../../core/steps.js';
import { recordStep, stepJob, stepRef, type Halt, type StepActuator, type StepAt, type StepDeps } from './context.js';

/**
 * The run_diagnostics, run_replay and analyze_stacks steps. The analyzers run on their own queue
 * (analysis worker) and report back to the job's ladder; these steps only hand the work over, once.
 */
const KINDS = { run_diagnostics: 'diagnostics', run_replay: 'replay', analyze_stacks: 'stacks' } as const satisfies Partial<Record<StepVerb, AnalysisKind>>;

export function handToAnalysis(verb: keyof typeof KINDS): StepActuator {
  const kind = KINDS[verb];
  return async (deps: StepDeps, at: StepAt): Promise<Halt> => {
    const job = stepJob(at);
    if (deps.analyze) {
      await deps.analyze({ kind, job, ref: stepRef(at), reason: at.step.reason });
      await recordStep(deps, at, 'done', `${kind} analysis queued`);
    } else if (kind === 'stacks') {
      await recordStep(deps, at, 'done', 'recorded; this controller runs no analysis worker');
    } else {
      // Without analyzers the ladder goes on as ByteRobust §4.2 does when checks find nothing.
      await recordStep(deps, at, 'done', `this controller runs no analysis worker; ${kind} reported as finding nothing`);
      await deps.feedback({ job, event: nothingFound(kind, Date.now(), 'this controller runs no analysis worker'), eventId: `${stepRef(at)}:${kind}` });
    }
    return undefined;
  };
}
