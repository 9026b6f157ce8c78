import { describe, expect, it } from 'vitest';
import { parseJobSpec, worldSize } from '../../core/job.js';

describe('a job spec’s world size', () => {
  const base = { name: 'w', nodes: ['n0', 'n1', 'n2', 'n3'], ranksPerNode: 2, launcher: 'accept', codeVersion: 'v1' };
  const specs = [
    base,
    { ...base, topology: { tp: 2, pp: 2 } },
    { ...base, topology: { nodes: ['n0', 'n1'], ranksPerNode: 4, tp: 4, dp: 2 } },
    { ...base, topology: { nodes: ['n0', 'n1', 'n2'], ranksPerNode: 1, dp: 3 } },
    { ...base, topology: { ranks: [0, 1, 2].map((rank) => ({ rank, node: rank < 2 ? 'n0' : 'n3', dp: rank })) } },
  ];

  it('is the number of ranks parseJobSpec places, without building the rank table', () => {
    for (const spec of specs) {
      const parsed = parseJobSpec(spec);
      expect(worldSize(parsed.spec)).toBe(parsed.topology.ranks.length);
    }
  });
});
