import { setImmediate as nextTurn } from 'node:timers/promises';
import type { CheckpointShard, CheckpointTier } from '../core/checkpoint.js';

/**
 * Restore planning: after evictions, which checkpoint step can the job resume from, and where
 * does each rank load its shard? The newest step for which every rank still has a copy that
 * survived — a remote copy always does, a copy held by a node survives unless that node was
 * evicted — wins (ByteRobust §6.3: local and peer in-memory backups make every-step
 * checkpoints usable without fetching from remote storage).
 *
 * Linear in the copies: one pass over a step's copies keeps each rank's cheapest, then one pass
 * over the ranks. The job store bounds what a step holds (job-store.ts), and the controller
 * plans a step at a time, giving the event loop a turn between steps (planRestoreByStep).
 */

export interface RankSource {
  readonly rank: number;
  readonly tier: CheckpointTier;
  readonly holder?: string | undefined;
  /** True when the copy is on the node the rank runs on after the restart. */
  readonly local: boolean;
}

export interface RestorePlan {
  readonly step: number;
  readonly sources: RankSource[];
  /** Newer steps that could not be used, and the first rank each was missing. */
  readonly skipped: { step: number; missingRank: number }[];
}

export interface RestoreTarget {
  /** The job's world size: ranks 0 .. ranks-1 each need a copy. */
  readonly ranks: number;
  /** Where each rank runs after the restart (evicted ranks on their standbys). */
  readonly rankNodes: ReadonlyMap<number, string>;
}

/**
 * Cost of loading a copy, lowest first: the rank's own GPU, host memory and disk; then memory on
 * another surviving node; then another node's disk; remote storage last.
 */
function cost(shard: CheckpointShard, local: boolean): number {
  if (shard.tier === 'remote') return 5;
  if (local) return { gpu: 0, host: 1, disk: 2, peer: 1 }[shard.tier];
  return shard.tier === 'disk' ? 4 : 3;
}

/** Whether a copy outlived the evictions: remote storage always does, a node's copy unless the node is lost. */
function survives(shard: CheckpointShard, lost: ReadonlySet<string>): boolean {
  return shard.tier === 'remote' || (shard.holder !== undefined && !lost.has(shard.holder));
}

/**
 * One step: each rank's cheapest surviving copy, or the first rank without one. The first copy
 * seen wins a tie, as the sort of the earlier planner kept it.
 */
export function planStep(
  copies: readonly CheckpointShard[],
  target: RestoreTarget,
  lost: ReadonlySet<string>,
): { readonly sources: RankSource[] } | { readonly missingRank: number } {
  const best = new Map<number, { readonly copy: CheckpointShard; readonly local: boolean; readonly cost: number }>();
  for (const copy of copies) {
    if (!survives(copy, lost)) continue;
    const local = copy.holder !== undefined && copy.holder === target.rankNodes.get(copy.rank);
    const price = cost(copy, local);
    const kept = best.get(copy.rank);
    if (kept === undefined || price < kept.cost) best.set(copy.rank, { copy, local, cost: price });
  }
  const sources: RankSource[] = [];
  for (let rank = 0; rank < target.ranks; rank += 1) {
    const chosen = best.get(rank);
    if (chosen === undefined) return { missingRank: rank };
    sources.push({ rank, tier: chosen.copy.tier, holder: chosen.copy.holder, local: chosen.local });
  }
  return { sources };
}

/**
 * @param options.evicted nodes whose copies are lost.
 * @returns undefined when no step is complete.
 */
export function planRestore(shards: readonly CheckpointShard[], options: RestoreTarget & { readonly evicted: ReadonlySet<string> }): RestorePlan | undefined {
  const byStep = new Map<number, CheckpointShard[]>();
  for (const shard of shards) {
    const copies = byStep.get(shard.step);
    if (copies === undefined) byStep.set(shard.step, [shard]);
    else copies.push(shard);
  }
  const skipped: RestorePlan['skipped'] = [];
  for (const step of [...byStep.keys()].sort((a, b) => b - a)) {
    const planned = planStep(byStep.get(step) ?? [], options, options.evicted);
    if ('sources' in planned) return { step, sources: planned.sources, skipped };
    skipped.push({ step, missingRank: planned.missingRank });
  }
  return undefined;
}

/** One checkpoint step's copies, as the job store reads them newest step first. */
export interface StepCopies {
  readonly step: number;
  readonly copies: readonly CheckpointShard[];
}

/** A plan over steps read one at a time, and how many steps were read (none: the job reported no checkpoint). */
export interface StepwisePlan {
  readonly plan: RestorePlan | undefined;
  readonly stepsRead: number;
}

/**
 * The same plan over steps read one at a time, newest first, stopping at the first complete one.
 * `lost` is asked once for each holder not asked before (the controller asks its backend, or
 * takes the caller's list of evicted nodes) and answers which of them lost their copies. The
 * event loop gets a turn between steps.
 */
export async function planRestoreByStep(
  steps: AsyncIterable<StepCopies>,
  target: RestoreTarget,
  lost: (holders: readonly string[]) => Promise<Iterable<string>>,
): Promise<StepwisePlan> {
  const asked = new Set<string>();
  const gone = new Set<string>();
  const skipped: RestorePlan['skipped'] = [];
  let stepsRead = 0;
  for await (const { step, copies } of steps) {
    stepsRead += 1;
    const fresh = new Set<string>();
    for (const copy of copies) if (copy.holder !== undefined && !asked.has(copy.holder)) fresh.add(copy.holder);
    if (fresh.size > 0) {
      for (const holder of fresh) asked.add(holder);
      for (const holder of await lost([...fresh])) gone.add(holder);
    }
    const planned = planStep(copies, target, gone);
    if ('sources' in planned) return { plan: { step, sources: planned.sources, skipped }, stepsRead };
    skipped.push({ step, missingRank: planned.missingRank });
    await nextTurn();
  }
  return { plan: undefined, stepsRead };
}
