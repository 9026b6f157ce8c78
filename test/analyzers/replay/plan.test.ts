import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { machineIds, maxSuspects, replayGroups, replaySuspects } from '../../../analyzers/replay/plan.js';
import { InputError } from '../../../core/errors.js';

/** Every (z, m) with m dividing z, z up to 60. */
const divisiblePlan = fc.integer({ min: 1, max: 60 }).chain((z) =>
  fc
    .constantFrom(
      ...machineIds(z)
        .map((id) => id + 1)
        .filter((m) => z % m === 0),
    )
    .map((m) => ({ z, m })),
);

describe('dual-phase replay groups (ByteRobust §4.2, Algorithm 1)', () => {
  it('reproduces Fig. 6: with z = 24 and m = 4, machine 13 is in H_3 and V_1 and is their only common machine', () => {
    const machines = machineIds(24);
    const { horizontal, vertical } = replayGroups(machines, 4);
    expect(horizontal).toHaveLength(6);
    expect(vertical).toHaveLength(6);
    expect(horizontal[3]).toEqual([12, 13, 14, 15]);
    expect(vertical[1]).toEqual([1, 7, 13, 19]);
    expect(replaySuspects(machines, 4, { horizontal: 3, vertical: 1 })).toEqual({ suspects: [13] });
  });

  it('groups 6 machines in groups of 2 consecutively, then by id mod 3', () => {
    expect(replayGroups(machineIds(6), 2)).toEqual({
      horizontal: [
        [0, 1],
        [2, 3],
        [4, 5],
      ],
      vertical: [
        [0, 3],
        [1, 4],
        [2, 5],
      ],
    });
  });

  it('keeps node names in place of ids, in the order given', () => {
    const nodes = ['gpu-a', 'gpu-b', 'gpu-c', 'gpu-d'];
    expect(replayGroups(nodes, 2)).toEqual({
      horizontal: [
        ['gpu-a', 'gpu-b'],
        ['gpu-c', 'gpu-d'],
      ],
      vertical: [
        ['gpu-a', 'gpu-c'],
        ['gpu-b', 'gpu-d'],
      ],
    });
    expect(replaySuspects(nodes, 2, { horizontal: 1, vertical: 0 })).toEqual({ suspects: ['gpu-c'] });
  });

  it('leaves ⌈m/n⌉ suspects when the group size exceeds the group count (Algorithm 1 line 10)', () => {
    // z = 8, m = 4, n = 2: H_0 = 0..3, V_1 = {1, 3, 5, 7}.
    expect(replaySuspects(machineIds(8), 4, { horizontal: 0, vertical: 1 })).toEqual({ suspects: [1, 3] });
    expect(maxSuspects(8, 4)).toBe(2);
    expect(maxSuspects(24, 4)).toBe(1);
    // z = 18, m = 6, n = 3: ⌈6/3⌉ = 2 suspects.
    expect(replaySuspects(machineIds(18), 6, { horizontal: 2, vertical: 0 })).toEqual({ suspects: [12, 15] });
  });

  it('names nobody when the failing groups share no machine, which only inconsistent replays produce', () => {
    // z = 24, m = 4, n = 6: H_0 = 0..3 holds residues 0-3 only, so V_5 misses it.
    expect(replaySuspects(machineIds(24), 4, { horizontal: 0, vertical: 5 })).toEqual({ suspects: [] });
  });

  it('rejects a group size that does not divide the machines, naming a way out', () => {
    expect(() => replayGroups(machineIds(10), 4)).toThrow(InputError);
    expect(() => replayGroups(machineIds(10), 4)).toThrow(/group size 4 does not divide the 10 machines.*replay on 8 machines/);
  });

  it('rejects empty, oversized, fractional and repeated inputs and out-of-range group indices with the field at fault', () => {
    const field = (run: () => unknown): string | undefined => {
      try {
        run();
      } catch (error) {
        if (error instanceof InputError) return error.field;
        throw error;
      }
      return undefined;
    };
    expect(field(() => replayGroups([], 1))).toBe('machines');
    expect(field(() => replayGroups(machineIds(4), 8))).toBe('groupSize');
    expect(field(() => replayGroups(machineIds(4), 1.5))).toBe('groupSize');
    expect(field(() => replayGroups(['a', 'b', 'a', 'c'], 2))).toBe('machines.2');
    expect(field(() => replaySuspects(machineIds(24), 4, { horizontal: 6, vertical: 0 }))).toBe('failed.horizontal');
    expect(field(() => replaySuspects(machineIds(24), 4, { horizontal: 0, vertical: -1 }))).toBe('failed.vertical');
    expect(field(() => machineIds(0))).toBe('machines');
  });

  it('puts every machine in exactly one group of each phase, every group holding m machines', () => {
    fc.assert(
      fc.property(divisiblePlan, ({ z, m }) => {
        const { horizontal, vertical } = replayGroups(machineIds(z), m);
        for (const phase of [horizontal, vertical]) {
          expect(phase).toHaveLength(z / m);
          expect(phase.every((group) => group.length === m)).toBe(true);
          expect(phase.flat().sort((a, b) => a - b)).toEqual(machineIds(z));
        }
      }),
    );
  });

  it('isolates any single faulty machine: its two groups intersect in exactly that machine when m ≤ n', () => {
    const plan = divisiblePlan.filter(({ z, m }) => m * m <= z).chain(({ z, m }) => fc.integer({ min: 0, max: z - 1 }).map((faulty) => ({ z, m, faulty })));
    fc.assert(
      fc.property(plan, ({ z, m, faulty }) => {
        const machines = machineIds(z);
        const { horizontal, vertical } = replayGroups(machines, m);
        const a = horizontal.findIndex((group) => group.includes(faulty));
        const b = vertical.findIndex((group) => group.includes(faulty));
        const intersection = horizontal[a]!.filter((machine) => vertical[b]!.includes(machine));
        expect(intersection).toEqual([faulty]);
        expect(replaySuspects(machines, m, { horizontal: a, vertical: b })).toEqual({ suspects: [faulty] });
      }),
    );
  });

  it('solves the constraint system to exactly the intersection of the two failing groups, never above ⌈m/n⌉, for any m', () => {
    const plan = divisiblePlan.chain(({ z, m }) => fc.record({ z: fc.constant(z), m: fc.constant(m), a: fc.nat(z / m - 1), b: fc.nat(z / m - 1) }));
    fc.assert(
      fc.property(plan, ({ z, m, a, b }) => {
        const machines = machineIds(z);
        const { horizontal, vertical } = replayGroups(machines, m);
        const intersection = horizontal[a]!.filter((machine) => vertical[b]!.includes(machine));
        const { suspects } = replaySuspects(machines, m, { horizontal: a, vertical: b });
        expect(suspects).toEqual(intersection);
        expect(suspects.length).toBeLessThanOrEqual(maxSuspects(z, m));
      }),
    );
  });
});
