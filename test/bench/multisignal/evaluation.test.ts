import { describe, expect, it } from 'vitest';
import { MultiSignalDetector } from '../../../analyzers/multisignal/detector.js';
import type { FeatureMatrix, FeatureValue } from '../../../analyzers/multisignal/types.js';
import { DEFAULT_FEATURES, detectorFeatures } from '../../../analyzers/multisignal/features.js';
import { ClusterReplay } from '../../../bench/multisignal/cluster-replay.js';
import { XidCounterBaseline, runReplay } from '../../../bench/multisignal/evaluation.js';
import { ANY_XID_5M, FAULT_KINDS, REPLAY_FEATURES, type FaultLabel } from '../../../bench/multisignal/labels.js';
import { InputError } from '../../../core/errors.js';

const MINUTE = 60_000;

function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/** One reading of a node: its node-wide value, or that of one device (GPU) of a per-device feature. */
function deviceValue(value: FeatureValue | undefined, device: number): number | undefined {
  return value === undefined ? undefined : typeof value === 'number' ? value : value[device];
}

/** The node's reading (on `device` for a per-device feature) minus the median of all nodes' same reading at the moment (common mode removed). */
function offPeers(matrix: FeatureMatrix, node: string, feature: string, device = 0): number | undefined {
  const own = deviceValue(matrix[node]?.[feature], device);
  const all = Object.values(matrix).flatMap((row) => {
    const value = deviceValue(row[feature], device);
    return value === undefined ? [] : [value];
  });
  return own === undefined ? undefined : own - median(all);
}

describe('the labelled replay generator', () => {
  // Full-strength precursors and no blips or benign transients, so each injected shape can be
  // measured on its own against the noise.
  const replay = new ClusterReplay({
    seed: 3_141,
    nodes: 20,
    days: 2,
    faults: FAULT_KINDS.length,
    strengthRange: [1, 1],
    blipsPerNodeDay: 0,
    benignTransientsPerDay: 0,
  });
  const frames = new Map<number, FeatureMatrix>();
  for (const { time, matrix } of replay.frames()) frames.set(time, matrix);
  const at = (time: number) => frames.get(time) as FeatureMatrix;
  /** Median, over the 3 steps just before `end`, of the node's distance to its peers. */
  const typicalOffPeers = (fault: FaultLabel, feature: string, end: number) =>
    median([1, 2, 3].map((back) => offPeers(at(end - back * MINUTE), fault.node, feature, fault.device) ?? Number.NaN).filter(Number.isFinite));
  /** The first step after the Xid at which the fleet is training (not in a checkpoint stall or restart). */
  const busyAfter = (time: number) => {
    for (let step = time + MINUTE; frames.has(step); step += MINUTE) {
      const matrix = at(step);
      if (median(Object.values(matrix).flatMap((row) => (row[REPLAY_FEATURES.power] === undefined ? [] : [row[REPLAY_FEATURES.power] as number]))) > 500)
        return step;
    }
    throw new Error('the fleet never trained again');
  };

  it('writes exactly the features the default Prometheus queries produce, and the any-Xid count for the baseline', () => {
    expect(Object.values(REPLAY_FEATURES).sort()).toEqual(DEFAULT_FEATURES.map((feature) => feature.name).sort());
    const first = at(replay.config.start);
    expect(Object.keys(first)).toHaveLength(20);
    for (const row of Object.values(first)) expect(Object.keys(row).sort()).toEqual([...Object.values(REPLAY_FEATURES), ANY_XID_5M].sort());
    // Per-GPU features carry one value per GPU, so one GPU of eight is not averaged away.
    for (const feature of [REPLAY_FEATURES.ecc, REPLAY_FEATURES.pcie, REPLAY_FEATURES.slowdown, REPLAY_FEATURES.remapPending]) {
      expect(
        Object.values(first).every((row) => Array.isArray(row[feature]) && (row[feature] as readonly number[]).length === 8),
        feature,
      ).toBe(true);
    }
  });

  it('injects one fault of each kind, on the labelled node, with the fatal Xid counter rising at the Xid (a hung node goes silent instead)', () => {
    expect(replay.faults.map((fault) => fault.kind)).toEqual([...FAULT_KINDS]);
    for (const fault of replay.faults) {
      if (fault.kind === 'hang') {
        // Silent from its onset until drained, while still a member of its job.
        for (let time = fault.onset; time < fault.drained; time += MINUTE) expect(at(time)[fault.node], `hang on ${fault.node}`).toBeUndefined();
        expect(at(fault.onset - MINUTE)[fault.node]).toBeDefined();
        expect(replay.jobOf[Number(fault.node.slice(3)) - 1]).toBeGreaterThanOrEqual(0);
        continue;
      }
      const before = at(fault.xid - MINUTE)[fault.node]?.[REPLAY_FEATURES.xidFatal] as number;
      const after = at(fault.xid)[fault.node]?.[REPLAY_FEATURES.xidFatal] as number;
      expect(after, `${fault.kind} on ${fault.node}`).toBeGreaterThanOrEqual(before + 1);
      expect(at(fault.xid)[fault.node]?.[REPLAY_FEATURES.xidHour], `${fault.kind} on ${fault.node}`).toBeGreaterThanOrEqual(1);
      // Then the job goes on without the node: idle GPUs, no traffic, no iterations.
      const busy = busyAfter(fault.xid);
      expect(busy).toBeLessThan(fault.drained);
      const aftermath = at(busy);
      expect(offPeers(aftermath, fault.node, REPLAY_FEATURES.power)).toBeLessThan(-300);
      expect(aftermath[fault.node]?.[REPLAY_FEATURES.tx]).toBeLessThan(0.1 * median(Object.values(aftermath).map((row) => row[REPLAY_FEATURES.tx] as number)));
      expect(aftermath[fault.node]?.[REPLAY_FEATURES.iteration]).toBeUndefined();
      // Drained: gone from the fleet until repaired.
      expect(at(fault.drained)[fault.node]).toBeUndefined();
      expect(at(fault.drained - MINUTE)[fault.node]).toBeDefined();
      if (frames.has(fault.repaired)) expect(at(fault.repaired)[fault.node]).toBeDefined();
    }
  });

  it('logs no Xid except on the node of a labelled fault, from its Xid on', () => {
    const unlabelled: string[] = [];
    for (const [time, matrix] of frames) {
      for (const [node, row] of Object.entries(matrix)) {
        if ((row[ANY_XID_5M] ?? 0) === 0 && (row[REPLAY_FEATURES.xidHour] ?? 0) === 0) continue;
        if (!replay.faults.some((fault) => fault.node === node && time >= fault.xid && time < fault.drained))
          unlabelled.push(`${node} at ${new Date(time).toISOString()}`);
      }
    }
    expect(unlabelled).toEqual([]);
  });

  it("grows each precursor from its onset to the Xid, gives a sudden fault none, and brakes a power-brake fault's GPU in separate short episodes", () => {
    const grows = (fault: FaultLabel, feature: string) => typicalOffPeers(fault, feature, fault.xid) - typicalOffPeers(fault, feature, fault.onset);
    // At full strength a precursor ends at: +18 °C, +30 correctable errors per 10 minutes, +1 PCIe
    // replay per second, +8 % iteration time. Asked for here: at least 15 % of that, which the
    // quadratic ramp reaches in the last minutes of even the shortest lead.
    const fullEffect = {
      thermal: [REPLAY_FEATURES.temp, 18],
      memory: [REPLAY_FEATURES.ecc, 30],
      pcie: [REPLAY_FEATURES.pcie, 1],
      slowdown: [REPLAY_FEATURES.iteration, 4.2 * 0.08],
    } as const;
    for (const fault of replay.faults) {
      const label = `${fault.kind} on ${fault.node}`;
      expect(fault.strength).toBe(1);
      if (fault.kind === 'sudden') {
        expect(fault.onset, label).toBe(fault.xid);
        continue;
      }
      if (fault.kind === 'hang') continue; // silent: nothing to read (the injection test checks)
      if (fault.kind === 'powerbrake') {
        // The GPU's 5-minute braked share climbs for a minute or two at each brake: count those climbs.
        const share = (time: number) => deviceValue(at(time)[fault.node]?.[REPLAY_FEATURES.slowdown], fault.device) ?? 0;
        const runs: number[] = [];
        let current = 0;
        for (let time = fault.onset + MINUTE; time < fault.xid; time += MINUTE) {
          if (share(time) > share(time - MINUTE)) current += 1;
          else if (current > 0) {
            runs.push(current);
            current = 0;
          }
        }
        expect(runs.length, label).toBeGreaterThanOrEqual(2);
        expect(Math.max(...runs), label).toBeLessThanOrEqual(2);
        continue;
      }
      expect(fault.xid - fault.onset, label).toBeGreaterThanOrEqual(10 * MINUTE);
      const [feature, full] = fullEffect[fault.kind];
      expect(grows(fault, feature), label).toBeGreaterThan(0.15 * full);
    }
  });

  it('is the same replay for the same seed and on every pass, and another for another seed', () => {
    const firstFrames = (replay: ClusterReplay) => {
      const frames = replay.frames();
      return [frames.next().value, frames.next().value];
    };
    const five = new ClusterReplay({ seed: 5, nodes: 8, days: 0.01, faults: 0 });
    expect(firstFrames(five)).toEqual(firstFrames(new ClusterReplay({ seed: 5, nodes: 8, days: 0.01, faults: 0 })));
    expect(firstFrames(five)).toEqual(firstFrames(five));
    expect(firstFrames(five)).not.toEqual(firstFrames(new ClusterReplay({ seed: 6, nodes: 8, days: 0.01, faults: 0 })));
  });

  it('refuses a configuration it cannot honour, naming the field', () => {
    expect(() => new ClusterReplay({ seed: 1, nodes: 0 })).toThrow(/nodes/);
    expect(() => new ClusterReplay({ seed: 1, days: 0.2 })).toThrow(InputError);
    expect(() => new ClusterReplay({ seed: 1, strengthRange: [2, 1] })).toThrow(/strengthRange: low must not exceed high/);
  });
});

describe('the multi-signal detector on a held-out replay', () => {
  // The detector's defaults were tuned on seed 1 (bench/multisignal.ts prints it as "tuning");
  // seed 11 was never looked at while tuning. 63 nodes as in the 504-GPU report (002), 6 days.
  it('finds every fault, a fifth or more before the Xid, at ≤ 0.84 false positives a day on 63 nodes', () => {
    const replay = new ClusterReplay({ seed: 11, days: 6, faults: 6 });
    const [report, xidOnly] = runReplay(replay, [new MultiSignalDetector({ features: detectorFeatures() }), new XidCounterBaseline()]);
    if (!report || !xidOnly) throw new Error('runReplay returned fewer reports than detectors');
    const summary = report.faults.map((fault) => `${fault.kind}:${fault.leadMinutes ?? 'missed'}`).join(' ');
    expect(report.detectionRate, summary).toBe(1);
    expect(report.beforeXidShare, summary).toBeGreaterThanOrEqual(0.2);
    expect(report.falsePositivesPerDayAt63, `${report.falseEpisodes} false episodes`).toBeLessThanOrEqual(0.84);
    // Every fault ends in an Xid, so the Xid counter alone finds them all, but never before the Xid.
    expect(xidOnly.detectionRate).toBe(1);
    expect(xidOnly.foundBeforeXid).toBe(0);
  }, 180_000);
});
