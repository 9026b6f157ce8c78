import { InputError } from '../../core/errors.js';

/**
 * Dual-phase replay planning (ByteRobust §4.2, Algorithm 1): group testing that localises one
 * machine producing silent data corruption by replaying the job twice, each time on groups
 * that keep the job's TP/PP shape and shrink only its DP size.
 *
 * Machine i gets the id x_i = i (its position in the list given). With z machines and a
 * primary group size m (a multiple of the PP size in practice), n = z/m:
 * - phase 1, horizontal: n groups by ⌊x/m⌋ — group a is the m consecutive machines a·m … a·m+m−1;
 * - phase 2, vertical: n groups by x mod n — group b is the m machines b, b+n, b+2n, …
 * Every group of both phases therefore holds exactly m machines, so every replay runs the same
 * reduced-DP job. Replaying identifies a faulty horizontal group a and a faulty vertical group
 * b; the suspects are the solutions of ⌊x/m⌋ = a ∧ x mod n = b, i.e. H_a ∩ V_b (lines 9–11).
 *
 * The paper's assumptions, enforced or reported here:
 * - n = z/m is a whole number (Algorithm 1's input; in practice m = k·PP and n = DP/k). When
 *   m does not divide z the groups would differ in size and the replays would not run the same
 *   job shape, so that is an InputError, not a silently ragged last group.
 * - m ≤ n gives a unique suspect: the m consecutive ids of H_a have distinct residues mod n.
 *   With m > n, H_a holds every residue up to ⌈m/n⌉ times and up to ⌈m/n⌉ suspects remain
 *   (line 10); that is allowed, and `maxSuspects` says how many to expect.
 * - One faulty machine (§4.2: "each SDC incident typically involves only a single faulty
 *   machine"). If the replays were inconsistent (two faulty machines, a fault that did not
 *   reproduce), H_a ∩ V_b can be empty when m < n; the suspects are then empty, which the
 *   caller must read as "replay inconclusive", never as "nobody is faulty".
 *
 * Group indices are 0-based, like the machine ids of Algorithm 1 (S ⊆ {0, …, z−1}) and Fig. 6
 * (z = 24, m = 4: machine 13 is in H_3 and V_1).
 */

export interface ReplayGroups<T> {
  /** Phase 1: horizontal group a holds the machines with ⌊x/m⌋ = a (Algorithm 1 line 4). */
  readonly horizontal: T[][];
  /** Phase 2: vertical group b holds the machines with x mod n = b (Algorithm 1 line 7). */
  readonly vertical: T[][];
}

export interface ReplaySuspects<T> {
  /** Machines in both failing groups, in id order; empty means the replays disagree. */
  readonly suspects: T[];
}

/** The 0-based indices of the groups whose replay failed in each phase. */
export interface FailedReplayGroups {
  readonly horizontal: number;
  readonly vertical: number;
}

/** Checks z, m and the machines; returns n = z/m, the number of groups in each phase. */
function groupCount<T>(machines: readonly T[], groupSize: number): number {
  const z = machines.length;
  if (z === 0) throw new InputError('dual-phase replay needs at least one machine', 'machines');
  if (!Number.isInteger(groupSize) || groupSize < 1) {
    throw new InputError(`group size must be a whole number of at least 1, got ${groupSize}`, 'groupSize');
  }
  if (groupSize > z) throw new InputError(`group size ${groupSize} is larger than the ${z} machines`, 'groupSize');
  if (z % groupSize !== 0) {
    // ByteRobust §4.2, Algorithm 1 input: n ← z/m. Ragged groups would replay different job shapes.
    const below = z - (z % groupSize);
    throw new InputError(
      `group size ${groupSize} does not divide the ${z} machines: Algorithm 1 needs n = z/m whole so that every replay group has m machines ` +
        `(use a divisor of ${z}, or replay on ${below} machines and test the other ${z - below} separately)`,
      'groupSize',
    );
  }
  const seen = new Set<T>();
  for (const [index, machine] of machines.entries()) {
    if (seen.has(machine)) throw new InputError(`machine ${String(machine)} is listed twice`, `machines.${index}`);
    seen.add(machine);
  }
  return z / groupSize;
}

/** Machine ids 0 … count−1, for callers that plan by count rather than by name. */
export function machineIds(count: number): number[] {
  if (!Number.isInteger(count) || count < 1) throw new InputError(`machine count must be a whole number of at least 1, got ${count}`, 'machines');
  return Array.from({ length: count }, (_, id) => id);
}

/** The horizontal and vertical groups of both replay phases (Algorithm 1 lines 2–8). */
export function replayGroups<T>(machines: readonly T[], groupSize: number): ReplayGroups<T> {
  const n = groupCount(machines, groupSize);
  const m = groupSize;
  const horizontal: T[][] = Array.from({ length: n }, () => []);
  const vertical: T[][] = Array.from({ length: n }, () => []);
  for (const [x, machine] of machines.entries()) {
    horizontal[Math.floor(x / m)]!.push(machine);
    vertical[x % n]!.push(machine);
  }
  return { horizontal, vertical };
}

/**
 * The suspects once replay has named the failing group of each phase: the solutions of
 * ⌊x/m⌋ = a, x mod n = b (Algorithm 1 line 9), found by walking H_a's residues, not by
 * intersecting lists, so that tests can check one against the other.
 */
export function replaySuspects<T>(machines: readonly T[], groupSize: number, failed: FailedReplayGroups): ReplaySuspects<T> {
  const n = groupCount(machines, groupSize);
  const m = groupSize;
  for (const phase of ['horizontal', 'vertical'] as const) {
    const index = failed[phase];
    if (!Number.isInteger(index) || index < 0 || index >= n) {
      throw new InputError(`failing ${phase} group must be a 0-based group index 0-${n - 1}, got ${index}`, `failed.${phase}`);
    }
  }
  const first = failed.horizontal * m;
  // The first id of H_a with residue b, then every n-th id while still inside H_a.
  const offset = (((failed.vertical - first) % n) + n) % n;
  const suspects: T[] = [];
  for (let x = first + offset; x < first + m; x += n) suspects.push(machines[x] as T);
  return { suspects };
}

/** How many suspects one faulty machine leaves at most (Algorithm 1 line 10): 1 when m ≤ n, else ⌈m/n⌉. */
export function maxSuspects(machineCount: number, groupSize: number): number {
  const n = groupCount(machineIds(machineCount), groupSize);
  return groupSize <= n ? 1 : Math.ceil(groupSize / n);
}
