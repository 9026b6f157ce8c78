import { createHash } from 'node:crypto';
import { PARALLEL_DIMS, type ParallelDim, type RankPlacement, type Topology } from '../../core/topology.js';
import { parseStackDump } from './faulthandler.js';
import { normaliseFrame, selectTrainingThread, type PySpyFrame } from './pyspy.js';

/**
 * Stack-trace aggregation (ByteRobust §5.1): compare the training thread's stack of every rank,
 * call the dominant stacks healthy and the rest outliers, find the parallel group the outliers
 * share and over-evict its machines rather than chase the exact root cause. Pure: text and a
 * Topology in, a verdict out.
 */

export { normaliseFrame, normaliseModulePath, parsePySpyDump, selectTrainingThread } from './pyspy.js';
export { isFaulthandlerDump, parseFaulthandlerDump, parseStackDump } from './faulthandler.js';
export type { PySpyFrame, PySpyParse, PySpyProcess, PySpyThread, TrainingThread } from './pyspy.js';

export type SuspectKind = ParallelDim | 'node';

export interface StackGroup {
  /** First 12 hex digits of the SHA-1 of the frames joined by newlines: stable across runs. */
  readonly signature: string;
  /** Normalised frames, innermost (top) first. */
  readonly frames: readonly string[];
  readonly ranks: readonly number[];
  readonly healthy: boolean;
}

export interface SuspectGroup {
  readonly kind: SuspectKind;
  /** The parallel group as the topology defines it (for `node`: the ranks on that node). */
  readonly ranks: readonly number[];
  readonly nodes: readonly string[];
  /** Outlier ranks that sit on these nodes. */
  readonly coveredOutliers: number;
}

export interface StackAggregation {
  /** Largest first; equal sizes in frame order. A stack can appear twice, healthy and not (see aggregateRankStacks). */
  readonly groups: readonly StackGroup[];
  /** Ranks in outlier stack groups, plus missing ranks and external outliers when they count (see `reason`). */
  readonly outlierRanks: readonly number[];
  readonly suspectGroup: SuspectGroup | null;
  /** Nodes to over-evict: the suspect group's machines. */
  readonly evict: readonly string[];
  /** Every rank on the evicted nodes: what stops when they go. */
  readonly evictedRanks: readonly number[];
  /** Ranks of the topology with no usable stack: no dump, or a dump without a readable thread. */
  readonly missingRanks: readonly number[];
  /** Ranks that had a dump but no thread with frames in it (a subset of missingRanks). */
  readonly unreadableRanks: readonly number[];
  /** Outliers named by other evidence (e.g. the NCCL flight recorder), as given. */
  readonly externalOutlierRanks: readonly number[];
  /** Outliers not on the suspect group's nodes: a second fault, or noise. */
  readonly uncoveredOutlierRanks: readonly number[];
  /** Dump lines that were neither header nor frame, over all ranks. */
  readonly skippedLines: number;
  readonly reason: string;
}

export interface RankStacks {
  /** Normalised frames of each rank's training thread, innermost first. */
  readonly stacks: ReadonlyMap<number, readonly string[]>;
  readonly unreadableRanks: readonly number[];
  readonly skippedLines: number;
}

export interface AggregateOptions {
  /** Ranks other evidence already names as behind; they join the outliers. */
  readonly externalOutliers?: readonly number[];
  readonly unreadableRanks?: readonly number[];
  readonly skippedLines?: number;
}

/** Step 1 of §5.1 on each rank's py-spy or faulthandler text: pick the training thread, normalise its frames. */
export function stacksFromDumps(dumps: ReadonlyMap<number, string>): RankStacks {
  // The same frames recur on every rank: normalise each distinct (file, function) once, and
  // first try the previous rank's frame at the same depth (a string compare, no hashing).
  const byFile = new Map<string, Map<string, string | null>>();
  let previousRaw: readonly PySpyFrame[] = [];
  let previousNormalised: Array<string | null> = [];
  const stacks = new Map<number, readonly string[]>();
  const unreadableRanks: number[] = [];
  let skippedLines = 0;
  for (const [rank, text] of dumps) {
    const parse = parseStackDump(text);
    skippedLines += parse.skippedLines;
    const raw = selectTrainingThread(parse)?.thread.frames ?? [];
    const normalisedRaw: Array<string | null> = [];
    const frames: string[] = [];
    raw.forEach((frame, depth) => {
      const before = previousRaw[depth];
      let normalised: string | null | undefined;
      if (before !== undefined && before.file === frame.file && before.function === frame.function) normalised = previousNormalised[depth];
      if (normalised === undefined) {
        let byFunction = byFile.get(frame.file);
        if (!byFunction) byFile.set(frame.file, (byFunction = new Map()));
        normalised = byFunction.get(frame.function);
        if (normalised === undefined) byFunction.set(frame.function, (normalised = normaliseFrame(frame)));
      }
      normalisedRaw.push(normalised);
      if (normalised !== null) frames.push(normalised);
    });
    previousRaw = raw;
    previousNormalised = normalisedRaw;
    if (frames.length === 0) unreadableRanks.push(rank);
    else stacks.set(rank, frames);
  }
  return { stacks, unreadableRanks: unreadableRanks.sort((a, b) => a - b), skippedLines };
}

/** The whole of §5.1 from py-spy or faulthandler text per rank. */
export function aggregateStacks(
  dumps: ReadonlyMap<number, string>,
  topology: Topology,
  options: Pick<AggregateOptions, 'externalOutliers'> = {},
): StackAggregation {
  const { stacks, unreadableRanks, skippedLines } = stacksFromDumps(dumps);
  for (const rank of unreadableRanks) topology.placement(rank);
  return aggregateRankStacks(stacks, topology, { ...options, unreadableRanks, skippedLines });
}

/**
 * Steps 2 and 3 of §5.1 on normalised stacks.
 *
 * Healthy stacks: the paper calls the dominant groups healthy, assuming most healthy machines
 * show the same stack under a single implicit failure. Ranks of different pipeline stages run
 * different code (the first stage embeds, the last computes the loss), so each rank is judged
 * against the ranks of its own stage, its "DP×TP group" in the words of §5.2 (see dominantStacks
 * for the rule; with PP=1 the stage is the whole job). A stack seen healthy in one stage and as
 * an outlier in another is listed twice, once each way.
 *
 * Missing ranks (no usable stack) are suspicious: a process py-spy cannot read while the rest
 * hangs is a classic culprit. They count as outliers while the ranks with a stack are a strict
 * majority of the job; otherwise the tracer itself failed and they are only reported.
 */
export function aggregateRankStacks(stacks: ReadonlyMap<number, readonly string[]>, topology: Topology, options: AggregateOptions = {}): StackAggregation {
  // Distinct stacks, found by a hash over interned frame numbers and confirmed frame by frame.
  const frameIds = new Map<string, number>();
  const byHash = new Map<number, DistinctStack[]>();
  const distinct: DistinctStack[] = [];
  const stageCounts = new Map<number, Map<DistinctStack, number>>();
  const rankStacks: Array<[number, DistinctStack, number]> = [];
  for (const [rank, frames] of stacks) {
    const stage = topology.placement(rank).coords.pp;
    let hash = frames.length;
    for (const frame of frames) {
      let id = frameIds.get(frame);
      if (id === undefined) frameIds.set(frame, (id = frameIds.size));
      hash = (Math.imul(hash, 0x01000193) ^ id) | 0;
    }
    let bucket = byHash.get(hash);
    if (!bucket) byHash.set(hash, (bucket = []));
    let stack = bucket.find((candidate) => compareFrames(candidate.frames, frames) === 0);
    if (!stack) {
      stack = { frames, count: 0, healthy: [], outliers: [] };
      bucket.push(stack);
      distinct.push(stack);
    }
    stack.count += 1;
    let counts = stageCounts.get(stage);
    if (!counts) stageCounts.set(stage, (counts = new Map()));
    counts.set(stack, (counts.get(stack) ?? 0) + 1);
    rankStacks.push([rank, stack, stage]);
  }
  const dominant = new Map<number, Set<DistinctStack>>();
  for (const [stage, counts] of stageCounts) dominant.set(stage, dominantStacks(counts));
  for (const [rank, stack, stage] of rankStacks) (dominant.get(stage)?.has(stack) ? stack.healthy : stack.outliers).push(rank);

  const groups: StackGroup[] = [];
  for (const { frames, healthy, outliers } of distinct) {
    const signature = createHash('sha1').update(frames.join('\n')).digest('hex').slice(0, 12);
    if (healthy.length > 0) groups.push({ signature, frames, ranks: healthy.sort((a, b) => a - b), healthy: true });
    if (outliers.length > 0) groups.push({ signature, frames, ranks: outliers.sort((a, b) => a - b), healthy: false });
  }
  groups.sort((a, b) => b.ranks.length - a.ranks.length || compareFrames(a.frames, b.frames) || Number(b.healthy) - Number(a.healthy));
  const traced = stacks.size;

  const world = topology.ranks.length;
  const missingRanks = topology.ranks.filter((placement) => !stacks.has(placement.rank)).map((placement) => placement.rank);
  const missingCount = traced * 2 > world;
  const externalOutlierRanks = [...new Set(options.externalOutliers ?? [])].sort((a, b) => a - b);
  for (const rank of externalOutlierRanks) topology.placement(rank);

  const outliers = new Set<number>(externalOutlierRanks);
  for (const group of groups) if (!group.healthy) for (const rank of group.ranks) outliers.add(rank);
  if (missingCount) for (const rank of missingRanks) outliers.add(rank);
  const outlierRanks = [...outliers].sort((a, b) => a - b);

  const suspectGroup = findSuspectGroup(outlierRanks, topology);
  const evict = suspectGroup?.nodes ?? [];
  const evictedNodes = new Set(evict);
  const evictedRanks = topology.ranks.filter((placement) => evictedNodes.has(placement.node)).map((placement) => placement.rank);
  const uncoveredOutlierRanks = outlierRanks.filter((rank) => !evictedNodes.has(topology.placement(rank).node));

  return {
    groups,
    outlierRanks,
    suspectGroup,
    evict,
    evictedRanks,
    missingRanks,
    unreadableRanks: options.unreadableRanks ?? [],
    externalOutlierRanks,
    uncoveredOutlierRanks,
    skippedLines: options.skippedLines ?? 0,
    reason: explain({ groups, traced, world, missingRanks, missingCount, outlierRanks, suspectGroup, uncoveredOutlierRanks }),
  };
}

/**
 * The healthy stacks of one stage: most common first (in the stage, then in the whole job),
 * taken until they hold at least half of the stage's ranks, plus any stack that ties the last
 * one taken on both counts. So outliers are at most half of a stage; a stage split in two
 * halves keeps the half whose stack the rest of the job shares; and a split that nothing
 * decides leaves both halves healthy rather than picking one at random.
 */
function dominantStacks(counts: ReadonlyMap<DistinctStack, number>): Set<DistinctStack> {
  let total = 0;
  for (const count of counts.values()) total += count;
  const ordered = [...counts].sort(([a, inStageA], [b, inStageB]) => inStageB - inStageA || b.count - a.count);
  const healthy = new Set<DistinctStack>();
  let taken = 0;
  let last: [DistinctStack, number] | null = null;
  for (const entry of ordered) {
    const ties = last !== null && entry[1] === last[1] && entry[0].count === last[0].count;
    if (taken * 2 >= total && !ties) break;
    healthy.add(entry[0]);
    taken += entry[1];
    last = entry;
  }
  return healthy;
}

interface DistinctStack {
  readonly frames: readonly string[];
  /** Ranks with this stack in the whole job. */
  count: number;
  readonly healthy: number[];
  readonly outliers: number[];
}

function compareFrames(a: readonly string[], b: readonly string[]): number {
  for (let index = 0; index < Math.min(a.length, b.length); index += 1) {
    const left = a[index] as string;
    const right = b[index] as string;
    if (left !== right) return left < right ? -1 : 1;
  }
  return a.length - b.length;
}

/** Tie order among equally good suspects: the machine itself first, then the narrowest dimension. */
const KIND_ORDER: readonly SuspectKind[] = ['node', 'tp', 'cp', 'ep', 'dp', 'pp'];

/**
 * The fault domain to over-evict (§5.1 step 3: "find the shared parallel groups for those
 * outliers"). Candidates are each outlier's node and its TP / CP / EP / DP / PP group. Eviction
 * is per machine, so a candidate covers an outlier when the outlier runs on one of the
 * candidate's machines: in the paper's Fig. 7 (TP=2 inside a machine) the one PP group of
 * machines 12–15 thereby covers both TP ranks of every stalled machine. The best candidate
 * covers the most outliers (all of them, when some group does), then spans the fewest
 * machines, then holds the most outliers among its own ranks (so a machine with two stalled
 * GPUs is that machine, not the TP pair of one of them), then has the fewest ranks, then comes
 * first in KIND_ORDER and by lowest rank. A group holding every machine of a multi-machine job
 * is not a candidate: evicting it all isolates nothing.
 */
export function findSuspectGroup(outlierRanks: readonly number[], topology: Topology): SuspectGroup | null {
  if (outlierRanks.length === 0) return null;
  const outliers = new Set(outlierRanks);
  const outliersOnNode = new Map<string, number>();
  for (const rank of outlierRanks) {
    const node = topology.placement(rank).node;
    outliersOnNode.set(node, (outliersOnNode.get(node) ?? 0) + 1);
  }
  const jobNodes = new Set(topology.ranks.map((placement) => placement.node)).size;

  let best: Candidate | null = null;
  for (const [kind, members] of candidateGroups(outlierRanks, topology)) {
    for (const ranks of members) {
      const nodes = topology.nodesOf(ranks);
      if (kind !== 'node' && jobNodes > 1 && nodes.length === jobNodes) continue;
      const covered = nodes.reduce((sum, node) => sum + (outliersOnNode.get(node) ?? 0), 0);
      const own = ranks.reduce((sum, rank) => sum + (outliers.has(rank) ? 1 : 0), 0);
      const candidate: Candidate = { kind, ranks, nodes, covered, own };
      if (best === null || compareCandidates(candidate, best) < 0) best = candidate;
    }
  }
  if (best === null) return null;
  const ranks = best.kind === 'node' ? [...best.ranks] : topology.group(best.kind, best.ranks[0] as number);
  return { kind: best.kind, ranks, nodes: topology.nodesOf(ranks), coveredOutliers: best.covered };
}

interface Candidate {
  readonly kind: SuspectKind;
  readonly ranks: readonly number[];
  readonly nodes: readonly string[];
  readonly covered: number;
  /** Outliers among the group's own ranks. */
  readonly own: number;
}

/** Negative when `a` is the better suspect. */
function compareCandidates(a: Candidate, b: Candidate): number {
  return (
    b.covered - a.covered ||
    a.nodes.length - b.nodes.length ||
    b.own - a.own ||
    a.ranks.length - b.ranks.length ||
    KIND_ORDER.indexOf(a.kind) - KIND_ORDER.indexOf(b.kind) ||
    (a.ranks[0] as number) - (b.ranks[0] as number)
  );
}

/** Per kind, the distinct groups that hold at least one outlier, each as sorted ranks. */
function candidateGroups(outlierRanks: readonly number[], topology: Topology): Array<[SuspectKind, number[][]]> {
  const outliers = new Set(outlierRanks);
  const result: Array<[SuspectKind, number[][]]> = [];
  const collect = <K>(kind: SuspectKind, keyOf: (placement: RankPlacement) => K): void => {
    const members = new Map<K, number[]>();
    const touched = new Set<K>();
    for (const placement of topology.ranks) {
      const key = keyOf(placement);
      const list = members.get(key);
      if (list) list.push(placement.rank);
      else members.set(key, [placement.rank]);
      if (outliers.has(placement.rank)) touched.add(key);
    }
    const groups = [...touched].map((key) => members.get(key) as number[]);
    if (kind === 'node' || groups.some((group) => group.length > 1)) result.push([kind, groups]);
  };
  collect('node', (placement) => placement.node);
  // A group along `dim` is the ranks equal in every other coordinate: a mixed-radix number of those.
  const sizes = PARALLEL_DIMS.map((dim) => 1 + topology.ranks.reduce((largest, placement) => Math.max(largest, placement.coords[dim]), 0));
  for (const dim of PARALLEL_DIMS) {
    collect(dim, (placement) => {
      let key = 0;
      PARALLEL_DIMS.forEach((other, index) => {
        if (other !== dim) key = key * (sizes[index] as number) + placement.coords[other];
      });
      return key;
    });
  }
  return result;
}

function explain(facts: {
  groups: readonly StackGroup[];
  traced: number;
  world: number;
  missingRanks: readonly number[];
  missingCount: boolean;
  outlierRanks: readonly number[];
  suspectGroup: SuspectGroup | null;
  uncoveredOutlierRanks: readonly number[];
}): string {
  const healthy = facts.groups.filter((group) => group.healthy);
  const healthyRanks = healthy.reduce((sum, group) => sum + group.ranks.length, 0);
  const distinct = new Set(facts.groups.map((group) => group.signature)).size;
  const parts = [
    `${facts.traced} of ${facts.world} ranks have a stack, ${distinct} distinct stack(s); ` +
      `${healthyRanks} ranks show the dominant stack(s) of their pipeline stage`,
  ];
  if (facts.missingRanks.length > 0) {
    parts.push(
      facts.missingCount
        ? `${facts.missingRanks.length} rank(s) without a stack count as outliers`
        : `${facts.missingRanks.length} rank(s) without a stack are not counted: too few ranks were traced to call them hung`,
    );
  }
  if (facts.outlierRanks.length === 0) return `${parts.join('; ')}; no outliers, nothing to evict`;
  const suspect = facts.suspectGroup;
  if (suspect === null) return `${parts.join('; ')}; ${facts.outlierRanks.length} outlier rank(s) share no group short of the whole job, nothing to evict`;
  parts.push(
    `${facts.outlierRanks.length} outlier rank(s); ${suspect.coveredOutliers} of them on the ${suspect.nodes.length} node(s) of one ${suspect.kind} group, over-evicted`,
  );
  if (facts.uncoveredOutlierRanks.length > 0) parts.push(`${facts.uncoveredOutlierRanks.length} outlier rank(s) lie outside it`);
  return parts.join('; ');
}
