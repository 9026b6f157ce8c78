import { InputError } from '../core/errors.js';

/**
 * Exact micro-batch rebalancing across data-parallel groups (Greyhound §5.2, strategy S2).
 *
 * Group i needs t_i seconds per micro-batch. Choose integers m_i ≥ 1 with Σ m_i = M that
 * minimise the slowest group's iteration time max_i m_i·t_i. For a 1F1B pipeline every m_i must
 * also be a multiple of the number of pipeline stages P (Greyhound footnote 4), so m_i ≥ P.
 * Greyhound hands the equivalent variance-minimising program to cvxpy (35.93 s at 512 groups,
 * Table 5); the problem has enough structure to be solved exactly in O(n log n).
 *
 * Work in units of P micro-batches: group i takes u_i ≥ 1 units, m_i = P·u_i, Σ u_i = K = M/P,
 * and its time is c_i(u) = (P·u)·t_i, evaluated exactly as the caller would evaluate m_i·t_i
 * in floating point. Rounding is monotone, so c_i is non-decreasing in u; the proof below uses
 * nothing else, so the result is optimal for the floating-point objective, not only the real one.
 *
 * For a makespan T let cap_i(T) = max{u ≤ K : c_i(u) ≤ T}. T is achievable iff every cap_i(T) ≥ 1
 * and Σ cap_i(T) ≥ K; call T* the least achievable value (a value c_i(u) for some i, u).
 *
 * 1. B = max_i c_i(1) is a lower bound (every group holds one unit). If B is achievable, then
 *    T* = B and any u with 1 ≤ u_i ≤ cap_i(B), Σ u_i = K is optimal: fill groups in index order.
 * 2. Otherwise start from u = cap(L) for some L ≥ B with Σ cap_i(L) ≤ K. Claim: u_i ≤ cap_i(T*).
 *    If L ≤ T* this is monotonicity of cap. If L > T*, then cap(L) ≥ cap(T*) componentwise while
 *    Σ cap(L) ≤ K ≤ Σ cap(T*), so cap(L) = cap(T*).
 * 3. Greedy: while Σ u < K, give one unit to the group whose next cost c_i(u_i + 1) is least.
 *    Invariant u_i ≤ cap_i(T*): while Σ u < K ≤ Σ cap(T*) some group has u_j < cap_j(T*), so its
 *    next cost is ≤ T*; the least next cost is therefore ≤ T*, and the chosen group stays within
 *    its cap. At the end every c_i(u_i) ≤ T*, and no assignment does better than T*: optimal.
 *
 * L is the continuous bound K / Σ 1/(P·t_i) (any achievable T satisfies Σ T/(P·t_i) ≥ K), shaded
 * down by 1e-9 for rounding; then Σ cap(L) ≥ K − n − 1e-9·K, so the greedy runs about n steps
 * on a heap. Should rounding leave Σ cap(L) > K, L falls back to B, which stays correct.
 *
 * Ties are broken deterministically: in step 1 by index order, in step 3 by the lowest index
 * among equal next costs.
 */

export interface MicrobatchOptions {
  /** Pipeline stages P of a 1F1B schedule: every group's count must be a multiple of P. */
  readonly multipleOf?: number;
}

export interface MicrobatchPlan {
  /** Micro-batches per data-parallel group, in the order of the given times. */
  readonly assignment: number[];
  /** The slowest group's time for one iteration, max_i assignment[i]·times[i], in seconds. */
  readonly iterationSeconds: number;
}

/** Shading of the continuous lower bound against accumulated rounding (see the proof above). */
const CONTINUOUS_BOUND_SHADE = 1 - 1e-9;

export function planMicrobatches(times: readonly number[], microbatches: number, options: MicrobatchOptions = {}): MicrobatchPlan {
  const step = validate(times, microbatches, options);
  const units = microbatches / step;
  const cost = (group: number, unitCount: number): number => unitCount * step * (times[group] as number);
  const capAt = (group: number, makespan: number): number => {
    let cap = Math.floor(makespan / (step * (times[group] as number)));
    cap = Number.isFinite(cap) ? Math.max(0, Math.min(units, cap)) : units;
    // The division is only an estimate; the products decide.
    while (cap < units && cost(group, cap + 1) <= makespan) cap += 1;
    while (cap > 0 && cost(group, cap) > makespan) cap -= 1;
    return cap;
  };
  const capsAt = (makespan: number): { caps: number[]; total: number } => {
    const caps = times.map((_, group) => capAt(group, makespan));
    return { caps, total: caps.reduce((sum, cap) => sum + cap, 0) };
  };

  let oneUnitBound = 0;
  let inverseSum = 0;
  for (let group = 0; group < times.length; group += 1) {
    oneUnitBound = Math.max(oneUnitBound, cost(group, 1));
    inverseSum += 1 / (step * (times[group] as number));
  }

  const atBound = capsAt(oneUnitBound);
  if (atBound.total >= units) return fillInIndexOrder(atBound.caps, units, step, times);

  let start = capsAt(Math.max(oneUnitBound, (units / inverseSum) * CONTINUOUS_BOUND_SHADE));
  if (start.total > units) start = atBound;
  return greedyFill(start.caps, units - start.total, step, times, cost);
}

/** Step 1: the one-unit bound is achievable, so any assignment within its caps is optimal. */
function fillInIndexOrder(caps: readonly number[], units: number, step: number, times: readonly number[]): MicrobatchPlan {
  let spare = units - caps.length;
  const unitsPerGroup = caps.map((cap) => {
    const extra = Math.min(cap - 1, spare);
    spare -= extra;
    return 1 + extra;
  });
  return toPlan(unitsPerGroup, step, times);
}

/** Step 3: hand out the remaining units one at a time to the group that finishes earliest. */
function greedyFill(
  start: readonly number[],
  deficit: number,
  step: number,
  times: readonly number[],
  cost: (group: number, unitCount: number) => number,
): MicrobatchPlan {
  const unitsPerGroup = [...start];
  const heap = new NextCostHeap(unitsPerGroup.map((count, group) => cost(group, count + 1)));
  for (let given = 0; given < deficit; given += 1) {
    const group = heap.top();
    unitsPerGroup[group] = (unitsPerGroup[group] as number) + 1;
    heap.updateTop(cost(group, (unitsPerGroup[group] as number) + 1));
  }
  return toPlan(unitsPerGroup, step, times);
}

function toPlan(unitsPerGroup: readonly number[], step: number, times: readonly number[]): MicrobatchPlan {
  const assignment = unitsPerGroup.map((count) => count * step);
  let iterationSeconds = 0;
  for (let group = 0; group < assignment.length; group += 1) {
    iterationSeconds = Math.max(iterationSeconds, (assignment[group] as number) * (times[group] as number));
  }
  return { assignment, iterationSeconds };
}

/** Binary min-heap of group indices keyed by (next cost, index); only the top ever changes. */
class NextCostHeap {
  private readonly order: Int32Array;

  constructor(private readonly keys: number[]) {
    this.order = Int32Array.from(keys.keys());
    for (let slot = (this.order.length >> 1) - 1; slot >= 0; slot -= 1) this.siftDown(slot);
  }

  top(): number {
    return this.order[0] as number;
  }

  updateTop(key: number): void {
    this.keys[this.order[0] as number] = key;
    this.siftDown(0);
  }

  private before(a: number, b: number): boolean {
    const keyA = this.keys[a] as number;
    const keyB = this.keys[b] as number;
    return keyA < keyB || (keyA === keyB && a < b);
  }

  private siftDown(from: number): void {
    const { order } = this;
    let slot = from;
    for (;;) {
      const left = 2 * slot + 1;
      if (left >= order.length) return;
      const right = left + 1;
      const child = right < order.length && this.before(order[right] as number, order[left] as number) ? right : left;
      if (!this.before(order[child] as number, order[slot] as number)) return;
      const held = order[slot] as number;
      order[slot] = order[child] as number;
      order[child] = held;
      slot = child;
    }
  }
}

/** Checks every input at the edge and returns the unit size P (1 without a 1F1B constraint). */
function validate(times: readonly number[], microbatches: number, options: MicrobatchOptions): number {
  if (!Array.isArray(times) || times.length === 0) {
    throw new InputError('times must list the seconds per micro-batch of at least one DP group', 'times');
  }
  for (const [group, seconds] of times.entries()) {
    if (typeof seconds !== 'number' || !Number.isFinite(seconds) || seconds <= 0) {
      throw new InputError(`times.${group} must be a finite number of seconds > 0, got ${String(seconds)}`, `times.${group}`);
    }
  }
  if (!Number.isSafeInteger(microbatches) || microbatches <= 0) {
    throw new InputError(`microbatches must be a positive integer, got ${String(microbatches)}`, 'microbatches');
  }
  const step = options.multipleOf ?? 1;
  if (!Number.isSafeInteger(step) || step <= 0) {
    throw new InputError(`multipleOf must be a positive integer, got ${String(step)}`, 'multipleOf');
  }
  if (microbatches % step !== 0) {
    throw new InputError(`microbatches (${microbatches}) must be a multiple of multipleOf (${step})`, 'microbatches');
  }
  if (microbatches < times.length * step) {
    throw new InputError(
      `microbatches (${microbatches}) cannot give each of ${times.length} DP groups at least ${step}; needs ≥ ${times.length * step}`,
      'microbatches',
    );
  }
  for (const [group, seconds] of times.entries()) {
    if (!Number.isFinite(microbatches * seconds)) {
      throw new InputError(`times.${group} (${seconds}) × microbatches overflows`, `times.${group}`);
    }
  }
  return step;
}
