import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { planMicrobatches, type MicrobatchPlan } from '../../analyzers/microbatch.js';
import { InputError } from '../../core/errors.js';

/** The least makespan over every composition of M into n positive multiples of P. */
function bruteForceMakespan(times: readonly number[], microbatches: number, multipleOf: number): number {
  let best = Number.POSITIVE_INFINITY;
  const visit = (group: number, left: number, makespan: number): void => {
    if (makespan >= best) return;
    if (group === times.length - 1) {
      best = Math.min(best, Math.max(makespan, left * (times[group] as number)));
      return;
    }
    const othersNeed = (times.length - group - 1) * multipleOf;
    for (let count = multipleOf; count <= left - othersNeed; count += multipleOf) {
      visit(group + 1, left - count, Math.max(makespan, count * (times[group] as number)));
    }
  };
  visit(0, microbatches, 0);
  return best;
}

function expectValid(plan: MicrobatchPlan, times: readonly number[], microbatches: number, multipleOf = 1): void {
  expect(plan.assignment).toHaveLength(times.length);
  expect(plan.assignment.reduce((sum, count) => sum + count, 0)).toBe(microbatches);
  const offending = plan.assignment.filter((count) => !Number.isInteger(count) || count < multipleOf || count % multipleOf !== 0);
  expect(offending).toEqual([]);
  expect(plan.iterationSeconds).toBe(Math.max(...plan.assignment.map((count, group) => count * (times[group] as number))));
}

/**
 * Optimality certificate independent of the planner: held strictly below the plan's makespan,
 * either some group cannot run even its minimum P micro-batches, or the groups together cannot
 * take all M of them.
 */
function expectNothingFaster(plan: MicrobatchPlan, times: readonly number[], microbatches: number, multipleOf = 1): void {
  const fitBelow = times.map((seconds) => {
    let count = Math.ceil(plan.iterationSeconds / seconds / multipleOf) * multipleOf + multipleOf;
    while (count > 0 && count * seconds >= plan.iterationSeconds) count -= multipleOf;
    return count;
  });
  const someGroupCannotStart = fitBelow.some((count) => count < multipleOf);
  const total = fitBelow.reduce((sum, count) => sum + count, 0);
  expect(someGroupCannotStart || total < microbatches).toBe(true);
}

function randomTimes(groups: number, seed: number): number[] {
  let state = seed >>> 0;
  return Array.from({ length: groups }, () => {
    state = (Math.imul(state ^ (state >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0;
    return 1 + (state / 2 ** 32) * 0.5;
  });
}

const secondsPerMicrobatch = fc.oneof(
  fc.integer({ min: 1, max: 8 }).map((halves) => halves / 2),
  fc.double({ min: 0.05, max: 5, noNaN: true, noDefaultInfinity: true }),
);

describe('planMicrobatches', () => {
  it('matches the brute-force optimum on small random cases without a pipeline multiple', () => {
    const cases = fc
      .array(secondsPerMicrobatch, { minLength: 1, maxLength: 5 })
      .chain((times) => fc.tuple(fc.constant(times), fc.integer({ min: times.length, max: 14 })));
    fc.assert(
      fc.property(cases, ([times, microbatches]) => {
        const plan = planMicrobatches(times, microbatches);
        expectValid(plan, times, microbatches);
        expect(plan.iterationSeconds).toBe(bruteForceMakespan(times, microbatches, 1));
      }),
      { numRuns: 600 },
    );
  });

  it('matches the brute-force optimum on small random cases where every count must be a multiple of P', () => {
    const cases = fc
      .integer({ min: 1, max: 4 })
      .chain((multipleOf) =>
        fc.tuple(fc.constant(multipleOf), fc.array(secondsPerMicrobatch, { minLength: 1, maxLength: Math.min(5, Math.floor(14 / multipleOf)) })),
      )
      .chain(([multipleOf, times]) =>
        fc.tuple(
          fc.constant(multipleOf),
          fc.constant(times),
          fc.integer({ min: times.length, max: Math.floor(14 / multipleOf) }).map((units) => units * multipleOf),
        ),
      );
    fc.assert(
      fc.property(cases, ([multipleOf, times, microbatches]) => {
        const plan = planMicrobatches(times, microbatches, { multipleOf });
        expectValid(plan, times, microbatches, multipleOf);
        expect(plan.iterationSeconds).toBe(bruteForceMakespan(times, microbatches, multipleOf));
      }),
      { numRuns: 600 },
    );
  });

  it('splits evenly when every group is equally fast', () => {
    expect(planMicrobatches([1.2, 1.2, 1.2, 1.2], 32)).toEqual({ assignment: [8, 8, 8, 8], iterationSeconds: 9.6 });
  });

  it('gives a group that is twice as slow half the share of a healthy group', () => {
    expect(planMicrobatches([1, 2, 1, 1], 28)).toEqual({ assignment: [8, 4, 8, 8], iterationSeconds: 8 });
  });

  it('keeps 1F1B counts at multiples of the pipeline depth while unloading the slow group', () => {
    const plan = planMicrobatches([1, 1, 3], 16, { multipleOf: 2 });
    expectValid(plan, [1, 1, 3], 16, 2);
    expect(plan.iterationSeconds).toBe(8);
    expect(plan.assignment[2]).toBe(2);
  });

  it('still gives a very slow group its one required micro-batch', () => {
    expect(planMicrobatches([100, 1], 10)).toEqual({ assignment: [1, 9], iterationSeconds: 100 });
  });

  it('returns the same plan for the same input, breaking ties by the lowest group index', () => {
    const first = planMicrobatches([1, 1, 1], 4);
    expect(first).toEqual({ assignment: [2, 1, 1], iterationSeconds: 2 });
    expect(planMicrobatches([1, 1, 1], 4)).toEqual(first);
  });

  it.each([
    { what: 'no groups', call: () => planMicrobatches([], 4), field: 'times' },
    { what: 'a zero time', call: () => planMicrobatches([1, 0], 4), field: 'times.1' },
    { what: 'a negative time', call: () => planMicrobatches([-1, 1], 4), field: 'times.0' },
    { what: 'a NaN time', call: () => planMicrobatches([1, 1, Number.NaN], 4), field: 'times.2' },
    { what: 'an infinite time', call: () => planMicrobatches([Number.POSITIVE_INFINITY], 4), field: 'times.0' },
    { what: 'a fractional micro-batch count', call: () => planMicrobatches([1, 1], 2.5), field: 'microbatches' },
    { what: 'a NaN micro-batch count', call: () => planMicrobatches([1, 1], Number.NaN), field: 'microbatches' },
    { what: 'fewer micro-batches than groups', call: () => planMicrobatches([1, 1, 1], 2), field: 'microbatches' },
    { what: 'a zero multiple', call: () => planMicrobatches([1, 1], 4, { multipleOf: 0 }), field: 'multipleOf' },
    { what: 'a fractional multiple', call: () => planMicrobatches([1, 1], 4, { multipleOf: 1.5 }), field: 'multipleOf' },
    { what: 'a total that is no multiple of P', call: () => planMicrobatches([1, 1], 10, { multipleOf: 4 }), field: 'microbatches' },
    { what: 'too few micro-batches for P per group', call: () => planMicrobatches([1, 1, 1], 8, { multipleOf: 4 }), field: 'microbatches' },
  ])('rejects $what with an InputError naming $field', ({ call, field }) => {
    let caught: unknown;
    try {
      call();
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(InputError);
    expect((caught as InputError).field).toBe(field);
    expect((caught as InputError).message).toContain(field);
  });

  // Speed is measured in bench/microbatch.ts, not asserted here.
  it.each([512, 16_384])('plans %i groups with M = 8n optimally', (groups) => {
    const times = randomTimes(groups, groups);
    const microbatches = 8 * groups;
    const plan = planMicrobatches(times, microbatches);
    const pipelined = planMicrobatches(times, microbatches, { multipleOf: 4 });
    expectValid(plan, times, microbatches);
    expectNothingFaster(plan, times, microbatches);
    expectValid(pipelined, times, microbatches, 4);
    expectNothingFaster(pipelined, times, microbatches, 4);
  });

  it('plans a fleet with one severe straggler without handing it more than its floor', () => {
    const times = [...randomTimes(511, 7), 40];
    const plan = planMicrobatches(times, 8 * 512, { multipleOf: 2 });
    expectValid(plan, times, 8 * 512, 2);
    expectNothingFaster(plan, times, 8 * 512, 2);
    expect(plan.assignment[511]).toBe(2);
  });
});
