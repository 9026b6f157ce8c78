import { describe, expect, it } from 'vitest';
import { FAIL_SLOW_ROUNDS, FailSlowRounds } from '../../../analyzers/stacks/rounds.js';
import { aggregateRankStacks, type StackAggregation } from '../../../analyzers/stacks/aggregate.js';
import { Topology } from '../../../core/topology.js';

/** TP=2, PP=4, DP=4 on 16 two-GPU machines (ByteRobust Fig. 7); pipeline of DP replica d on machines 4d..4d+3. */
const topology = Topology.from({ nodes: Array.from({ length: 16 }, (_, index) => `node-${index}`), ranksPerNode: 2, tp: 2, pp: 4, dp: 4, order: 'tp-pp-dp' });

/** One 10-second round: most ranks wait in the gradient all-reduce, `busy` ranks are still computing. */
function round(busy: readonly number[]): StackAggregation {
  const stacks = new Map(
    topology.ranks.map(({ rank }) => [
      rank,
      busy.includes(rank)
        ? ['gemm (transformer_engine/pytorch/cpp_extensions/gemm.py)', 'forward (megatron/core/transformer/mlp.py)']
        : ['all_reduce (torch/distributed/distributed_c10d.py)', 'finish_grad_sync (megatron/core/distributed/param_and_grad_buffer.py)'],
    ]),
  );
  return aggregateRankStacks(stacks, topology);
}

/** The slow pipeline: DP replica 2, ranks 16-23 on machines 8-11. */
const slowPipeline = [16, 18, 20, 22];
const slowNodes = ['node-8', 'node-9', 'node-10', 'node-11'];

describe('FailSlowRounds (ByteRobust §5.1 fail-slow mode)', () => {
  it('names no degrader before five rounds are in', () => {
    const rounds = new FailSlowRounds();
    for (let index = 0; index < FAIL_SLOW_ROUNDS - 1; index += 1) {
      const verdict = rounds.add(round([16, 18, 22]));
      expect(verdict.degrader).toBeNull();
      expect(verdict.evict).toEqual([]);
    }
    expect(rounds.verdict().counts[0]).toMatchObject({ kind: 'pp', ranks: slowPipeline, flags: 4 });
  });

  it('after five rounds names the group flagged most often, counting both TP halves of a pipeline as one group of machines', () => {
    const rounds = new FailSlowRounds();
    rounds.add(round([16, 20, 22])); // the slow pipeline
    rounds.add(round([3])); // a rank caught mid-step by chance: its machine
    rounds.add(round([17, 19, 23])); // the slow pipeline again, the other TP half
    rounds.add(round([])); // everyone waiting: nothing to flag
    const verdict = rounds.add(round([16, 18]));
    expect(verdict.roundsSeen).toBe(5);
    expect(verdict.quietRounds).toBe(1);
    expect(verdict.counts).toEqual([
      { kind: 'pp', ranks: [16, 17, 18, 19, 20, 21, 22, 23], nodes: slowNodes, flags: 3, outliers: 8, firstRound: 0 },
      { kind: 'node', ranks: [2, 3], nodes: ['node-1'], flags: 1, outliers: 1, firstRound: 1 },
    ]);
    expect(verdict.degrader?.kind).toBe('pp');
    expect(verdict.evict).toEqual(slowNodes);
  });

  it('breaks a tie in flags by the outliers the groups covered, then by which was flagged first', () => {
    const rounds = new FailSlowRounds();
    rounds.add(round([3]));
    rounds.add(round([16, 18, 20]));
    rounds.add(round([3]));
    rounds.add(round([16, 18, 20, 22]));
    const verdict = rounds.add(round([]));
    expect(verdict.counts.map((count) => [count.nodes.length, count.flags, count.outliers])).toEqual([
      [4, 2, 7],
      [1, 2, 2],
    ]);
    expect(verdict.evict).toEqual(slowNodes);

    const even = new FailSlowRounds(2);
    even.add(round([3]));
    expect(even.add(round([5])).degrader?.nodes).toEqual(['node-1']);
  });

  it('judges the most recent five rounds only', () => {
    const rounds = new FailSlowRounds();
    for (let index = 0; index < 5; index += 1) rounds.add(round([3]));
    for (let index = 0; index < 3; index += 1) rounds.add(round([16, 18, 20, 22]));
    const verdict = rounds.verdict();
    expect(verdict.roundsSeen).toBe(8);
    expect(verdict.counts.map((count) => count.flags)).toEqual([3, 2]);
    expect(verdict.evict).toEqual(slowNodes);
  });

  it('names nothing after five quiet rounds, and refuses a window of no rounds', () => {
    const rounds = new FailSlowRounds();
    let verdict = rounds.verdict();
    for (let index = 0; index < 5; index += 1) verdict = rounds.add(round([]));
    expect(verdict).toEqual({ roundsSeen: 5, roundsNeeded: 5, quietRounds: 5, counts: [], degrader: null, evict: [] });
    expect(() => new FailSlowRounds(0)).toThrow(RangeError);
  });
});
