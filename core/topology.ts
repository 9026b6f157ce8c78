import { z } from 'zod';
import { InputError } from './errors.js';
import { firstDuplicate, nodeNameSchema } from './names.js';
import { parseOrThrow } from './validate.js';

/**
 * Topology of one training job: every rank's node and its coordinates in each parallel
 * dimension. Parallel groups (the ranks that share a TP, PP, DP, ... group) derive from it;
 * stack aggregation and backup placement reason in those groups (ByteRobust §5, §6.3).
 */

export const PARALLEL_DIMS = ['tp', 'cp', 'ep', 'dp', 'pp'] as const;
export type ParallelDim = (typeof PARALLEL_DIMS)[number];

export type Coordinates = Record<ParallelDim, number>;

export interface RankPlacement {
  readonly rank: number;
  readonly node: string;
  readonly localRank: number;
  readonly coords: Coordinates;
}

/**
 * Most ranks a topology may have: 2^18, over twice the largest public training runs (about
 * 100k GPUs). Without a bound, sizes like dp=10^8 in a small request would allocate a rank
 * table until the process runs out of memory.
 */
export const MAX_RANKS = 262_144;

const positiveInt = z.number().int().min(1);
const coordinate = z.number().int().min(0).default(0);

/**
 * The topology file format shared by `POST /api/v1/jobs` and every CLI that takes
 * `--topology`: an explicit rank table, or parallel sizes with a Megatron order string.
 */
export const topologySpecSchema = z.union([
  z
    .object({
      ranks: z
        .array(
          z
            .object({
              rank: z.number().int().min(0),
              node: nodeNameSchema,
              /** Defaults to the rank's position among the ranks listed for its node. */
              localRank: z.number().int().min(0).optional(),
              tp: coordinate,
              cp: coordinate,
              ep: coordinate,
              dp: coordinate,
              pp: coordinate,
            })
            .strict(),
        )
        .min(1)
        .max(MAX_RANKS),
    })
    .strict(),
  z
    .object({
      nodes: z.array(nodeNameSchema).min(1).max(MAX_RANKS),
      ranksPerNode: positiveInt.max(MAX_RANKS),
      tp: positiveInt.default(1),
      cp: positiveInt.default(1),
      ep: positiveInt.default(1),
      dp: positiveInt.default(1),
      pp: positiveInt.default(1),
      /** Megatron-style order string, fastest-varying dimension first, e.g. `tp-cp-ep-dp-pp`. */
      order: z.string().default('tp-cp-ep-dp-pp'),
    })
    .strict(),
]);

export type TopologySpec = z.input<typeof topologySpecSchema>;

export class Topology {
  private constructor(readonly ranks: readonly RankPlacement[]) {}

  static from(spec: unknown): Topology {
    const parsed = parseOrThrow(topologySpecSchema, spec, 'topology');
    if ('ranks' in parsed) {
      const sorted = [...parsed.ranks].sort((a, b) => a.rank - b.rank);
      const seenOnNode = new Map<string, number>();
      const slots = new Map<string, number>();
      return new Topology(
        sorted.map((entry, index) => {
          if (entry.rank !== index) throw new InputError(`topology.ranks: rank ${index} is missing or repeated`, 'ranks');
          const position = seenOnNode.get(entry.node) ?? 0;
          seenOnNode.set(entry.node, position + 1);
          const localRank = entry.localRank ?? position;
          // Several ranks share a node, each on its own GPU: two with one local rank is a typo in the table.
          const slot = `${entry.node}/${localRank}`;
          const holder = slots.get(slot);
          if (holder !== undefined)
            throw new InputError(`topology.ranks: rank ${entry.rank} has local rank ${localRank} on ${entry.node}, as rank ${holder} does`, 'ranks');
          slots.set(slot, entry.rank);
          const { tp, cp, ep, dp, pp } = entry;
          return { rank: entry.rank, node: entry.node, localRank, coords: { tp, cp, ep, dp, pp } };
        }),
      );
    }
    const duplicate = firstDuplicate(parsed.nodes);
    if (duplicate !== undefined)
      throw new InputError(`topology.nodes.${duplicate.index}: ${duplicate.name} is listed twice (first at index ${duplicate.first})`, 'nodes');
    const order = parseOrder(parsed.order);
    const world = PARALLEL_DIMS.reduce((product, dim) => product * parsed[dim], 1);
    if (world > MAX_RANKS) throw new InputError(`topology: tp*cp*ep*dp*pp = ${world} ranks; at most ${MAX_RANKS} are supported`, 'tp');
    if (world !== parsed.nodes.length * parsed.ranksPerNode) {
      throw new InputError(`topology: tp*cp*ep*dp*pp = ${world} but nodes*ranksPerNode = ${parsed.nodes.length * parsed.ranksPerNode}`, 'tp');
    }
    const ranks: RankPlacement[] = [];
    for (let rank = 0; rank < world; rank += 1) {
      const coords = { tp: 0, cp: 0, ep: 0, dp: 0, pp: 0 };
      let rest = rank;
      for (const dim of order) {
        coords[dim] = rest % parsed[dim];
        rest = Math.floor(rest / parsed[dim]);
      }
      const node = parsed.nodes[Math.floor(rank / parsed.ranksPerNode)] as string;
      ranks.push({ rank, node, localRank: rank % parsed.ranksPerNode, coords });
    }
    return new Topology(ranks);
  }

  placement(rank: number): RankPlacement {
    const placement = this.ranks[rank];
    if (!placement) throw new InputError(`rank ${rank} is not in the topology`, 'rank');
    return placement;
  }

  /** The ranks in `rank`'s group along `dim`: all other coordinates equal. */
  group(dim: ParallelDim, rank: number): number[] {
    const self = this.placement(rank).coords;
    return this.ranks.filter((other) => PARALLEL_DIMS.every((d) => d === dim || other.coords[d] === self[d])).map((other) => other.rank);
  }

  nodesOf(ranks: readonly number[]): string[] {
    return [...new Set(ranks.map((rank) => this.placement(rank).node))];
  }
}

function parseOrder(order: string): ParallelDim[] {
  const dims = order.split('-').map((part) => part.trim().toLowerCase());
  const known = new Set<string>(PARALLEL_DIMS);
  for (const dim of dims) {
    if (!known.has(dim)) throw new InputError(`topology.order: unknown dimension "${dim}"`, 'order');
  }
  const listed = new Set(dims);
  if (listed.size !== dims.length) throw new InputError('topology.order: a dimension is repeated', 'order');
  // Dimensions left out of the order string have size 1 in practice; put them last.
  return [...(dims as ParallelDim[]), ...PARALLEL_DIMS.filter((dim) => !listed.has(dim))];
}
