import { describe, expect, it } from 'vitest';
import { Topology } from '../../core/topology.js';
import { lossProbability, planBackups } from '../../actuators/backup-placement.js';
import { optimalCheckpointInterval } from '../../actuators/checkpoint-interval.js';
import { standbyPoolSize } from '../../actuators/standby-sizing.js';

describe('warm standby pool size (ByteRobust §6.2)', () => {
  it('gives 4 standbys for 1,024 machines at a 0.1 % daily failure rate, as ByteRobust provisions', () => {
    const sizing = standbyPoolSize(1024, 0.001);
    expect(sizing.standby).toBe(4);
    expect(sizing.coverage).toBeGreaterThanOrEqual(0.99);
    // Three would cover only about 98 % of days.
    expect(standbyPoolSize(1024, 0.001, 0.97).standby).toBe(3);
  });

  it('returns the median of Binomial(10, 0.5) for the 0.5 quantile, and the edges exactly', () => {
    expect(standbyPoolSize(10, 0.5, 0.5).standby).toBe(5);
    expect(standbyPoolSize(100, 0).standby).toBe(0);
    expect(standbyPoolSize(100, 1).standby).toBe(100);
  });

  it('stays finite for a 100,000-machine fleet', () => {
    const sizing = standbyPoolSize(100_000, 0.0005);
    expect(sizing.standby).toBeGreaterThan(50);
    expect(sizing.standby).toBeLessThan(80);
  });

  it('rejects a rate outside 0..1 naming the field', () => {
    expect(() => standbyPoolSize(10, 1.5)).toThrow(/daily failure rate/);
  });
});

describe('checkpoint interval (Young, Daly)', () => {
  it('gives Young √(2·60·3600) ≈ 657.3 s and Daly ≈ 617.9 s for a 1 h MTBF and a 60 s checkpoint', () => {
    const interval = optimalCheckpointInterval(1, 60);
    expect(interval.youngSeconds).toBeCloseTo(657.27, 1);
    expect(interval.dalySeconds).toBeCloseTo(617.88, 1);
  });

  it('falls back to checkpointing every MTBF when a checkpoint takes longer than twice the MTBF', () => {
    expect(optimalCheckpointInterval(0.01, 100).dalySeconds).toBe(36);
  });
});

describe('checkpoint backup placement (ByteRobust §6.3, Fig. 9)', () => {
  const fig9 = Topology.from({ nodes: ['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7'], ranksPerNode: 2, tp: 2, pp: 4, dp: 2, order: 'tp-dp-pp' });

  it("puts every backup on a node that hosts none of the rank's TP, PP or DP groups", () => {
    const plan = planBackups(fig9);
    expect(plan.fallbacks).toBe(0);
    for (const { rank, holders, level } of plan.placements) {
      expect(level).toBe('outside-groups');
      expect(holders).toHaveLength(1);
      const groupNodes = new Set(fig9.nodesOf([...fig9.group('tp', rank), ...fig9.group('pp', rank), ...fig9.group('dp', rank)]));
      for (const holder of holders) expect(groupNodes.has(fig9.placement(holder).node)).toBe(false);
    }
  });

  it('backs up ranks 8 and 9 on a machine outside their groups, as Fig. 9 pairs them with ranks 2 and 3', () => {
    const plan = planBackups(fig9);
    const holderNodes = [8, 9].map((rank) => fig9.placement(plan.placements[rank]?.holders[0] ?? -1).node);
    for (const node of holderNodes) expect(['n1', 'n3', 'n7']).toContain(node);
  });

  it('spreads backups evenly over the nodes', () => {
    const plan = planBackups(fig9, { replicas: 2 });
    const perNode = new Map<string, number>();
    for (const { holders } of plan.placements)
      for (const holder of holders) perNode.set(fig9.placement(holder).node, (perNode.get(fig9.placement(holder).node) ?? 0) + 1);
    expect(Math.max(...perNode.values()) - Math.min(...perNode.values())).toBeLessThanOrEqual(1);
  });

  it('places replicas on different racks when racks are given', () => {
    const racks = { n0: 'r0', n1: 'r0', n2: 'r1', n3: 'r1', n4: 'r2', n5: 'r2', n6: 'r3', n7: 'r3' };
    const plan = planBackups(fig9, { replicas: 2, racks });
    for (const { rank, holders } of plan.placements) {
      const holderRacks = holders.map((holder) => racks[fig9.placement(holder).node as keyof typeof racks]);
      expect(new Set(holderRacks).size, `rank ${rank}`).toBe(holders.length);
    }
  });

  it('falls back to other machines for pure data parallelism, and says so', () => {
    const zero = Topology.from({ nodes: ['a', 'b', 'c', 'd'], ranksPerNode: 1, dp: 4 });
    const plan = planBackups(zero);
    expect(plan.fallbacks).toBe(4);
    expect(plan.placements.every((placement) => placement.level === 'other-node' && placement.holders.length === 1)).toBe(true);
  });

  it('computes the loss probability by hand for PP=2, DP=2 on four nodes', () => {
    const small = Topology.from({ nodes: ['n0', 'n1', 'n2', 'n3'], ranksPerNode: 1, pp: 2, dp: 2, order: 'tp-dp-pp' });
    const plan = planBackups(small, { nodeFailureRate: 0.1 });
    expect(plan.placements.map((placement) => placement.holders)).toEqual([[3], [2], [1], [0]]);
    // Shard 0 is lost if n0 fails and its holder (rank 3 on n3) is lost: n3 fails, or n1 or n2
    // fails and over-eviction of rank 3's PP / DP group takes n3 along.
    const shard = 0.1 * (1 - 0.9 ** 3);
    expect(plan.perShardLossProbability).toBeCloseTo(shard, 12);
    expect(plan.lossProbability).toBeCloseTo(1 - (1 - shard) ** 4, 12);
    expect(lossProbability(small, plan.placements, 0).lossProbability).toBe(0);
  });
});
