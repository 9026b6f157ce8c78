import { describe, expect, it } from 'vitest';
import { dataParallelGroups, parseJobSpec } from '../../core/job.js';
import { Topology } from '../../core/topology.js';

describe('Topology', () => {
  const nodes = ['n1', 'n2', 'n3', 'n4'];
  const topology = Topology.from({ nodes, ranksPerNode: 2, tp: 2, pp: 2, dp: 2, order: 'tp-dp-pp' });

  it('places ranks on nodes in order, ranksPerNode at a time', () => {
    expect(topology.placement(5)).toMatchObject({ rank: 5, node: 'n3', localRank: 1 });
  });

  it('varies the first dimension of the order string fastest', () => {
    expect(topology.placement(1).coords).toMatchObject({ tp: 1, dp: 0, pp: 0 });
    expect(topology.placement(2).coords).toMatchObject({ tp: 0, dp: 1, pp: 0 });
    expect(topology.placement(4).coords).toMatchObject({ tp: 0, dp: 0, pp: 1 });
  });

  it('derives each parallel group from the coordinates', () => {
    expect(topology.group('tp', 5)).toEqual([4, 5]);
    expect(topology.group('dp', 5)).toEqual([5, 7]);
    expect(topology.group('pp', 5)).toEqual([1, 5]);
    expect(topology.nodesOf(topology.group('pp', 5))).toEqual(['n1', 'n3']);
  });

  it('rejects sizes that do not multiply to the number of ranks, naming the mismatch', () => {
    expect(() => Topology.from({ nodes, ranksPerNode: 2, tp: 4, dp: 4 })).toThrow(/tp\*cp\*ep\*dp\*pp = 16 but nodes\*ranksPerNode = 8/);
  });

  it('rejects an unknown dimension in the order string', () => {
    expect(() => Topology.from({ nodes, ranksPerNode: 2, tp: 8, order: 'tp-xx' })).toThrow(/unknown dimension "xx"/);
  });

  it('accepts an explicit rank table and refuses one with a gap', () => {
    const explicit = Topology.from({
      ranks: [
        { rank: 0, node: 'n00', tp: 0, pp: 0, dp: 0 },
        { rank: 1, node: 'n01', tp: 0, pp: 0, dp: 1 },
      ],
    });
    expect(explicit.group('dp', 0)).toEqual([0, 1]);
    expect(explicit.placement(1)).toMatchObject({ node: 'n01', localRank: 0 });
    expect(() => Topology.from({ ranks: [{ rank: 1, node: 'b' }] })).toThrow(/rank 0 is missing/);
  });

  it('names an unknown field instead of ignoring it', () => {
    expect(() => Topology.from({ nodes, ranksPerNode: 2, tp: 8, sizes: { dp: 2 } })).toThrow(/sizes|Unrecognized/);
  });
});

describe('a job spec without every parallel size', () => {
  const job = { name: 'ddp', nodes: ['n0', 'n1', 'n2'], ranksPerNode: 2, launcher: 'accept', codeVersion: 'v1' };

  it('is plain data parallel without a topology: one replica per rank', () => {
    const { topology } = parseJobSpec(job);
    expect(topology.ranks).toHaveLength(6);
    expect(dataParallelGroups(topology)).toBe(6);
  });

  it('takes dp from the world size and the sizes it names, as Megatron does, and still names a world they do not divide', () => {
    expect(dataParallelGroups(parseJobSpec({ ...job, topology: { tp: 2 } }).topology)).toBe(3);
    expect(() => parseJobSpec({ ...job, topology: { tp: 4 } })).toThrow(/tp\*cp\*ep\*dp\*pp = 4 but/);
    expect(() => parseJobSpec({ ...job, topology: { tp: 2, dp: 2 } })).toThrow(/tp\*cp\*ep\*dp\*pp = 4 but/);
  });
});
