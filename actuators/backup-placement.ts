import { InputError } from '../core/errors.js';
import type { Topology } from '../core/topology.js';

/**
 * Where each rank's checkpoint shard keeps its in-memory backups.
 *
 * ByteRobust §6.3 (Fig. 9): aggregation analysis can over-evict a whole parallel group, so a
 * rank's backups must live outside its own TP, PP and DP groups — at machine level, on nodes
 * that host none of those groups' ranks. DeadPool §V-C adds that the k replicas should spread
 * across racks / switches, so one switch failure cannot take a shard and all its copies.
 * Where the topology leaves no such node (a single parallel group, as with ZeRO), the planner
 * falls back, as ByteRobust does, to neighbouring machines, and says so.
 */

export interface BackupPlacement {
  readonly rank: number;
  /** Ranks whose nodes hold this rank's backups. */
  readonly holders: number[];
  /** How strict the placement could be: outside every group of the rank, or a fallback. */
  readonly level: 'outside-groups' | 'other-node' | 'none';
}

export interface BackupPlan {
  readonly placements: BackupPlacement[];
  /** Upper bound (Harris–FKG) on losing some shard and every copy of it; see lossProbability(). */
  readonly lossProbability?: number;
  readonly perShardLossProbability?: number;
  readonly replicas: number;
  readonly fallbacks: number;
}

/** Nodes that over-eviction of `rank`'s TP, PP or DP group could take down. */
function conflictNodes(topology: Topology, rank: number): Set<string> {
  const ranks = [...topology.group('tp', rank), ...topology.group('pp', rank), ...topology.group('dp', rank)];
  return new Set(topology.nodesOf(ranks));
}

export function planBackups(
  topology: Topology,
  options: { replicas?: number; racks?: Readonly<Record<string, string>>; nodeFailureRate?: number } = {},
): BackupPlan {
  const replicas = options.replicas ?? 1;
  if (!Number.isInteger(replicas) || replicas < 1) throw new InputError('replicas must be a whole number of at least 1', 'replicas');
  const racks = options.racks ?? {};
  const rackOf = (node: string): string => racks[node] ?? `node:${node}`;
  const ranks = topology.ranks;
  // How many backups each node already holds, to spread memory use evenly.
  const load = new Map<string, number>();
  let fallbacks = 0;

  const placements = ranks.map(({ rank, node }) => {
    const conflicts = conflictNodes(topology, rank);
    const candidates = ranks.filter((other) => other.node !== node);
    const strict = candidates.filter((other) => !conflicts.has(other.node));
    const pool = strict.length > 0 ? strict : candidates;
    const level: BackupPlacement['level'] = pool.length === 0 ? 'none' : strict.length > 0 ? 'outside-groups' : 'other-node';
    if (level !== 'outside-groups') fallbacks += 1;

    const holders: number[] = [];
    const usedNodes = new Set<string>([node]);
    const usedRacks = new Set<string>([rackOf(node)]);
    for (let copy = 0; copy < replicas; copy += 1) {
      // Prefer a new rack, then a new node; among those the least loaded node, then the
      // nearest rank (a deterministic order that pairs ranks like Fig. 9's 8,9 ↔ 2,3).
      const options = pool.filter((other) => !usedNodes.has(other.node));
      if (options.length === 0) break;
      options.sort((a, b) => {
        const rackA = usedRacks.has(rackOf(a.node)) ? 1 : 0;
        const rackB = usedRacks.has(rackOf(b.node)) ? 1 : 0;
        if (rackA !== rackB) return rackA - rackB;
        const loadDelta = (load.get(a.node) ?? 0) - (load.get(b.node) ?? 0);
        if (loadDelta !== 0) return loadDelta;
        return Math.abs(a.rank - rank) - Math.abs(b.rank - rank) || a.rank - b.rank;
      });
      const chosen = options[0];
      if (!chosen) break;
      holders.push(chosen.rank);
      usedNodes.add(chosen.node);
      usedRacks.add(rackOf(chosen.node));
      load.set(chosen.node, (load.get(chosen.node) ?? 0) + 1);
    }
    return { rank, holders, level };
  });

  rebalance(topology, placements, load, rackOf);
  const plan: BackupPlan = { placements, replicas, fallbacks };
  if (options.nodeFailureRate === undefined) return plan;
  return { ...plan, ...lossProbability(topology, placements, options.nodeFailureRate) };
}

/**
 * Greedy placement can leave one node holding two backups more than another. Move single
 * backups from the most to the least loaded node while the move keeps every rule (outside the
 * rank's groups, a node and rack not already holding that shard), until the spread is at most one.
 */
function rebalance(
  topology: Topology,
  placements: { rank: number; holders: number[]; level: BackupPlacement['level'] }[],
  load: Map<string, number>,
  rackOf: (node: string) => string,
): void {
  const nodes = [...new Set(topology.ranks.map((placement) => placement.node))];
  for (const node of nodes) if (!load.has(node)) load.set(node, 0);
  for (let moves = 0; moves < topology.ranks.length * 4; moves += 1) {
    const sorted = [...load].sort((a, b) => a[1] - b[1]);
    const [lightest, lightLoad] = sorted[0] ?? ['', 0];
    const [heaviest, heavyLoad] = sorted.at(-1) ?? ['', 0];
    if (heavyLoad - lightLoad <= 1) return;
    const receiver = topology.ranks.find((placement) => placement.node === lightest);
    if (!receiver) return;
    const movable = placements.find(({ rank, holders, level }) => {
      const own = topology.placement(rank).node;
      if (own === lightest || !holders.some((holder) => topology.placement(holder).node === heaviest)) return false;
      if (level === 'outside-groups' && conflictNodes(topology, rank).has(lightest)) return false;
      const others = holders.filter((holder) => topology.placement(holder).node !== heaviest).map((holder) => topology.placement(holder).node);
      if (others.includes(lightest)) return false;
      const usedRacks = new Set([own, ...others].map(rackOf));
      // Moving must not put two copies (or a copy and the original) on one rack that were apart.
      return !usedRacks.has(rackOf(lightest)) || usedRacks.has(rackOf(heaviest));
    });
    if (!movable) return;
    const index = movable.holders.findIndex((holder) => topology.placement(holder).node === heaviest);
    movable.holders[index] = receiver.rank;
    load.set(heaviest, heavyLoad - 1);
    load.set(lightest, lightLoad + 1);
  }
}

/**
 * Probability of losing checkpoint state for good when each node fails independently with
 * probability p (over one checkpoint interval, say) and a failed node's rank groups are
 * over-evicted with it. A shard is lost when its own node goes and every holder is gone too —
 * failed itself, or evicted because one of its groups' nodes failed. Per shard this is exact
 * for one replica; for several it multiplies the holders' losses as if independent, slightly
 * low when their groups share nodes. The job loses its checkpoint when any shard is lost; those
 * events all grow with the set of failed nodes, so (Harris–FKG) the job's loss probability is at
 * most 1 − Π(1 − shard loss), which is what is reported.
 */
export function lossProbability(
  topology: Topology,
  placements: readonly BackupPlacement[],
  nodeFailureRate: number,
): { lossProbability: number; perShardLossProbability: number } {
  if (!(nodeFailureRate >= 0 && nodeFailureRate <= 1)) throw new InputError('node failure rate must be a probability between 0 and 1', 'nodeFailureRate');
  const p = nodeFailureRate;
  let logSurvive = 0;
  let worstShard = 0;
  for (const placement of placements) {
    const own = topology.placement(placement.rank).node;
    // A holder is lost if its node fails or a node of its own groups fails and drags it along
    // (first order: only the holder's node and the rank's own node are treated exactly).
    const holderLoss = placement.holders.map((holder) => {
      const exposed = conflictNodes(topology, holder);
      exposed.delete(own);
      return 1 - (1 - p) ** exposed.size;
    });
    const shardLoss = placement.holders.length === 0 ? p : p * holderLoss.reduce((product, q) => product * q, 1);
    worstShard = Math.max(worstShard, shardLoss);
    logSurvive += Math.log1p(-Math.min(shardLoss, 1 - 1e-16));
  }
  return { lossProbability: 1 - Math.exp(logSurvive), perShardLossProbability: worstShard };
}
