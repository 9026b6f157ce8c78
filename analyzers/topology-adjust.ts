import { InputError } from '../core/errors.js';
import { PARALLEL_DIMS, type ParallelDim, type Topology } from '../core/topology.js';

/**
 * S3, "Adjust parallelism topology" (Greyhound §5.2): exchange the roles of whole nodes — every
 * rank (its coordinates, its shard of parameters and optimizer state) moves from one node to the
 * other — so that stragglers hurt less. Whole nodes keep every tensor-parallel group inside one
 * machine (footnote 3: TP stays on NVLink). Two planners:
 *
 * Straggler consolidation. Ranks of one pipeline stage work in lock-step, so a stage is as slow
 * as its slowest member however many stragglers it holds, and an iteration is slower the more
 * stages hold one (Figure 12: two stragglers in two stages 8.5 s, in one stage 8 s). Move the
 * slow nodes into the fewest PP stages, ⌈slow nodes / nodes per stage⌉; among those choices,
 * prefer interior stages (the first and last carry the embedding and the loss), then the one
 * that leaves the most slow nodes where they are. Every slow node outside the chosen stages
 * swaps with a healthy node inside them, which is the fewest moves for that choice. Optimal for
 * regular layouts (every stage spans the same number of nodes); irregular rank tables get the
 * same rules applied greedily.
 *
 * Congested link from DP to PP. Per iteration a GPU sends tens of GB for DP gradient
 * synchronisation but only O(micro-batches × activation size), tens to hundreds of MB, to its
 * pipeline neighbours. A congested link that carries DP (or any other collective) traffic hurts;
 * carrying only PP traffic it barely matters. Figure 11: the link between nodes 3 and 4 carries
 * DP; after nodes 2 and 3 exchange roles the same link joins two pipeline neighbours. The planner
 * tries every exchange of one end of the link with another node and keeps the one that leaves
 * the fewest congested links carrying heavy traffic — preferring, as in Figure 11, that the link
 * then carries PP — and never moves a node the consolidation placed.
 */

export interface NodeSwap {
  /** The two nodes exchange every rank they host. */
  readonly nodes: readonly [string, string];
  readonly reason: string;
}

export interface ConsolidationPlan {
  readonly slowNodes: string[];
  /** PP stages holding a slow node, before and after the swaps. */
  readonly stagesBefore: number[];
  readonly stagesAfter: number[];
  /** ⌈slow nodes / nodes per stage⌉ (Greyhound §5.2). */
  readonly minimumStages: number;
  readonly swaps: NodeSwap[];
  /** Why nothing could be planned, or null. */
  readonly note: string | null;
}

/** Collective traffic between two nodes: the parallel dimensions whose groups span both. */
export type LinkTraffic = ParallelDim;

export interface LinkVerdict {
  readonly link: readonly [string, string];
  readonly trafficBefore: LinkTraffic[];
  readonly trafficAfter: LinkTraffic[];
  /** Whether the link carries no heavy (non-PP) traffic after the swaps. */
  readonly relieved: boolean;
}

export interface LinkSwapPlan {
  readonly swaps: NodeSwap[];
  readonly links: LinkVerdict[];
}

export interface RankMove {
  readonly rank: number;
  readonly fromNode: string;
  readonly toNode: string;
}

/** Which node hosts which ranks; S3 plans are sequences of exchanges of these lists. */
export class NodeLayout {
  private readonly roles: Map<string, number[]>;

  constructor(
    readonly topology: Topology,
    roles?: ReadonlyMap<string, readonly number[]>,
  ) {
    this.roles = new Map();
    if (roles) {
      for (const [node, ranks] of roles) this.roles.set(node, [...ranks]);
      return;
    }
    for (const placement of [...topology.ranks].sort((a, b) => a.localRank - b.localRank || a.rank - b.rank)) {
      const ranks = this.roles.get(placement.node) ?? [];
      ranks.push(placement.rank);
      this.roles.set(placement.node, ranks);
    }
  }

  get nodes(): string[] {
    return [...this.roles.keys()];
  }

  ranksOn(node: string): readonly number[] {
    const ranks = this.roles.get(node);
    if (!ranks) throw new InputError(`node ${node} is not in the topology`, 'node');
    return ranks;
  }

  swapped(a: string, b: string): NodeLayout {
    const next = new NodeLayout(this.topology, this.roles);
    next.roles.set(a, [...this.ranksOn(b)]);
    next.roles.set(b, [...this.ranksOn(a)]);
    return next;
  }

  /** PP stages of the ranks a node hosts. */
  stagesOf(node: string): number[] {
    return [...new Set(this.ranksOn(node).map((rank) => this.topology.placement(rank).coords.pp))].sort((x, y) => x - y);
  }

  /** The dimensions whose groups join a rank on `a` with a rank on `b` (PP only between neighbours). */
  traffic(a: string, b: string): LinkTraffic[] {
    const kinds = new Set<LinkTraffic>();
    for (const left of this.ranksOn(a)) {
      const x = this.topology.placement(left).coords;
      for (const right of this.ranksOn(b)) {
        const y = this.topology.placement(right).coords;
        const differing = PARALLEL_DIMS.filter((dim) => x[dim] !== y[dim]);
        const [dim] = differing;
        if (differing.length !== 1 || dim === undefined) continue;
        if (dim === 'pp' && Math.abs(x.pp - y.pp) !== 1) continue;
        kinds.add(dim);
      }
    }
    return PARALLEL_DIMS.filter((dim) => kinds.has(dim));
  }

  /** Every rank that now runs on a different node than the topology placed it on. */
  movesFromTopology(): RankMove[] {
    const moves: RankMove[] = [];
    for (const [node, ranks] of this.roles) {
      for (const rank of ranks) {
        const fromNode = this.topology.placement(rank).node;
        if (fromNode !== node) moves.push({ rank, fromNode, toNode: node });
      }
    }
    return moves.sort((a, b) => a.rank - b.rank);
  }
}

export function planStragglerConsolidation(topology: Topology, slowRanks: readonly number[], layout = new NodeLayout(topology)): ConsolidationPlan {
  for (const rank of slowRanks) topology.placement(rank); // an unknown rank is an InputError
  const slowRankSet = new Set(slowRanks);
  const slowNodes = layout.nodes.filter((node) => layout.ranksOn(node).some((rank) => slowRankSet.has(rank)));
  const nothing = (note: string | null, minimumStages = 0): ConsolidationPlan => {
    const stages = [...new Set(slowNodes.flatMap((node) => layout.stagesOf(node)))].sort((a, b) => a - b);
    return { slowNodes, stagesBefore: stages, stagesAfter: stages, minimumStages, swaps: [], note };
  };
  if (slowNodes.length === 0) return nothing(null);
  const spanning = layout.nodes.find((node) => layout.stagesOf(node).length > 1);
  if (spanning !== undefined) return nothing(`node ${spanning} hosts ranks of several PP stages; whole-node moves cannot consolidate`);

  const stageOf = new Map(layout.nodes.map((node) => [node, layout.stagesOf(node)[0] as number]));
  const stages = [...new Set(stageOf.values())].sort((a, b) => a - b);
  const first = stages[0] as number;
  const last = stages[stages.length - 1] as number;
  const slow = new Set(slowNodes);
  const census = stages.map((stage) => {
    const nodes = layout.nodes.filter((node) => stageOf.get(node) === stage);
    return { stage, nodes, capacity: nodes.length, interior: stage !== first && stage !== last, slowInside: nodes.filter((node) => slow.has(node)).length };
  });
  const regular = new Set(census.map((entry) => entry.capacity)).size === 1;

  // Fewest stages (largest first when irregular), then interior, then the most slow nodes already in place.
  const ranked = [...census].sort(
    (a, b) => b.capacity - a.capacity || Number(b.interior) - Number(a.interior) || b.slowInside - a.slowInside || a.stage - b.stage,
  );
  const chosen: typeof census = [];
  let room = 0;
  for (const entry of ranked) {
    if (room >= slowNodes.length) break;
    chosen.push(entry);
    room += entry.capacity;
  }
  const chosenStages = new Set(chosen.map((entry) => entry.stage));
  const outside = slowNodes.filter((node) => !chosenStages.has(stageOf.get(node) as number));
  const healthyInside = chosen.flatMap((entry) => entry.nodes.filter((node) => !slow.has(node)));
  const swaps: NodeSwap[] = outside.map((node, index) => {
    const partner = healthyInside[index] as string;
    return {
      nodes: [node, partner],
      reason: `consolidate straggler node ${node} (PP stage ${stageOf.get(node)}) into PP stage ${stageOf.get(partner)}, in place of healthy node ${partner}`,
    };
  });
  const after = swaps.reduce((current, swap) => current.swapped(swap.nodes[0], swap.nodes[1]), layout);
  return {
    slowNodes,
    stagesBefore: [...new Set(slowNodes.map((node) => stageOf.get(node) as number))].sort((a, b) => a - b),
    stagesAfter: [...new Set(slowNodes.map((node) => after.stagesOf(node)[0] as number))].sort((a, b) => a - b),
    // Regular layouts: chosen.length = ⌈slow nodes / nodes per stage⌉ (§5.2).
    minimumStages: chosen.length,
    swaps,
    note: regular ? null : 'PP stages span different numbers of nodes; stages were chosen greedily, largest first',
  };
}

const isHeavy = (traffic: readonly LinkTraffic[]): boolean => traffic.some((dim) => dim !== 'pp');

export function planCongestedLinkSwaps(
  topology: Topology,
  congestedLinks: readonly (readonly [string, string])[],
  options: { readonly layout?: NodeLayout; readonly pinned?: ReadonlySet<string> } = {},
): LinkSwapPlan {
  const start = options.layout ?? new NodeLayout(topology);
  const pinned = new Set(options.pinned ?? []);
  for (const [a, b] of congestedLinks) {
    start.ranksOn(a);
    start.ranksOn(b);
    if (a === b) throw new InputError(`congested link ${a}–${b} joins a node to itself`, 'congestedLinks');
  }
  const heavyLinks = (layout: NodeLayout): number => congestedLinks.filter(([a, b]) => isHeavy(layout.traffic(a, b))).length;

  let layout = start;
  const swaps: NodeSwap[] = [];
  const moved = new Set<string>();
  for (const [a, b] of congestedLinks) {
    const traffic = layout.traffic(a, b);
    if (!isHeavy(traffic)) continue;
    const baseline = heavyLinks(layout);
    let best: { layout: NodeLayout; swap: NodeSwap; score: number[] } | null = null;
    for (const [end, other] of [
      [a, b],
      [b, a],
    ] as const) {
      if (pinned.has(end)) continue;
      for (const candidate of layout.nodes) {
        if (candidate === a || candidate === b || pinned.has(candidate)) continue;
        if (layout.ranksOn(candidate).length !== layout.ranksOn(end).length) continue;
        const next = layout.swapped(end, candidate);
        const after = next.traffic(a, b);
        const score = [heavyLinks(next), after.length === 1 && after[0] === 'pp' ? 0 : 1, Number(moved.has(end)) + Number(moved.has(candidate))];
        if (best === null || lexicographicallyLess(score, best.score)) {
          const reason = `link ${a}–${b} carries ${traffic.join('+')} traffic; exchanging ${end} and ${candidate} leaves it ${after.length === 0 ? 'unused' : `carrying ${after.join('+')}`} (next to ${other})`;
          best = { layout: next, swap: { nodes: [end, candidate], reason }, score };
        }
      }
    }
    if (best === null || (best.score[0] as number) >= baseline) continue;
    layout = best.layout;
    swaps.push(best.swap);
    for (const node of best.swap.nodes) moved.add(node);
  }
  const links = congestedLinks.map(([a, b]): LinkVerdict => {
    const trafficAfter = layout.traffic(a, b);
    return { link: [a, b], trafficBefore: start.traffic(a, b), trafficAfter, relieved: !isHeavy(trafficAfter) };
  });
  return { swaps, links };
}

function lexicographicallyLess(a: readonly number[], b: readonly number[]): boolean {
  for (let index = 0; index < a.length; index += 1) {
    if ((a[index] as number) !== (b[index] as number)) return (a[index] as number) < (b[index] as number);
  }
  return false;
}

export interface TopologyAdjustment {
  readonly consolidation: ConsolidationPlan;
  readonly links: LinkSwapPlan;
  /** Every exchange, in order: consolidation first, then the congested links. */
  readonly swaps: NodeSwap[];
  /** The resulting placement, as the ranks that change node. */
  readonly moves: RankMove[];
}

/** The whole S3 plan: consolidate the stragglers, then take congested links off DP traffic. */
export function planTopologyAdjustment(
  topology: Topology,
  input: { readonly slowRanks?: readonly number[]; readonly congestedLinks?: readonly (readonly [string, string])[] },
): TopologyAdjustment {
  const initial = new NodeLayout(topology);
  const consolidation = planStragglerConsolidation(topology, input.slowRanks ?? [], initial);
  const consolidated = consolidation.swaps.reduce((layout, swap) => layout.swapped(swap.nodes[0], swap.nodes[1]), initial);
  const links = planCongestedLinkSwaps(topology, input.congestedLinks ?? [], { layout: consolidated, pinned: new Set(consolidation.slowNodes) });
  const final = links.swaps.reduce((layout, swap) => layout.swapped(swap.nodes[0], swap.nodes[1]), consolidated);
  return { consolidation, links, swaps: [...consolidation.swaps, ...links.swaps], moves: final.movesFromTopology() };
}
