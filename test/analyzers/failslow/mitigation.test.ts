import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  initialMitigationState,
  stepMitigation,
  type MitigationConfig,
  type MitigationObservation,
  type MitigationState,
} from '../../../analyzers/failslow/mitigation.js';
import { planMicrobatches } from '../../../analyzers/microbatch.js';
import { NodeLayout, planCongestedLinkSwaps, planStragglerConsolidation, planTopologyAdjustment } from '../../../analyzers/topology-adjust.js';
import { InputError } from '../../../core/errors.js';
import { Topology } from '../../../core/topology.js';

// Hand-computed ski-rental points: healthy 1 s; every cost is a whole number of excess seconds.
const config: MitigationConfig = { costSeconds: { S2: 10, S3: 60, S4: 600 }, microbatches: 16, dpGroups: 4 };
const healthySeconds = 1;

/** Feeds one-iteration observations until the strategy changes; returns how many it took and the step. */
function runUntilChange(state: MitigationState, observation: Omit<MitigationObservation, 'iterations' | 'healthySeconds'>, limit = 100_000) {
  let current = state;
  for (let fed = 1; fed <= limit; fed += 1) {
    const step = stepMitigation(current, { iterations: 1, healthySeconds, ...observation }, config);
    if (step.strategy !== current.strategy) return { fed, step };
    current = step.state;
  }
  throw new Error(`no change within ${limit} observations`);
}

describe('stepMitigation (Greyhound §5.1, Algorithm 1)', () => {
  it('escalates S1 → S2 → S3 → S4 exactly when the seconds lost under the current strategy reach the next cost', () => {
    const s2 = runUntilChange(initialMitigationState(config), { iterationSeconds: 1.5, persists: true }); // 0.5 s lost per iteration
    expect(s2.fed).toBe(20); // 20 × 0.5 = 10 = cost of S2
    expect(s2.step).toMatchObject({ strategy: 'S2', action: 'escalate', lostSeconds: 0, next: { strategy: 'S3', costSeconds: 60 }, restart: false });
    expect(s2.step.citation).toContain('§5.2');
    expect(s2.step.citation).toContain('Algorithm 1');

    const s3 = runUntilChange(s2.step.state, { iterationSeconds: 1.25, persists: true }); // S2 helps: 0.25 s lost
    expect(s3.fed).toBe(240); // 240 × 0.25 = 60
    expect(s3.step).toMatchObject({ strategy: 'S3', action: 'escalate', next: { strategy: 'S4', costSeconds: 600 } });

    const s4 = runUntilChange(s3.step.state, { iterationSeconds: 1.125, persists: true });
    expect(s4.fed).toBe(4800); // 4800 × 0.125 = 600
    expect(s4.step).toMatchObject({ strategy: 'S4', action: 'escalate', next: null, restart: true });

    const after = stepMitigation(s4.step.state, { iterations: 1000, iterationSeconds: 1.5, healthySeconds, persists: true }, config);
    expect(after).toMatchObject({ strategy: 'S4', action: 'none', restart: false });
    expect(after.reason).toContain('last resort');
  });

  it('stays one iteration short of each switching point', () => {
    let state = initialMitigationState(config);
    const step = stepMitigation(state, { iterations: 19, iterationSeconds: 1.5, healthySeconds, persists: true }, config);
    expect(step).toMatchObject({ strategy: 'S1', action: 'none', lostSeconds: 9.5 });
    state = step.state;
    expect(stepMitigation(state, { iterations: 1, iterationSeconds: 1.5, healthySeconds, persists: true }, config).strategy).toBe('S2');
  });

  it('never leaves a strategy that cures the slow-down', () => {
    let state = stepMitigation(initialMitigationState(config), { iterations: 20, iterationSeconds: 1.5, healthySeconds, persists: true }, config).state;
    expect(state.strategy).toBe('S2');
    for (let i = 0; i < 10_000; i += 1) {
      state = stepMitigation(state, { iterations: 1, iterationSeconds: 1, healthySeconds, persists: true }, config).state;
    }
    expect(state).toMatchObject({ strategy: 'S2', lostSeconds: 0, slowIterations: 10_020 });
  });

  it('climbs at most one rung per observation, however long it covers', () => {
    const step = stepMitigation(initialMitigationState(config), { iterations: 1_000_000, iterationSeconds: 2, healthySeconds, persists: true }, config);
    expect(step).toMatchObject({ strategy: 'S2', lostSeconds: 0 });
  });

  it('resets to S1 with the even split and the original placement when the fail-slow ends, and starts over on the next', () => {
    const topology = Topology.from({ nodes: ['a', 'b', 'c', 'd'], ranksPerNode: 1, dp: 2, pp: 2 });
    const withTopology = { ...config, topology };
    let state = initialMitigationState(withTopology);
    state = stepMitigation(state, { iterations: 20, iterationSeconds: 1.5, healthySeconds, persists: true, dpGroupSeconds: [1, 1, 2, 1] }, withTopology).state;
    state = stepMitigation(state, { iterations: 240, iterationSeconds: 1.25, healthySeconds, persists: true, slowRanks: [0, 3] }, withTopology).state;
    expect(state.strategy).toBe('S3');
    expect(state.microbatches.rebalanced).toBe(true);
    expect(state.topologyPlan?.swaps.length).toBeGreaterThan(0);

    const over = stepMitigation(state, { iterations: 1, iterationSeconds: 1, healthySeconds, persists: false }, withTopology);
    expect(over).toMatchObject({ strategy: 'S1', action: 'reset', lostSeconds: 0, topologyPlan: null, restart: false });
    expect(over.microbatches).toEqual({ assignment: [4, 4, 4, 4], rebalanced: false, predictedSeconds: null });

    const again = runUntilChange(over.state, { iterationSeconds: 1.5, persists: true });
    expect(again.fed).toBe(20);
  });

  it('serves the exact S2 assignment for the profiled DP groups and re-solves it on a fresh profile', () => {
    const slowGroup = [0.5, 0.5, 1, 0.5];
    const s2 = stepMitigation(
      initialMitigationState(config),
      { iterations: 20, iterationSeconds: 1.5, healthySeconds, persists: true, dpGroupSeconds: slowGroup },
      config,
    );
    const exact = planMicrobatches(slowGroup, 16);
    expect(s2.microbatches).toEqual({ assignment: exact.assignment, rebalanced: true, predictedSeconds: 2.5 });
    expect(s2.microbatches.assignment[2]).toBe(2); // the group twice as slow gets the fewest

    const recovered = [0.5, 0.5, 0.5, 0.5];
    const next = stepMitigation(s2.state, { iterations: 1, iterationSeconds: 1.1, healthySeconds, persists: true, dpGroupSeconds: recovered }, config);
    expect(next).toMatchObject({ strategy: 'S2', action: 'rebalance' });
    expect(next.microbatches.assignment).toEqual([4, 4, 4, 4]);
  });

  it('keeps 1F1B counts at multiples of the pipeline depth', () => {
    const piped: MitigationConfig = { ...config, microbatches: 32, pipelineStages: 4 };
    const step = stepMitigation(
      initialMitigationState(piped),
      { iterations: 20, iterationSeconds: 1.5, healthySeconds, persists: true, dpGroupSeconds: [1, 1, 3, 1] },
      piped,
    );
    expect(step.microbatches.assignment.every((count) => count % 4 === 0)).toBe(true);
    expect(step.microbatches.assignment.reduce((sum, count) => sum + count, 0)).toBe(32);
  });

  it('skips S2 for a communication fail-slow, where rebalancing has no effect (Table 2)', () => {
    const state = initialMitigationState(config);
    const at10 = stepMitigation(state, { iterations: 20, iterationSeconds: 1.5, healthySeconds, persists: true, rootCause: 'communication' }, config);
    expect(at10).toMatchObject({ strategy: 'S1', next: { strategy: 'S3', costSeconds: 60 } });
    const at60 = stepMitigation(at10.state, { iterations: 100, iterationSeconds: 1.5, healthySeconds, persists: true }, config);
    expect(at60).toMatchObject({ strategy: 'S3', action: 'escalate' });
  });

  it.each([
    { what: 'a DP profile of the wrong length', observation: { dpGroupSeconds: [1, 1] }, field: 'dpGroupSeconds' },
    { what: 'a negative iteration time', observation: { iterationSeconds: -1 }, field: 'iterationSeconds' },
    { what: 'a fractional iteration count', observation: { iterations: 1.5 }, field: 'iterations' },
  ])('rejects $what with an InputError naming $field', ({ observation, field }) => {
    let caught: unknown;
    try {
      stepMitigation(initialMitigationState(config), { iterations: 1, iterationSeconds: 1, healthySeconds, persists: true, ...observation }, config);
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(InputError);
    expect((caught as InputError).field).toBe(field);
  });

  it('rejects a config whose micro-batches cannot be split over the groups', () => {
    expect(() => initialMitigationState({ ...config, microbatches: 3 })).toThrow(InputError);
    expect(() => initialMitigationState({ ...config, costSeconds: { S2: -1, S3: 1, S4: 1 } })).toThrow(InputError);
  });
});

/** The objective S3 consolidation minimises, in order: slow stages, slow edge stages, moved nodes. */
function objective(layout: NodeLayout, slowNodes: readonly string[], pipelineStages: number): [number, number, number] {
  const stages = new Set(slowNodes.map((node) => layout.stagesOf(node)[0] as number));
  const edges = [...stages].filter((stage) => stage === 0 || stage === pipelineStages - 1).length;
  const moved = new Set(layout.movesFromTopology().map((move) => move.toNode)).size;
  return [stages.size, edges, moved];
}

function bruteForce(topology: Topology, slowNodes: readonly string[], pipelineStages: number): [number, number, number] {
  const start = new NodeLayout(topology);
  const nodes = start.nodes;
  const slotStage = nodes.map((node) => start.stagesOf(node)[0] as number);
  const slow = nodes.map((node) => slowNodes.includes(node));
  let best: [number, number, number] = [Infinity, Infinity, Infinity];
  const taken = nodes.map(() => false);
  const slotOf: number[] = [];
  const visit = (node: number): void => {
    if (node === nodes.length) {
      const stages = new Set(slotOf.filter((_, index) => slow[index]).map((slot) => slotStage[slot] as number));
      const edges = [...stages].filter((stage) => stage === 0 || stage === pipelineStages - 1).length;
      const moved = slotOf.filter((slot, index) => slot !== index).length;
      const candidate: [number, number, number] = [stages.size, edges, moved];
      if (compare(candidate, best) < 0) best = candidate;
      return;
    }
    for (let slot = 0; slot < nodes.length; slot += 1) {
      if (taken[slot]) continue;
      taken[slot] = true;
      slotOf.push(slot);
      visit(node + 1);
      slotOf.pop();
      taken[slot] = false;
    }
  };
  visit(0);
  return best;
}

function compare(a: readonly number[], b: readonly number[]): number {
  for (let index = 0; index < a.length; index += 1) if (a[index] !== b[index]) return (a[index] as number) - (b[index] as number);
  return 0;
}

describe('S3 straggler consolidation (Greyhound §5.2, Figure 12)', () => {
  it('matches the brute-force optimum over every node permutation on small layouts', () => {
    const layouts = fc
      .record({ dp: fc.integer({ min: 1, max: 3 }), pp: fc.integer({ min: 2, max: 4 }), tp: fc.integer({ min: 1, max: 2 }) })
      .filter(({ dp, pp }) => dp * pp <= 7)
      .chain((sizes) => fc.tuple(fc.constant(sizes), fc.subarray(Array.from({ length: sizes.dp * sizes.pp * sizes.tp }, (_, rank) => rank))));
    fc.assert(
      fc.property(layouts, ([{ dp, pp, tp }, slowRanks]) => {
        const nodes = Array.from({ length: dp * pp }, (_, index) => `node${index}`);
        const topology = Topology.from({ nodes, ranksPerNode: tp, tp, dp, pp });
        const plan = planStragglerConsolidation(topology, slowRanks);
        const after = plan.swaps.reduce((layout, swap) => layout.swapped(swap.nodes[0], swap.nodes[1]), new NodeLayout(topology));
        const achieved = objective(after, plan.slowNodes, pp);
        expect(achieved).toEqual(bruteForce(topology, plan.slowNodes, pp));
        expect(plan.stagesAfter).toHaveLength(achieved[0]);
        expect(plan.minimumStages).toBe(Math.ceil(plan.slowNodes.length / dp));
      }),
      { numRuns: 60 },
    );
  });

  it('gathers two stragglers scattered over two stages into one interior stage', () => {
    // dp 2, pp 4, one node per (dp, pp) cell: order tp-dp-pp puts node i at dp = i % 2, pp = ⌊i / 2⌋.
    const topology = Topology.from({ nodes: ['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7'], ranksPerNode: 1, dp: 2, pp: 4 });
    const plan = planStragglerConsolidation(topology, [2, 5]); // n2 in stage 1, n5 in stage 2
    expect(plan).toMatchObject({ slowNodes: ['n2', 'n5'], stagesBefore: [1, 2], stagesAfter: [1], minimumStages: 1, note: null });
    expect(plan.swaps.map((swap) => swap.nodes)).toEqual([['n5', 'n3']]);
  });
});

describe('S3 congested link from DP to PP (Greyhound §5.2, Figure 11)', () => {
  // Node a (dp 0, pp 0), b (dp 1, pp 0), c (dp 0, pp 1), d (dp 1, pp 1): c–d carries DP traffic.
  const topology = Topology.from({ nodes: ['a', 'b', 'c', 'd'], ranksPerNode: 1, dp: 2, pp: 2 });

  it('exchanges one end of the congested DP link with its pipeline neighbour so the link carries PP only', () => {
    const plan = planCongestedLinkSwaps(topology, [['c', 'd']]);
    expect(plan.swaps.map((swap) => swap.nodes)).toEqual([['c', 'b']]);
    expect(plan.links).toEqual([{ link: ['c', 'd'], trafficBefore: ['dp'], trafficAfter: ['pp'], relieved: true }]);
  });

  it('leaves a link that already carries only PP traffic alone', () => {
    const plan = planCongestedLinkSwaps(topology, [['a', 'c']]);
    expect(plan.swaps).toEqual([]);
    expect(plan.links[0]).toMatchObject({ trafficBefore: ['pp'], relieved: true });
  });

  it('lists the ranks that change node, and rejects an unknown node', () => {
    const plan = planTopologyAdjustment(topology, { congestedLinks: [['c', 'd']] });
    expect(plan.moves).toEqual([
      { rank: 1, fromNode: 'b', toNode: 'c' },
      { rank: 2, fromNode: 'c', toNode: 'b' },
    ]);
    expect(() => planCongestedLinkSwaps(topology, [['c', 'nowhere']])).toThrow(InputError);
  });
});
