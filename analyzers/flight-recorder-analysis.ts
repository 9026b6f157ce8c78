import { z } from 'zod';

/**
 * Evidence from PyTorch's NCCL flight recorder for stack aggregation (ByteRobust §7: the
 * on-demand tracer combines py-spy with the flight recorder for NCCL timeouts). Every process
 * group numbers its collectives 1, 2, 3, … on every member, so members can be compared:
 *   - a member whose last *enqueued* collective is below its peers' never issued the next one
 *     (the peers wait in it for that member): "missing";
 *   - a member whose last *completed* collective is below its peers' has the work queued but its
 *     GPU never finished it: "stalled".
 * Both are behind; they join the stack outliers. Point-to-point traffic (pipeline send/recv) is
 * left out: its counters differ between stages by design.
 *
 * Input: each rank's dump decoded to plain JSON (the pickle that PyTorch writes, read by a
 * restricted unpickler, or the JSON form). Anything unreadable is skipped and reported.
 */

export interface MissingCollective {
  /** Process group name as in `pg_config` (the same on every rank). */
  readonly processGroup: string;
  readonly description: string;
  readonly members: readonly number[];
  /** The earliest collective sequence id that some members never enqueued. */
  readonly collectiveSeq: number;
  /** `nccl:all_to_all`, … as recorded by the first member that did enqueue it; null when no member recorded it. */
  readonly op: string | null;
  /** First input's shape, `4027x5120`. */
  readonly size: string | null;
  readonly dtype: string | null;
  readonly missingRanks: readonly number[];
}

export interface StalledCollective {
  readonly processGroup: string;
  readonly description: string;
  readonly members: readonly number[];
  /** The highest last-completed sequence id among the members. */
  readonly peersCompleted: number;
  readonly stalledRanks: readonly number[];
}

export interface FlightRecorderAnalysis {
  /** Earliest-created missing collective first: the one the others started waiting in first. */
  readonly missing: readonly MissingCollective[];
  readonly stalled: readonly StalledCollective[];
  /** Ranks in any `missing` or `stalled` finding. */
  readonly behindRanks: readonly number[];
  readonly unreadableRanks: readonly number[];
  readonly skippedEntries: number;
}

const entrySchema = z.looseObject({
  pg_id: z.union([z.number(), z.string()]),
  process_group: z.array(z.string()).min(1),
  collective_seq_id: z.number().int(),
  profiling_name: z.string().nullish(),
  input_sizes: z.array(z.array(z.number())).nullish(),
  input_dtypes: z.array(z.string()).nullish(),
  time_created_ns: z.number().nullish(),
  is_p2p: z.boolean().nullish(),
});
type Entry = z.infer<typeof entrySchema>;

const dumpSchema = z.looseObject({
  pg_config: z.record(z.string(), z.looseObject({ desc: z.string().nullish(), ranks: z.union([z.string(), z.array(z.number())]) })),
  pg_status: z
    .record(z.string(), z.looseObject({ last_enqueued_collective: z.number().nullish(), last_completed_collective: z.number().nullish() }))
    .default({}),
  entries: z.array(z.unknown()).default([]),
});

interface RankView {
  readonly groups: Map<string, { description: string; members: number[] }>;
  /** Non-p2p entries by group name and sequence id. */
  readonly entries: Map<string, Map<number, Entry>>;
  readonly p2pGroups: Set<string>;
  readonly status: Map<string, { enqueued: number | null; completed: number | null }>;
}

/** Splits the `{"rank0": {...}, "rank1": {...}}` shape into dumps by rank; other keys are ignored. */
export function splitRankKeyedDumps(value: unknown): Map<number, unknown> {
  const dumps = new Map<number, unknown>();
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return dumps;
  for (const [key, dump] of Object.entries(value)) {
    const match = /^rank(0|[1-9]\d*)$/.exec(key);
    if (match) dumps.set(Number(match[1]), dump);
  }
  return dumps;
}

export function analyzeFlightRecorder(dumps: ReadonlyMap<number, unknown>): FlightRecorderAnalysis {
  const views = new Map<number, RankView>();
  const unreadableRanks: number[] = [];
  let skippedEntries = 0;
  for (const [rank, dump] of dumps) {
    const parsed = dumpSchema.safeParse(dump);
    if (!parsed.success) {
      unreadableRanks.push(rank);
      continue;
    }
    const view = readRank(parsed.data);
    skippedEntries += view.skipped;
    views.set(rank, view.view);
  }

  const comparable = new Map<string, { description: string; members: number[] }>();
  const p2p = new Set<string>();
  for (const view of views.values()) {
    for (const name of view.p2pGroups) p2p.add(name);
    for (const name of view.entries.keys()) {
      const group = view.groups.get(name);
      if (group && !comparable.has(name)) comparable.set(name, group);
    }
  }

  const missing: Array<MissingCollective & { created: number }> = [];
  const stalled: StalledCollective[] = [];
  for (const [name, group] of [...comparable].sort(([a], [b]) => compareNames(a, b))) {
    if (p2p.has(name)) continue;
    const enqueued = new Map<number, number>();
    const completed = new Map<number, number>();
    for (const rank of group.members) {
      const view = views.get(rank);
      if (!view) continue;
      const seqs = view.entries.get(name);
      const status = view.status.get(name);
      const lastEnqueued = seqs && seqs.size > 0 ? Math.max(...seqs.keys()) : (status?.enqueued ?? null);
      if (lastEnqueued !== null) enqueued.set(rank, lastEnqueued);
      if (status?.completed !== null && status?.completed !== undefined) completed.set(rank, status.completed);
    }
    const behind = laggards(enqueued);
    if (behind.ranks.length > 0) {
      const seq = behind.lowest + 1;
      const holder = group.members.map((rank) => views.get(rank)?.entries.get(name)?.get(seq)).find((entry) => entry !== undefined);
      const shape = holder?.input_sizes?.[0];
      missing.push({
        processGroup: name,
        description: group.description,
        members: group.members,
        collectiveSeq: seq,
        op: holder?.profiling_name ?? null,
        size: shape ? shape.join('x') : null,
        dtype: holder?.input_dtypes?.[0] ?? null,
        missingRanks: behind.ranks,
        created: holder?.time_created_ns ?? Number.POSITIVE_INFINITY,
      });
    }
    const stuck = laggards(completed);
    if (stuck.ranks.length > 0) {
      stalled.push({ processGroup: name, description: group.description, members: group.members, peersCompleted: stuck.highest, stalledRanks: stuck.ranks });
    }
  }
  missing.sort((a, b) => a.created - b.created || compareNames(a.processGroup, b.processGroup));

  const behindRanks = new Set<number>();
  for (const finding of missing) for (const rank of finding.missingRanks) behindRanks.add(rank);
  for (const finding of stalled) for (const rank of finding.stalledRanks) behindRanks.add(rank);
  return {
    missing: missing.map(({ created: _created, ...finding }) => finding),
    stalled,
    behindRanks: [...behindRanks].sort((a, b) => a - b),
    unreadableRanks: unreadableRanks.sort((a, b) => a - b),
    skippedEntries,
  };
}

function laggards(values: ReadonlyMap<number, number>): { ranks: number[]; lowest: number; highest: number } {
  if (values.size < 2) return { ranks: [], lowest: 0, highest: 0 };
  const highest = Math.max(...values.values());
  const lowest = Math.min(...values.values());
  const ranks = [...values]
    .filter(([, value]) => value < highest)
    .map(([rank]) => rank)
    .sort((a, b) => a - b);
  return { ranks, lowest, highest };
}

function readRank(dump: z.infer<typeof dumpSchema>): { view: RankView; skipped: number } {
  const groups = new Map<string, { description: string; members: number[] }>();
  for (const [name, config] of Object.entries(dump.pg_config)) {
    const members = typeof config.ranks === 'string' ? (config.ranks.match(/\d+/g) ?? []).map(Number) : [...config.ranks];
    groups.set(name, { description: config.desc ?? '', members: members.sort((a, b) => a - b) });
  }
  const entries = new Map<string, Map<number, Entry>>();
  const p2pGroups = new Set<string>();
  const nameOfId = new Map<string, string>();
  let skipped = 0;
  for (const raw of dump.entries) {
    const parsed = entrySchema.safeParse(raw);
    if (!parsed.success) {
      skipped += 1;
      continue;
    }
    const entry = parsed.data;
    const name = entry.process_group[0] as string;
    nameOfId.set(String(entry.pg_id), name);
    if (entry.is_p2p) {
      p2pGroups.add(name);
      continue;
    }
    let bySeq = entries.get(name);
    if (!bySeq) entries.set(name, (bySeq = new Map()));
    bySeq.set(entry.collective_seq_id, entry);
  }
  // pg_status is keyed by the rank-local pg_id, pg_config by the global name. Entries pair the
  // two; a rank with few or no entries (a hung one) is paired by creation order instead: both
  // lists, sorted numerically, follow it — trusted only if it agrees with every entry's pairing.
  const ids = Object.keys(dump.pg_status).sort(compareNames);
  const names = [...groups.keys()].sort(compareNames);
  const aligned = ids.length === names.length && ids.every((id, index) => !nameOfId.has(id) || nameOfId.get(id) === names[index]);
  const status = new Map<string, { enqueued: number | null; completed: number | null }>();
  ids.forEach((id, index) => {
    const name = nameOfId.get(id) ?? (aligned ? names[index] : undefined);
    const value = dump.pg_status[id];
    if (name !== undefined && value) status.set(name, { enqueued: value.last_enqueued_collective ?? null, completed: value.last_completed_collective ?? null });
  });
  return { view: { groups, entries, p2pGroups, status }, skipped };
}

/** Numeric names in numeric order, others after them in string order. */
function compareNames(a: string, b: string): number {
  const numeric = /^\d+$/;
  const aNumber = numeric.test(a);
  const bNumber = numeric.test(b);
  if (aNumber && bNumber) return Number(a) - Number(b);
  if (aNumber !== bNumber) return aNumber ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}
