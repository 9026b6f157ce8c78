import { nothingFound, type AnalysisJob, type AnalysisKind, type LadderEventJob } from '../../core/queues.js';
import type { StepVerb } from '../../core/steps.js';
import { recordStep, stepJob, stepRef, type Halt, type StepActuator, type StepAt, type StepRecording } from './context.js';

/**
 * The run_diagnostics, run_replay and analyze_stacks steps. The analyzers run on their own queue
 * (analysis worker) and report back to the job's ladder; these steps only hand the work over, once.
 */
const KINDS = { run_diagnostics: 'diagnostics', run_replay: 'replay', analyze_stacks: 'stacks' } as const satisfies Partial<Record<StepVerb, AnalysisKind>>;

export type AnalysisVerb = keyof typeof KINDS;

/** The step where an analysis worker runs: it hands the analysis to the analysis queue (`analyze`). */
export function handToAnalysis(verb: AnalysisVerb, deps: StepRecording & { readonly analyze: (request: AnalysisJob) => Promise<void> }): StepActuator {
  const kind = KINDS[verb];
  return async (at: StepAt): Promise<Halt> => {
    await deps.analyze({ kind, job: stepJob(at), ref: stepRef(at), reason: at.step.reason });
    await recordStep(deps, at, 'done', `${kind} analysis queued`);
    return undefined;
  };
}

/** The step where this controller runs no analysis worker: stacks are recorded, a diagnosis or a replay reported as finding nothing. */
export function withoutAnalysis(verb: AnalysisVerb, deps: StepRecording & { readonly feedback: (event: LadderEventJob) => Promise<unknown> }): StepActuator {
  const kind = KINDS[verb];
  return async (at: StepAt): Promise<Halt> => {
    const job = stepJob(at);
    if (kind === 'stacks') {
      await recordStep(deps, at, 'done', 'recorded; this controller runs no analysis worker');
    } else {
      // Without analyzers the ladder goes on as ByteRobust §4.2 does when checks find nothing.
      await recordStep(deps, at, 'done', `this controller runs no analysis worker; ${kind} reported as finding nothing`);
      await deps.feedback({ job, event: nothingFound(kind, Date.now(), 'this controller runs no analysis worker'), eventId: `${stepRef(at)}:${kind}` });
    }
    return undefined;
  };
}
