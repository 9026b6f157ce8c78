import { beforeAll, describe, expect, it } from 'vitest';
import { DEFAULT_SHAPE, MINUTE, HOUR, planFleet, type Confuser, type FaultLabel, type FleetPlan } from '../../bench/heldout/fleet.js';
import { nodeSeries } from '../../bench/heldout/series.js';
import { benignAround } from '../../bench/heldout/score.js';
import { TRAINING, buildTimelines, type NodeTimeline } from '../../bench/heldout/timeline.js';
import { FLEET_1, FLEET_2, FLEET_3, FLEET_4, fleetFromEnv } from '../../bench/heldout/variant.js';
import { planDigest, seriesDigest } from './heldout-digest.js';

/**
 * The held-out fleets' generator, without any detector: fleet 1 is exactly what it was when it
 * was first used (digests computed from the code before fleet 2 was added), and fleet 2 keeps the
 * generator's contract — every fault labelled, its precursor before its failure, the new benign
 * one-node dips present and labelled — and shows the shapes bench/heldout/README.md describes.
 * (The detector must not be run on fleet 2 here or anywhere but the bench: it is held out.)
 */

const START = Date.UTC(2026, 10, 20);

/** Fleet 1 as the bench plans it (DEFAULT_SHAPE), and the nodes whose series are held to a digest: one per fault kind and benign event. */
const FLEET_1_PLAN_DIGEST = '417906370bc6ec612361d92d34230ed5a466a4f8be1c7e0649c266093b448e6d';
const FLEET_1_SERIES_NODES = ['gpu004', 'gpu006', 'gpu025', 'gpu020', 'gpu005', 'gpu026', 'gpu009', 'gpu021', 'gpu064', 'gpu017'];
const FLEET_1_SERIES_DIGEST = '8bc3e8722a17ef75e7562bd1336a0bdc5f4e94bbdc150127176d37edf0f308bd';
/** The small plan of test/bench/heldout-backfill.test.ts, every node. */
const SMALL_PLAN_DIGEST = 'fe1a68bb07685d0992055c02c7d3eade79b7b779a020cfbe1f5060ccfbaf810e';
const SMALL_SERIES_DIGEST = 'fa3284289f9d5b1655021646a569e3c1ced27124465174245f418405456199c5';

const mean = (values: readonly number[]) => values.reduce((sum, value) => sum + value, 0) / Math.max(1, values.length);
const stepOf = (plan: FleetPlan, time: number) => Math.round((time - plan.start) / plan.stepMs);
const range = (from: number, to: number) => Array.from({ length: Math.max(0, to - from) }, (_, index) => from + index);

/** The series of one node, read by family and a label fragment; counters are read step by step from 0, as the writer does. */
class NodeReader {
  private readonly families: ReturnType<typeof nodeSeries>;
  constructor(plan: FleetPlan, node: string, line: NodeTimeline) {
    this.families = nodeSeries(plan, node, line);
  }

  private series(family: string, fragment = '') {
    const list = (this.families.get(family) ?? []).filter((series) => series.key.includes(fragment));
    if (list.length === 0) throw new Error(`no ${family} series with ${fragment}`);
    return list;
  }

  /** A gauge at one step (NaN when not exported). */
  gauge(family: string, fragment: string, step: number): number {
    const series = this.series(family, fragment);
    if (series.length !== 1) throw new Error(`${series.length} ${family} series with ${fragment}`);
    return (series[0] as (typeof series)[number]).value(step) ?? Number.NaN;
  }

  /** The mean over GPUs of a per-GPU gauge at one step. */
  gpuMean(family: string, step: number): number {
    return mean(this.series(family).map((series) => series.value(step) ?? Number.NaN));
  }

  /** A counter's values at every step up to `last` (NaN when not exported). */
  counter(family: string, fragment: string, last: number): Float64Array {
    const [series, ...others] = this.series(family, fragment);
    if (!series || others.length > 0) throw new Error(`not one ${family} series with ${fragment}`);
    const values = new Float64Array(last + 1);
    for (let step = 0; step <= last; step += 1) values[step] = series.value(step) ?? Number.NaN;
    return values;
  }
}

describe('held-out fleet 1', () => {
  it('is the fleet first generated: the same plan and, on a node per fault kind and benign event, the same samples', () => {
    const plan = planFleet({ ...DEFAULT_SHAPE, start: START });
    expect(planDigest(plan)).toBe(FLEET_1_PLAN_DIGEST);
    expect(planDigest(planFleet({ ...DEFAULT_SHAPE, seed: FLEET_1.seed, start: START, variant: FLEET_1 }))).toBe(FLEET_1_PLAN_DIGEST);
    expect(seriesDigest(plan, FLEET_1_SERIES_NODES)).toBe(FLEET_1_SERIES_DIGEST);
    expect(plan.confusers.filter((event) => ['loader_stall', 'rank0_checkpoint', 'uneven_stage'].includes(event.kind))).toEqual([]);
  }, 60_000);

  it('leaves the small plans of the other tests as they were', () => {
    const small = planFleet({ seed: 7, start: START, days: 0.25, stepSeconds: 30, nodes: 8, gpusPerNode: 8, faultKinds: ['silent', 'ib_link', 'hbm_ecc'] });
    expect(planDigest(small)).toBe(SMALL_PLAN_DIGEST);
    expect(seriesDigest(small, small.nodes)).toBe(SMALL_SERIES_DIGEST);
  });
});

describe('STEADFAST_BENCH_HELDOUT_FLEET', () => {
  it('selects fleet 1 by default or by 1, fleet 2 by 2, fleets 3 and 4 by their numbers, and names itself for anything else', () => {
    expect(fleetFromEnv(undefined)).toBe(FLEET_1);
    expect(fleetFromEnv('')).toBe(FLEET_1);
    expect(fleetFromEnv('1')).toBe(FLEET_1);
    expect(fleetFromEnv('2')).toBe(FLEET_2);
    expect(fleetFromEnv(' 3 ')).toBe(FLEET_3);
    expect(fleetFromEnv('4')).toBe(FLEET_4);
    for (const wrong of ['5', 'two', '0', '1.5', '01', 'constructor'])
      expect(() => fleetFromEnv(wrong)).toThrow(/STEADFAST_BENCH_HELDOUT_FLEET must be 1, 2, 3 or 4/);
  });
});

describe('held-out fleet 2', () => {
  let plan: FleetPlan;
  let timelines: Map<string, NodeTimeline>;
  const readers = new Map<string, NodeReader>();
  const reader = (node: string) => {
    const found = readers.get(node) ?? new NodeReader(plan, node, timelines.get(node) as NodeTimeline);
    readers.set(node, found);
    return found;
  };
  const faultsOf = (kind: FaultLabel['kind']) => plan.faults.filter((fault) => fault.kind === kind);
  const confusersOf = <K extends Confuser['kind']>(kind: K) => plan.confusers.filter((event): event is Extract<Confuser, { kind: K }> => event.kind === kind);
  const phaseAt = (jobName: string, time: number) =>
    plan.jobs.find((job) => job.name === jobName)?.phases.find((phase) => phase.from <= time && time < phase.to);
  /** No job phase, no one-node dip of the job, and every listed node training in it, from `from` to `to`. */
  const calm = (jobName: string, nodes: readonly string[], from: number, to: number, except?: Confuser) =>
    range(stepOf(plan, from), stepOf(plan, to)).every((step) => {
      const time = plan.start + step * plan.stepMs;
      if (phaseAt(jobName, time)) return false;
      const dips = plan.confusers.filter(
        (event) =>
          event !== except &&
          (event.kind === 'loader_stall' || event.kind === 'rank0_checkpoint') &&
          event.job === jobName &&
          event.at - 5 * MINUTE <= time &&
          time < event.to + 5 * MINUTE,
      );
      return dips.length === 0 && nodes.every((node) => timelines.get(node)?.mode[step] === TRAINING);
    });

  beforeAll(() => {
    plan = planFleet({ ...DEFAULT_SHAPE, seed: FLEET_2.seed, start: START, variant: FLEET_2 });
    timelines = buildTimelines(plan);
  }, 60_000);

  it('labels the same mix of faults as fleet 1 at other times and nodes, each precursor in its range and before its failure', () => {
    const fleet1 = planFleet({ ...DEFAULT_SHAPE, start: START });
    expect(plan.seed).not.toBe(fleet1.seed);
    expect([...plan.faults.map((fault) => fault.kind)].sort()).toEqual([...fleet1.faults.map((fault) => fault.kind)].sort());
    expect(new Set(plan.faults.map((fault) => fault.id)).size).toBe(plan.faults.length);
    expect(new Set(plan.faults.map((fault) => fault.node)).size).toBe(plan.faults.length);
    for (const fault of plan.faults) {
      expect(fault.precursorStart, fault.id).toBeLessThanOrEqual(fault.failure);
      expect(fault.failure, fault.id).toBeGreaterThan(plan.start);
      expect(fault.failure, fault.id).toBeLessThan(plan.end);
      expect(fault.drainedAt, fault.id).toBeGreaterThan(fault.failure);
      expect(fault.repairedAt, fault.id).toBeGreaterThan(fault.drainedAt);
      const [low, high] = FLEET_2.precursorMinutes[fault.kind];
      const minutes = (fault.failure - fault.precursorStart) / MINUTE;
      expect(minutes, fault.id).toBeGreaterThanOrEqual(low - 1);
      expect(minutes, fault.id).toBeLessThanOrEqual(high + 1);
      if (['hbm_ecc', 'pcie_replay', 'sudden_xid'].includes(fault.kind)) expect(fault.xid, fault.id).toBeDefined();
      if (fault.job) expect(plan.jobs.find((job) => job.name === fault.job)?.nodes, fault.id).toContain(fault.node);
    }
    expect(plan.faults.filter((fault) => fault.job === undefined)).toHaveLength(FLEET_2.idleFaults.length);
    const fleet1Failures = new Set(fleet1.faults.map((fault) => `${fault.node} ${fault.failure}`));
    expect(plan.faults.filter((fault) => fleet1Failures.has(`${fault.node} ${fault.failure}`))).toEqual([]);
    for (const kind of ['sudden_xid', 'silent'] as const) {
      const before = fleet1.faults.filter((fault) => fault.kind === kind).map((fault) => fault.node);
      expect(
        faultsOf(kind).filter((fault) => before.includes(fault.node)),
        kind,
      ).toEqual([]);
    }
  });

  it('labels every benign event, the one-node dips among them, and none of them on a node near its fault', () => {
    const kinds = new Set(plan.confusers.map((event) => event.kind));
    expect([...kinds].sort()).toEqual(['app_xid', 'loader_stall', 'rank0_checkpoint', 'reboot', 'spike', 'uneven_stage']);
    const nearFault = (node: string, at: number) =>
      plan.faults.some((fault) => fault.node === node && at > fault.precursorStart - 2 * HOUR && at < fault.repairedAt + HOUR);
    for (const stall of confusersOf('loader_stall')) {
      const job = plan.jobs.find((candidate) => candidate.name === stall.job);
      expect(job?.nodes).toContain(stall.node);
      expect((stall.to - stall.at) / MINUTE).toBeGreaterThanOrEqual(1);
      expect((stall.to - stall.at) / MINUTE).toBeLessThanOrEqual(15);
      expect(stall.level).toBeGreaterThanOrEqual(0.1);
      expect(stall.level).toBeLessThanOrEqual(0.4);
      expect(nearFault(stall.node, stall.at)).toBe(false);
    }
    for (const job of plan.jobs) {
      const days = (job.to - job.from) / (24 * HOUR);
      const stalls = confusersOf('loader_stall').filter((stall) => stall.job === job.name);
      expect(stalls.length, job.name).toBe(Math.round(FLEET_2.confusers.loaderStallsPerJobDay * days));
      const uneven = confusersOf('uneven_stage').filter((event) => event.job === job.name);
      expect(uneven, job.name).toHaveLength(1);
      expect(plan.faults.some((fault) => fault.node === uneven[0]?.node)).toBe(false);
      const alone = FLEET_2.confusers.rank0CheckpointJobs.includes(job.name);
      const checkpoints = job.phases.filter((phase) => phase.kind === 'checkpoint');
      const rank0 = confusersOf('rank0_checkpoint').filter((event) => event.job === job.name);
      // Rank 0 writes alone in some jobs, every node at once in the others.
      expect(alone ? rank0.length : checkpoints.length, job.name).toBeGreaterThan(5);
      expect(alone ? checkpoints.length : rank0.length, job.name).toBe(0);
      for (const event of rank0) {
        expect(event.node).toBe(job.nodes[0]);
        expect((event.to - event.at) / MINUTE).toBeGreaterThanOrEqual(2);
        expect((event.to - event.at) / MINUTE).toBeLessThanOrEqual(8);
        expect(nearFault(event.node, event.at)).toBe(false);
      }
    }
    const stall = confusersOf('loader_stall')[0] as Confuser;
    expect(benignAround(plan.confusers, { node: stall.node, time: stall.at + MINUTE })).toContain('loader_stall');
  });

  it("warms a thermal fault's GPU and HBM slowly, +8..12 °C over 3–6 h against its own node, with thermal slowdown only near the end", () => {
    for (const fault of faultsOf('thermal')) {
      const node = reader(fault.node);
      const others = range(0, plan.gpusPerNode).filter((gpu) => gpu !== fault.gpu);
      const offset = (family: string, step: number) =>
        node.gauge(family, `gpu="${fault.gpu}"`, step) - mean(others.map((gpu) => node.gauge(family, `gpu="${gpu}"`, step)));
      const window = (family: string, from: number) => mean(range(stepOf(plan, from), stepOf(plan, from + 20 * MINUTE)).map((step) => offset(family, step)));
      const length = fault.failure - fault.precursorStart;
      expect(length).toBeGreaterThanOrEqual(3 * HOUR - MINUTE);
      for (const family of ['steadfast_gpu_temperature_celsius', 'steadfast_gpu_memory_temperature_celsius']) {
        const first = window(family, fault.precursorStart);
        const firstHour = window(family, fault.precursorStart + HOUR - 20 * MINUTE) - first;
        const rise = window(family, fault.failure - 20 * MINUTE) - first;
        expect(rise, `${fault.id} ${family}`).toBeGreaterThan(6);
        expect(rise, `${fault.id} ${family}`).toBeLessThan(13);
        expect(firstHour, `${fault.id} ${family}: slow`).toBeLessThan(0.4 * rise);
      }
      const throttled = (step: number) =>
        node.gauge('steadfast_gpu_throttle_reason', `gpu="${fault.gpu}",pci_bus_id="${pciBus(fault.gpu)}",reason="hw_thermal_slowdown"`, step);
      const early = range(stepOf(plan, fault.precursorStart), stepOf(plan, fault.precursorStart + 0.85 * length));
      expect(
        early.filter((step) => throttled(step) === 1),
        fault.id,
      ).toEqual([]);
      expect(throttled(stepOf(plan, fault.failure) + 1), fault.id).toBe(1);
    }
  });

  it('brakes every GPU of a power-brake board together in rare episodes of one or two samples, capping power and clocks, then holds the brake', () => {
    for (const fault of faultsOf('power_brake')) {
      const node = reader(fault.node);
      const steps = range(stepOf(plan, fault.precursorStart), stepOf(plan, fault.failure));
      const braked = steps.map((step) =>
        range(0, plan.gpusPerNode).map((gpu) =>
          node.gauge('steadfast_gpu_throttle_reason', `gpu="${gpu}",pci_bus_id="${pciBus(gpu)}",reason="hw_power_brake_slowdown"`, step),
        ),
      );
      for (const flags of braked) expect(new Set(flags).size, fault.id).toBe(1);
      const on = braked.map((flags) => flags[0] === 1);
      const count = on.filter(Boolean).length;
      expect(count, fault.id).toBeGreaterThan(0);
      expect(count, fault.id).toBeLessThan(0.05 * steps.length);
      let run = 0;
      for (const flag of on) {
        run = flag ? run + 1 : 0;
        expect(run, fault.id).toBeLessThanOrEqual(2);
      }
      const brakeStep = steps[on.indexOf(true)] as number;
      const clock = node.gpuMean('steadfast_gpu_clock_hertz', brakeStep) / node.gpuMean('steadfast_gpu_clock_hertz', brakeStep - 2);
      expect(clock, fault.id).toBeLessThan(0.7);
      expect(
        node.gauge('steadfast_gpu_throttle_reason', `gpu="0",pci_bus_id="${pciBus(0)}",reason="hw_power_brake_slowdown"`, stepOf(plan, fault.failure) + 1),
      ).toBe(1);
    }
  });

  it('remaps rows only late in a memory fault, and shows a link fault as more receive errors than symbol errors', () => {
    let late = 0;
    for (const fault of faultsOf('hbm_ecc')) {
      const remaps = reader(fault.node).counter('steadfast_gpu_remapped_rows', `gpu="${fault.gpu}"`, stepOf(plan, fault.failure) - 1);
      const at = (time: number) => remaps[stepOf(plan, time)] ?? Number.NaN;
      const length = fault.failure - fault.precursorStart;
      expect(at(fault.precursorStart + 0.75 * length) - at(fault.precursorStart), fault.id).toBe(0);
      if (at(fault.failure - plan.stepMs) > at(fault.precursorStart + 0.75 * length)) late += 1;
    }
    expect(late).toBeGreaterThanOrEqual(3);
    for (const fault of faultsOf('ib_link')) {
      const port = `device="mlx5_${fault.gpu % 4}"`;
      const last = stepOf(plan, fault.failure) - 1;
      const first = Math.max(0, stepOf(plan, fault.precursorStart));
      const symbols = reader(fault.node).counter('steadfast_rdma_port_symbol_errors', port, last);
      const receive = reader(fault.node).counter('steadfast_rdma_port_receive_errors', port, last);
      const received = (receive[last] ?? 0) - (receive[first] ?? 0);
      expect(received, fault.id).toBeGreaterThan(2 * ((symbols[last] ?? 0) - (symbols[first] ?? 0)));
      expect(received, fault.id).toBeGreaterThan(50);
    }
  });

  it("shows a data-loader stall as one node's GPUs, power and RDMA transmit down while its job's other nodes stay busy", () => {
    const stall = confusersOf('loader_stall').find((event) => {
      const job = plan.jobs.find((candidate) => candidate.name === event.job);
      return event.to - event.at >= 4 * MINUTE && job !== undefined && calm(event.job, job.nodes, event.at - 15 * MINUTE, event.to, event);
    });
    if (!stall) throw new Error('no loader stall in a calm stretch of its job');
    const job = plan.jobs.find((candidate) => candidate.name === stall.job);
    const node = reader(stall.node);
    const during = range(stepOf(plan, stall.at) + 1, stepOf(plan, stall.to) - 1);
    const before = range(stepOf(plan, stall.at - 12 * MINUTE), stepOf(plan, stall.at - 2 * MINUTE));
    const utilization = (reading: NodeReader, steps: number[]) => mean(steps.map((step) => reading.gpuMean('steadfast_gpu_utilization_ratio', step)));
    const power = (steps: number[]) => mean(steps.map((step) => node.gpuMean('steadfast_gpu_power_watts', step)));
    expect(utilization(node, before)).toBeGreaterThan(0.8);
    expect(utilization(node, during)).toBeLessThan(0.45);
    expect(utilization(node, during)).toBeGreaterThan(0.05);
    expect(power(during) / power(before)).toBeLessThan(0.6);
    for (const other of (job?.nodes ?? []).filter((name) => name !== stall.node).slice(0, 4))
      expect(utilization(reader(other), during), other).toBeGreaterThan(0.8);
    const sent = node.counter('steadfast_rdma_port_data_transmitted_bytes', 'device="mlx5_0"', stepOf(plan, stall.to));
    const rate = (steps: number[]) => ((sent[steps.at(-1) as number] ?? 0) - (sent[steps[0] as number] ?? 0)) / (steps.length - 1);
    expect(rate(during) / rate(before)).toBeLessThan(0.5);
  });

  it('shows rank 0 writing the checkpoint alone as its GPUs dipping and its GETATTR round trips growing, the other nodes busy', () => {
    const event = confusersOf('rank0_checkpoint').find((candidate) => {
      const job = plan.jobs.find((item) => item.name === candidate.job);
      return (
        candidate.to - candidate.at >= 4 * MINUTE && job !== undefined && calm(candidate.job, job.nodes, candidate.at - 15 * MINUTE, candidate.to, candidate)
      );
    });
    if (!event) throw new Error('no rank-0 checkpoint in a calm stretch of its job');
    const job = plan.jobs.find((candidate) => candidate.name === event.job);
    const node = reader(event.node);
    const during = range(stepOf(plan, event.at) + 1, stepOf(plan, event.to) - 1);
    const before = range(stepOf(plan, event.at - 12 * MINUTE), stepOf(plan, event.at - 2 * MINUTE));
    const utilization = (reading: NodeReader, steps: number[]) => mean(steps.map((step) => reading.gpuMean('steadfast_gpu_utilization_ratio', step)));
    expect(utilization(node, during)).toBeLessThan(0.6 * utilization(node, before));
    for (const other of (job?.nodes ?? []).filter((name) => name !== event.node).slice(0, 4))
      expect(utilization(reader(other), during), other).toBeGreaterThan(0.8);
    const last = stepOf(plan, event.to);
    const rtt = node.counter('steadfast_nfs_rtt_seconds', 'operation="GETATTR"', last);
    const operations = node.counter('steadfast_nfs_operations', 'operation="GETATTR"', last);
    const perOperation = (steps: number[]) => {
      const [first, final] = [steps[0] as number, steps.at(-1) as number];
      return ((rtt[final] ?? 0) - (rtt[first] ?? 0)) / ((operations[final] ?? 0) - (operations[first] ?? 1));
    };
    expect(perOperation(during) / perOperation(before)).toBeGreaterThan(2.5);
  });

  it('keeps one node per job on a lighter pipeline stage 5–10 % below its peers', () => {
    for (const event of confusersOf('uneven_stage')) {
      const job = plan.jobs.find((candidate) => candidate.name === event.job);
      const peers = (job?.nodes ?? []).filter((name) => name !== event.node && !plan.faults.some((fault) => fault.node === name)).slice(0, 3);
      const steps = range(stepOf(plan, event.at + HOUR), stepOf(plan, event.to - HOUR))
        .filter((step) => step % 37 === 0)
        .filter((step) => {
          const time = plan.start + step * plan.stepMs;
          return calm(event.job, [event.node, ...peers], time, time + plan.stepMs);
        });
      expect(steps.length, event.job).toBeGreaterThan(20);
      const utilization = (name: string) => mean(steps.map((step) => reader(name).gpuMean('steadfast_gpu_utilization_ratio', step)));
      const ratio = utilization(event.node) / mean(peers.map(utilization));
      expect(ratio, event.job).toBeGreaterThan(0.88);
      expect(ratio, event.job).toBeLessThan(0.96);
    }
  });
});

function pciBus(gpu: number): string {
  return `0000:${(0x18 + gpu * 0x10).toString(16)}:00`;
}
