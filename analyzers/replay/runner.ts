import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { errorMessage } from '../../core/errors.js';
import { replayGroups } from './plan.js';

const run = promisify(execFile);

/**
 * Carries out dual-phase replay (ByteRobust §4.2, Algorithm 1) on a stopped job: the job's
 * replay command runs on every horizontal group at once (the groups are disjoint), then on
 * every vertical group at once; the machines in both a failing horizontal and a failing
 * vertical group are the suspects. The grouping itself is analyzers/replay/plan.ts.
 */

export interface ReplayGroupResult {
  readonly machines: string[];
  readonly ok: boolean;
  readonly detail: string;
}

export interface ReplayOutcome {
  readonly groupSize: number;
  readonly horizontal: ReplayGroupResult[];
  readonly vertical: ReplayGroupResult[];
  /** Machines in a failing group of both phases; empty when the failure did not reproduce. */
  readonly suspects: string[];
  readonly detail: string;
}

/** Runs the replay on one group of machines; resolves true when it trained correctly there. */
export type ReplayGroupRunner = (machines: readonly string[]) => Promise<{ ok: boolean; detail: string }>;

/**
 * The largest divisor m of z with m ≤ √z, so that n = z/m ≥ m and a single faulty machine is
 * isolated uniquely (Algorithm 1: m ≤ n). A job whose replay needs whole pipelines sets its own.
 */
export function defaultReplayGroupSize(machines: number): number {
  for (let size = Math.floor(Math.sqrt(machines)); size > 1; size -= 1) {
    if (machines % size === 0) return size;
  }
  return 1;
}

export async function runDualPhaseReplay(
  machines: readonly string[],
  runGroup: ReplayGroupRunner,
  groupSize = defaultReplayGroupSize(machines.length),
): Promise<ReplayOutcome> {
  const groups = replayGroups(machines, groupSize);
  const phase = (list: string[][]): Promise<ReplayGroupResult[]> =>
    Promise.all(
      list.map(async (group) => {
        try {
          return { machines: group, ...(await runGroup(group)) };
        } catch (error) {
          return { machines: group, ok: false, detail: errorMessage(error) };
        }
      }),
    );
  const horizontal = await phase(groups.horizontal);
  const failingRows = horizontal.filter((group) => !group.ok);
  if (failingRows.length === 0) {
    return { groupSize, horizontal, vertical: [], suspects: [], detail: `the failure did not reproduce on any of ${horizontal.length} horizontal groups` };
  }
  const vertical = await phase(groups.vertical);
  const failingColumns = vertical.filter((group) => !group.ok);
  // One faulty machine gives one failing group per phase; more are over-evicted as the union of
  // every crossing (ByteRobust §8 prefers over-eviction to restarting onto a bad machine).
  const suspects = new Set<string>();
  for (const row of failingRows) {
    for (const column of failingColumns) for (const machine of row.machines) if (column.machines.includes(machine)) suspects.add(machine);
  }
  const ordered = machines.filter((machine) => suspects.has(machine));
  const detail =
    ordered.length > 0
      ? `horizontal groups failing: ${failingRows.length}/${horizontal.length}, vertical: ${failingColumns.length}/${vertical.length}; suspects ${ordered.join(', ')}`
      : `the replays disagree (${failingRows.length} horizontal, ${failingColumns.length} vertical groups failing, no machine in both)`;
  return { groupSize, horizontal, vertical, suspects: ordered, detail };
}

/** Runs a replay argv (placeholders already filled for the group) and judges it by its exit status. */
export function commandReplayRunner(argvFor: (machines: readonly string[]) => string[], timeoutMs: number): ReplayGroupRunner {
  return async (machines) => {
    const argv = argvFor(machines);
    try {
      const { stdout } = await run(argv[0] as string, argv.slice(1), { timeout: timeoutMs, maxBuffer: 1024 * 1024 });
      return { ok: true, detail: stdout.trim().slice(-200) || 'exit 0' };
    } catch (error) {
      const failure = error as { code?: unknown; signal?: unknown; stderr?: string; killed?: boolean };
      const why = failure.killed ? `killed after ${timeoutMs / 1000} s` : typeof failure.code === 'number' ? `exit ${failure.code}` : errorMessage(error);
      return { ok: false, detail: `${why}: ${(failure.stderr ?? '').trim().slice(-200)}` };
    }
  };
}
