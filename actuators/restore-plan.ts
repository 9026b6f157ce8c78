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
 * plans a step at a time as it reads it in chunks, giving the event loop a turn after each chunk
 * (planRestoreByStep).
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
 * One step's plan, fed its copies in one go or in chunks: each rank's cheapest surviving copy, or
 * the first rank without one. The first copy seen wins a tie, as the sort of the earlier planner
 * kept it. `lost` is read as each chunk is added.
 */
export class StepPlan {
  // Each rank's cheapest copy so far, by rank: no object per copy, so a big step makes no garbage.
  private readonly cheapest: (CheckpointShard | undefined)[];
  private readonly cheapestCost: Uint8Array;

  constructor(
    private readonly target: RestoreTarget,
    private readonly lost: ReadonlySet<string>,
  ) {
    this.cheapest = new Array<CheckpointShard | undefined>(target.ranks);
    this.cheapestCost = new Uint8Array(target.ranks);
  }

  add(copies: readonly CheckpointShard[]): void {
    for (const copy of copies) {
      // A rank the job does not have (a copy kept before ranks were checked) can never be loaded.
      if (copy.rank >= this.target.ranks || !survives(copy, this.lost)) continue;
      const price = cost(copy, copy.holder !== undefined && copy.holder === this.target.rankNodes.get(copy.rank));
      if (this.cheapest[copy.rank] === undefined || price < (this.cheapestCost[copy.rank] as number)) {
        this.cheapest[copy.rank] = copy;
        this.cheapestCost[copy.rank] = price;
      }
    }
  }

  finish(): { readonly sources: RankSource[] } | { readonly missingRank: number } {
    const sources: RankSource[] = [];
    for (let rank = 0; rank < this.target.ranks; rank += 1) {
      const chosen = this.cheapest[rank];
      if (chosen === undefined) return { missingRank: rank };
      sources.push({ rank, tier: chosen.tier, holder: chosen.holder, local: chosen.holder !== undefined && chosen.holder === this.target.rankNodes.get(rank) });
    }
    return { sources };
  }
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
    const plan = new StepPlan(options, options.evicted);
    plan.add(byStep.get(step) ?? []);
    const planned = plan.finish();
    if ('sources' in planned) return { step, sources: planned.sources, skipped };
    skipped.push({ step, missingRank: planned.missingRank });
  }
  return undefined;
}

/**
 * Copies of one checkpoint step, as the job store reads them: newest step first, a big step in
 * several chunks one after another.
 */
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
 * The same plan over steps read newest first, in chunks, stopping at the first complete step.
 * `lost` is asked once for each holder not asked before (the controller asks its backend, or
 * takes the caller's list of evicted nodes) and answers which of them lost their copies. The
 * event loop gets a turn after each chunk.
 */
export async function planRestoreByStep(
  chunks: AsyncIterable<StepCopies>,
  target: RestoreTarget,
  lost: (holders: readonly string[]) => Promise<Iterable<string>>,
): Promise<StepwisePlan> {
  const asked = new Set<string>();
  const gone = new Set<string>();
  const skipped: RestorePlan['skipped'] = [];
  let stepsRead = 0;
  let current: { readonly step: number; readonly plan: StepPlan } | undefined;
  const finish = (): RestorePlan | undefined => {
    if (current === undefined) return undefined;
    const planned = current.plan.finish();
    if ('sources' in planned) return { step: current.step, sources: planned.sources, skipped };
    skipped.push({ step: current.step, missingRank: planned.missingRank });
    return undefined;
  };
  for await (const { step, copies } of chunks) {
    if (current?.step !== step) {
      const plan = finish();
      if (plan !== undefined) return { plan, stepsRead };
      current = { step, plan: new StepPlan(target, gone) };
      stepsRead += 1;
    }
    const fresh = new Set<string>();
    for (const copy of copies) if (copy.holder !== undefined && !asked.has(copy.holder)) fresh.add(copy.holder);
    if (fresh.size > 0) {
      for (const holder of fresh) asked.add(holder);
      for (const holder of await lost([...fresh])) gone.add(holder);
    }
    current.plan.add(copies);
    await nextTurn();
  }
  return { plan: finish(), stepsRead };
}
