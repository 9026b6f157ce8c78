import type { CheckpointShard, CheckpointTier } from '../core/checkpoint.js';

/**
 * Restore planning: after evictions, which checkpoint step can the job resume from, and where
 * does each rank load its shard? The newest step for which every rank still has a copy that
 * survived — a remote copy always does, a copy held by a node survives unless that node was
 * evicted — wins (ByteRobust §6.3: local and peer in-memory backups make every-step
 * checkpoints usable without fetching from remote storage).
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

/**
 * Cost of loading a copy, lowest first: the rank's own GPU, host memory and disk; then memory on
 * another surviving node; then another node's disk; remote storage last.
 */
function cost(shard: CheckpointShard, local: boolean): number {
  if (shard.tier === 'remote') return 5;
  if (local) return { gpu: 0, host: 1, disk: 2, peer: 1 }[shard.tier];
  return shard.tier === 'disk' ? 4 : 3;
}

/**
 * @param rankNodes where each rank runs after the restart (evicted ranks on their standbys).
 * @returns undefined when no step is complete.
 */
export function planRestore(
  shards: readonly CheckpointShard[],
  options: { ranks: number; evicted: ReadonlySet<string>; rankNodes: ReadonlyMap<number, string> },
): RestorePlan | undefined {
  const byStep = new Map<number, CheckpointShard[]>();
  for (const shard of shards) {
    const survives = shard.tier === 'remote' || (shard.holder !== undefined && !options.evicted.has(shard.holder));
    if (!survives) continue;
    byStep.set(shard.step, [...(byStep.get(shard.step) ?? []), shard]);
  }
  const allSteps = [...new Set(shards.map((shard) => shard.step))].sort((a, b) => b - a);
  const skipped: RestorePlan['skipped'] = [];
  for (const step of allSteps) {
    const copies = byStep.get(step) ?? [];
    const sources: RankSource[] = [];
    let missing: number | undefined;
    for (let rank = 0; rank < options.ranks; rank += 1) {
      const node = options.rankNodes.get(rank);
      const best = copies
        .filter((copy) => copy.rank === rank)
        .map((copy) => ({ copy, local: copy.holder !== undefined && copy.holder === node }))
        .sort((a, b) => cost(a.copy, a.local) - cost(b.copy, b.local))[0];
      if (!best) {
        missing = rank;
        break;
      }
      sources.push({ rank, tier: best.copy.tier, holder: best.copy.holder, local: best.local });
    }
    if (missing === undefined) return { step, sources, skipped };
    skipped.push({ step, missingRank: missing });
  }
  return undefined;
}
