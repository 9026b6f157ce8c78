import { describe, expect, it } from 'vitest';
import { defaultReplayGroupSize, runDualPhaseReplay } from '../../../analyzers/replay/runner.js';

const machines = Array.from({ length: 12 }, (_, index) => `m${String(index).padStart(2, '0')}`);

describe('dual-phase replay runner', () => {
  it('picks the largest group size that divides the machines and keeps a single fault unique (m ≤ z/m)', () => {
    expect(defaultReplayGroupSize(12)).toBe(3);
    expect(defaultReplayGroupSize(24)).toBe(4);
    expect(defaultReplayGroupSize(16)).toBe(4);
    expect(defaultReplayGroupSize(7)).toBe(1);
  });

  it('isolates each single faulty machine exactly, running horizontal then vertical groups', async () => {
    for (const bad of machines) {
      const seen: string[][] = [];
      const outcome = await runDualPhaseReplay(machines, async (group) => {
        seen.push([...group]);
        return { ok: !group.includes(bad), detail: '' };
      });
      expect(outcome.suspects).toEqual([bad]);
      expect(seen).toHaveLength(8); // 4 horizontal + 4 vertical groups of 3
    }
  });

  it('stops after the horizontal phase when the failure does not reproduce, naming nobody', async () => {
    const outcome = await runDualPhaseReplay(machines, async () => ({ ok: true, detail: '' }));
    expect(outcome.suspects).toEqual([]);
    expect(outcome.vertical).toEqual([]);
    expect(outcome.detail).toContain('did not reproduce on any of 4 horizontal groups');
  });

  it('counts a group whose run throws as failing and over-evicts the crossings of two faults', async () => {
    const outcome = await runDualPhaseReplay(machines, async (group) => {
      if (group.includes('m01')) throw new Error('srun: node failure');
      return { ok: !group.includes('m10'), detail: '' };
    });
    expect(outcome.horizontal.find((group) => group.machines.includes('m01'))?.detail).toBe('srun: node failure');
    expect(outcome.suspects).toEqual(expect.arrayContaining(['m01', 'm10']));
  });
});
