import { beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_SHAPE, HOUR, MINUTE, planFleet, type Confuser, type FleetPlan } from '../../bench/heldout/fleet.js';
import { nodeSeries } from '../../bench/heldout/series.js';
import { benignAround } from '../../bench/heldout/score.js';
import { buildTimelines, type NodeTimeline } from '../../bench/heldout/timeline.js';
import { FLEET_1, FLEET_2, FLEET_3, FLEET_4, type FleetVariant } from '../../bench/heldout/variant.js';

/**
 * Held-out fleets 3 and 4's generator, without any detector (the detector runs on a held-out
 * fleet in the bench only): the same mix of labelled faults as the fleets before them at other
 * times and nodes, in each fleet's ranges, and the benign event they add — GPUs of healthy nodes
 * that trickle PCIe replays for the whole period — labelled and present in the series.
 */

const START = Date.UTC(2026, 10, 20);

const LATER: { id: number; variant: FleetVariant; earlier: FleetVariant[] }[] = [
  { id: 3, variant: FLEET_3, earlier: [FLEET_1, FLEET_2] },
  { id: 4, variant: FLEET_4, earlier: [FLEET_1, FLEET_2, FLEET_3] },
];

describe.each(LATER)('held-out fleet $id', ({ variant, earlier }) => {
  let plan: FleetPlan;
  let timelines: Map<string, NodeTimeline>;
  const trickles = () => plan.confusers.filter((event): event is Extract<Confuser, { kind: 'replay_trickle' }> => event.kind === 'replay_trickle');

  beforeAll(() => {
    plan = planFleet({ ...DEFAULT_SHAPE, seed: variant.seed, start: START, variant });
    timelines = buildTimelines(plan);
  }, 60_000);

  it('labels the same mix of faults as the fleets before it at other times and nodes, each precursor in its range', () => {
    const others = earlier.map((before) => planFleet({ ...DEFAULT_SHAPE, seed: before.seed, start: START, variant: before }));
    const kinds = (fleet: FleetPlan) => fleet.faults.map((fault) => fault.kind).sort();
    for (const other of others) {
      expect(kinds(plan)).toEqual(kinds(other));
      const failures = new Set(other.faults.map((fault) => `${fault.node} ${fault.failure}`));
      expect(plan.faults.filter((fault) => failures.has(`${fault.node} ${fault.failure}`))).toEqual([]);
    }
    expect(new Set(plan.faults.map((fault) => fault.node)).size).toBe(plan.faults.length);
    for (const fault of plan.faults) {
      const [low, high] = variant.precursorMinutes[fault.kind];
      const minutes = (fault.failure - fault.precursorStart) / MINUTE;
      expect(minutes, fault.id).toBeGreaterThanOrEqual(low - 1);
      expect(minutes, fault.id).toBeLessThanOrEqual(high + 1);
      expect(fault.failure, fault.id).toBeLessThan(plan.end);
    }
    expect(plan.faults.filter((fault) => fault.job === undefined)).toHaveLength(variant.idleFaults.length);
    const kindsOfEvents = new Set(plan.confusers.map((event) => event.kind));
    expect([...kindsOfEvents].sort()).toEqual(['app_xid', 'loader_stall', 'rank0_checkpoint', 'reboot', 'replay_trickle', 'spike', 'uneven_stage']);
  });

  it('trickles PCIe replays on GPUs of nodes that never fault, for the whole period, at their drawn rate', () => {
    const settings = variant.confusers.replayTrickles;
    expect(trickles()).toHaveLength(settings?.gpus ?? -1);
    const last = Math.floor((plan.end - plan.start) / plan.stepMs) - 1;
    for (const trickle of trickles()) {
      expect(
        plan.faults.some((fault) => fault.node === trickle.node),
        trickle.node,
      ).toBe(false);
      expect(trickle.perSample).toBeGreaterThanOrEqual(settings?.perSample[0] ?? Number.NaN);
      expect(trickle.perSample).toBeLessThanOrEqual(settings?.perSample[1] ?? Number.NaN);
      expect([trickle.at, trickle.to]).toEqual([plan.start, plan.end]);
      const series = (nodeSeries(plan, trickle.node, timelines.get(trickle.node) as NodeTimeline).get('steadfast_gpu_pcie_replay_errors') ?? []).find((entry) =>
        entry.key.includes(`gpu="${trickle.gpu}"`),
      );
      if (!series) throw new Error(`no replay counter on ${trickle.node} GPU ${trickle.gpu}`);
      // Read from the start (the counter restarts after a reboot): replays per sample over the period, and in most 5-minute slots of the first day.
      let added = 0;
      let previous = 0;
      let slotsWithReplays = 0;
      let slotStart = 0;
      for (let step = 0; step <= last; step += 1) {
        const value = series.value(step);
        if (value === undefined) continue;
        const increase = value >= previous ? value - previous : value;
        added += increase;
        previous = value;
        if (step < (24 * HOUR) / plan.stepMs && step % 10 === 9) {
          if (value > slotStart) slotsWithReplays += 1;
          slotStart = value;
        }
      }
      expect(added / (last + 1), trickle.node).toBeGreaterThan(0.8 * trickle.perSample);
      expect(added / (last + 1), trickle.node).toBeLessThan(1.2 * trickle.perSample + 0.001);
      expect(slotsWithReplays, trickle.node).toBeGreaterThan(0.2 * 288);
    }
    const first = trickles()[0] as Confuser;
    expect(benignAround(plan.confusers, { node: first.node, time: plan.start + 30 * HOUR })).toContain('replay_trickle');
  });
});
