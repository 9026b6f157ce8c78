import { InputError } from '../core/errors.js';
import { PARALLEL_DIMS, type ParallelDim, type Topology } from '../core/topology.js';
import { median } from './slowdown-tracker.js';

/**
 * Cross-group comparison (Greyhound §4.3, "Profiling"): parallel groups that do identical work
 * form a comparable cluster; a group whose time exceeds its cluster's median by more than 10 %
 * holds a straggler. Greyhound compares the DP all-reduce groups of Figure 9; we compare three
 * kinds of group, whose intersection names the slow rank:
 *
 * - `dp-replica`: the ranks of one model replica (same dp coordinate) against every replica —
 *   the groups S2 rebalances micro-batches between (§5.2).
 * - `pp-stage`: one pipeline stage of one replica (same dp and pp) against the same stage of the
 *   other replicas (the first and last stages carry extra layers, so stages are only compared
 *   with themselves).
 * - `dp-group`: one DP communication group (same coordinates except dp: Figure 9's AR_i) against
 *   every DP group.
 * Without a topology each rank is its own group (`rank`) and the cluster is the whole job.
 *
 * A synchronous group runs at its slowest member's pace, so a group's time is the largest of
 * its members' times. Members without data are left out; groups without any are skipped.
 */

export type GroupKind = 'rank' | 'dp-replica' | 'pp-stage' | 'dp-group';

export interface SlowGroup {
  readonly kind: GroupKind;
  /** The coordinates shared by the group's ranks (for `rank`, the rank). */
  readonly index: Readonly<Partial<Record<ParallelDim | 'rank', number>>>;
  /** Ranks in the group that had data. */
  readonly size: number;
  /** The member with the largest time. */
  readonly slowestRank: number;
  /** The group's time: its slowest member's median iteration seconds. */
  readonly medianSeconds: number;
  /** The median of the group times in the comparable cluster. */
  readonly clusterMedianSeconds: number;
  /** medianSeconds / clusterMedianSeconds. */
  readonly ratio: number;
}

export interface CrossGroupOptions {
  /** A group is degraded when it exceeds the cluster median by more than this: 10 % (§4.3). */
  readonly threshold?: number;
}

interface KindDefinition {
  readonly kind: GroupKind;
  /** Coordinates that identify a group. */
  readonly groupBy: readonly ParallelDim[];
  /** Coordinates that identify the group's comparable cluster. */
  readonly clusterBy: readonly ParallelDim[];
  /** Dimensions that must have more than one coordinate for the kind to mean anything. */
  readonly needs: readonly ParallelDim[];
}

const KINDS: readonly KindDefinition[] = [
  { kind: 'dp-replica', groupBy: ['dp'], clusterBy: [], needs: ['dp'] },
  { kind: 'pp-stage', groupBy: ['dp', 'pp'], clusterBy: ['pp'], needs: ['dp', 'pp'] },
  { kind: 'dp-group', groupBy: PARALLEL_DIMS.filter((dim) => dim !== 'dp'), clusterBy: [], needs: ['dp'] },
];

interface GroupTally {
  readonly index: Partial<Record<ParallelDim | 'rank', number>>;
  size: number;
  slowestRank: number;
  seconds: number;
}

/**
 * Degraded groups, by kind then by ratio (largest first). `rankSeconds` maps a rank to its
 * current time (e.g. its median iteration seconds over a recent window).
 */
export function compareGroups(rankSeconds: ReadonlyMap<number, number>, topology?: Topology, options: CrossGroupOptions = {}): SlowGroup[] {
  const threshold = options.threshold ?? 0.1;
  if (!(threshold > 0)) throw new InputError('threshold must be > 0', 'threshold');
  for (const [rank, seconds] of rankSeconds) {
    if (!(seconds > 0) || !Number.isFinite(seconds)) throw new InputError(`rank ${rank}: seconds must be a positive finite number`, 'rankSeconds');
  }
  if (!topology) {
    const clusters = new Map<string, GroupTally[]>([
      ['job', [...rankSeconds].map(([rank, seconds]) => ({ index: { rank }, size: 1, slowestRank: rank, seconds }))],
    ]);
    return degraded('rank', clusters, threshold);
  }
  const result: SlowGroup[] = [];
  for (const definition of KINDS) {
    if (!definition.needs.every((dim) => distinct(topology, dim) > 1)) continue;
    result.push(...degraded(definition.kind, tally(definition, rankSeconds, topology), threshold));
  }
  return result;
}

function tally(definition: KindDefinition, rankSeconds: ReadonlyMap<number, number>, topology: Topology): Map<string, GroupTally[]> {
  const groups = new Map<string, { cluster: string; tally: GroupTally }>();
  for (const [rank, seconds] of rankSeconds) {
    const { coords } = topology.placement(rank);
    const key = definition.groupBy.map((dim) => coords[dim]).join(',');
    let entry = groups.get(key);
    if (!entry) {
      const index: Partial<Record<ParallelDim, number>> = {};
      for (const dim of definition.groupBy) index[dim] = coords[dim];
      entry = { cluster: definition.clusterBy.map((dim) => coords[dim]).join(','), tally: { index, size: 0, slowestRank: rank, seconds: 0 } };
      groups.set(key, entry);
    }
    const { tally: group } = entry;
    group.size += 1;
    if (seconds > group.seconds || (seconds === group.seconds && rank < group.slowestRank)) {
      group.seconds = seconds;
      group.slowestRank = rank;
    }
  }
  const clusters = new Map<string, GroupTally[]>();
  for (const { cluster, tally: group } of groups.values()) {
    const members = clusters.get(cluster) ?? [];
    members.push(group);
    clusters.set(cluster, members);
  }
  return clusters;
}

function degraded(kind: GroupKind, clusters: ReadonlyMap<string, readonly GroupTally[]>, threshold: number): SlowGroup[] {
  const slow: SlowGroup[] = [];
  for (const groups of clusters.values()) {
    if (groups.length < 2) continue;
    const clusterMedianSeconds = median(groups.map((group) => group.seconds));
    for (const group of groups) {
      // Greyhound §4.3: degraded when the time exceeds the median by over 10 %.
      if (group.seconds > clusterMedianSeconds * (1 + threshold)) {
        slow.push({
          kind,
          index: group.index,
          size: group.size,
          slowestRank: group.slowestRank,
          medianSeconds: group.seconds,
          clusterMedianSeconds,
          ratio: group.seconds / clusterMedianSeconds,
        });
      }
    }
  }
  return slow.sort((a, b) => b.ratio - a.ratio || a.slowestRank - b.slowestRank);
}

function distinct(topology: Topology, dim: ParallelDim): number {
  return new Set(topology.ranks.map((placement) => placement.coords[dim])).size;
}
