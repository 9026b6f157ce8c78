import { z } from 'zod';
import { parseOrThrow } from '../../core/validate.js';
import { runStopTimeDiagnostics, type StopTimeDiagnosis, type StopTimeDiagnosticsOptions } from './stop-time.js';

/**
 * ByteRobust's stop-time checks as a hierarchy (§4.2 Diagnose): the cheap, machine-local tests
 * first (EUD on each GPU), then NCCL within each machine (the all-to-all over its GPUs), then
 * NCCL across machines (the all-gather with neighbouring machines), and the bit-wise alignment
 * reference step (§4.3) where it is configured. Each stage is one call to every agent still in
 * the walk, asking for that stage's checks by name (`runStopTimeDiagnostics` with `checks`).
 *
 * Between stages:
 * - the walk stops at the first stage that names suspects, and those are evicted. §4.2 evicts
 *   "the discovered suspected machines" and relaunches; the stages are ordered by cost and
 *   scope, so the first level that localises the failure explains it, and running the
 *   costlier levels on the rest would keep the whole job stopped minutes longer for a second,
 *   independent fault that is unlikely in the same window. If one is there, the relaunch fails
 *   and the ladder escalates (§4.2 steps ⑦–⑧: rollback, then replay).
 * - a node a stage could not clear (its agent refused or was silent without being evicted, a
 *   check did not complete) does not go on: a multi-machine test with it in the ring would fail
 *   its neighbours for its sake. It is reported as not cleared, never evicted for it.
 * - the next stage's ring of neighbours is drawn over the nodes still in the walk.
 *
 * With no stages configured there is one stage with every configured check, as one call.
 */

export interface DiagnoseStage {
  readonly name: string;
  /** The agents' check names this stage runs; every configured check when absent. */
  readonly checks?: readonly string[] | undefined;
  /** Per-node time limit for this stage; the options' `timeoutSeconds` when absent. */
  readonly timeoutSeconds?: number | undefined;
}

export interface StageResult {
  readonly stage: string;
  /** The nodes asked in this stage, in the job's order. */
  readonly nodes: string[];
  readonly diagnosis: StopTimeDiagnosis;
  /** Nodes whose every check of the stage passed: they go on to the next stage. */
  readonly cleared: string[];
  /** Nodes neither cleared nor evicted: they are not taken further. */
  readonly dropped: string[];
}

export interface StagedDiagnosis {
  readonly stages: StageResult[];
  /** The suspects of the stage that found any; empty when none did. */
  readonly evict: string[];
  /** Stages not run, and why. */
  readonly skipped: string[];
  readonly skipReason?: string;
}

/** The single stage of an unstaged configuration: every configured check at once. */
export const ALL_CHECKS_STAGE: DiagnoseStage = { name: 'all' };

const stagesSchema = z
  .array(z.object({ name: z.string().min(1).max(64), checks: z.array(z.string()).min(1).optional(), timeoutSeconds: z.number().positive().optional() }))
  .refine((stages) => new Set(stages.map((stage) => stage.name)).size === stages.length, 'stage names must be unique');

function cleared(stage: StopTimeDiagnosis): string[] {
  return stage.outcomes
    .filter((outcome) => outcome.kind === 'report' && outcome.report.checks.length > 0 && outcome.report.checks.every((check) => check.result === 'passed'))
    .map((outcome) => outcome.node)
    .filter((node) => !stage.evict.includes(node));
}

/** Walks the stages over `nodes`; never throws for an agent's failure (see the module comment). */
export async function runStagedDiagnostics(
  nodes: readonly string[],
  stages: readonly DiagnoseStage[],
  options: Omit<StopTimeDiagnosticsOptions, 'checks'>,
): Promise<StagedDiagnosis> {
  const walk = stages.length === 0 ? [ALL_CHECKS_STAGE] : stages;
  parseOrThrow(stagesSchema, walk, 'diagnosis stages');
  const results: StageResult[] = [];
  let remaining = [...nodes];
  for (const [index, stage] of walk.entries()) {
    const rest = walk.slice(index).map((entry) => entry.name);
    if (remaining.length === 0) return { stages: results, evict: [], skipped: rest, skipReason: 'no node was cleared by the stage before' };
    const diagnosis = await runStopTimeDiagnostics(remaining, {
      ...options,
      checks: stage.checks,
      timeoutSeconds: stage.timeoutSeconds ?? options.timeoutSeconds,
    });
    const passed = cleared(diagnosis);
    const dropped = remaining.filter((node) => !passed.includes(node) && !diagnosis.evict.includes(node));
    results.push({ stage: stage.name, nodes: remaining, diagnosis, cleared: passed, dropped });
    if (diagnosis.evict.length > 0) {
      const later = rest.slice(1);
      return {
        stages: results,
        evict: [...diagnosis.evict],
        skipped: later,
        ...(later.length > 0 ? { skipReason: `stage ${stage.name} found suspects` } : {}),
      };
    }
    remaining = passed;
  }
  return { stages: results, evict: [], skipped: [] };
}
