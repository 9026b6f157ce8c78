import { MINUTE, type FaultLabel, type FleetPlan } from './fleet.js';
import { FLEET_1, type FaultEffects } from './variant.js';

/**
 * What every node is doing at every scrape, and what each fault does to its GPU, port or mount at
 * a given step: the state bench/heldout/series.ts draws the metrics from. Pure functions of the
 * plan and the step, so that each series can be written on its own, in any order.
 */

export const DOWN = 0;
export const IDLE = 1;
export const TRAINING = 2;
/** In a job whose processes are gone (crashed, restarting). */
export const STOPPED = 3;

export interface NodeTimeline {
  readonly mode: Uint8Array;
  /** Utilization a healthy GPU of the node shows (0..1). */
  readonly load: Float32Array;
  /** Seconds per training iteration, NaN when no training process runs. */
  readonly iteration: Float32Array;
  /** Share of the node's usual RDMA traffic it moves. */
  readonly traffic: Float32Array;
  /** Checkpoint I/O: 1 when every node of the job writes at once (sharing the NFS RPC slots), 2 when this node writes alone (rank 0). */
  readonly checkpoint: Uint8Array;
  /** Index of the job (plan.jobs) the node runs at the step, -1 for none. */
  readonly job: Int8Array;
}

/** A deterministic uniform number per (key, step): the same on every series that asks. */
export function noise(key: number, step: number): number {
  let state = (Math.imul(key, 0x9e3779b1) ^ Math.imul(step, 0x85ebca77)) >>> 0;
  state = Math.imul(state ^ (state >>> 16), 0x7feb352d);
  state = Math.imul(state ^ (state >>> 15), 0x846ca68b);
  return ((state ^ (state >>> 16)) >>> 0) / 2 ** 32;
}

/** Roughly normal (sum of three uniforms), mean 0, standard deviation about 1. */
export function gaussian(key: number, step: number): number {
  return (noise(key, step) + noise(key + 7919, step) + noise(key + 104729, step) - 1.5) * 2;
}

export function faultKey(fault: FaultLabel): number {
  return Number(fault.id.slice(1)) * 1_000_003;
}

/** Short episodes that start with `probability` per step and last `length` steps. */
export function inEpisode(key: number, step: number, probability: number, length: number): boolean {
  for (let back = 0; back < length; back += 1) if (noise(key, step - back) < probability) return true;
  return false;
}

/** Like inEpisode, each episode lasting from `shortest` to `longest` steps (drawn per episode). */
function inEpisodeOf(key: number, step: number, probability: number, [shortest, longest]: readonly [number, number]): boolean {
  if (shortest === longest) return inEpisode(key, step, probability, shortest);
  for (let back = 0; back < longest; back += 1) {
    if (noise(key, step - back) < probability && back < shortest + Math.floor(noise(key + 1, step - back) * (longest - shortest + 1))) return true;
  }
  return false;
}

/** The effects of the variant the plan was drawn from. */
export function effectsOf(plan: FleetPlan): FaultEffects {
  return (plan.variant ?? FLEET_1).effects;
}

/** x², as x·x (what fleet 1 was first generated with), or another power. */
function power(x: number, exponent: number): number {
  return exponent === 2 ? x * x : x ** exponent;
}

/** A thermal fault's peak warming, °C: drawn per fault from the variant's range. */
function thermalPeak(fault: FaultLabel, effects: FaultEffects): number {
  const [low, high] = effects.thermal.peak;
  return low + (high - low) * noise(faultKey(fault) + 11, 0);
}

/** How far through its precursor a fault is at `time`: 0 at the start, 1 at the failure; undefined outside. */
export function progress(fault: FaultLabel, time: number): number | undefined {
  if (time < fault.precursorStart || time >= fault.failure) return undefined;
  return (time - fault.precursorStart) / Math.max(1, fault.failure - fault.precursorStart);
}

/** Whether a fault's GPU (or board) is being slowed down at `time`, which slows its whole job. */
export function throttledAt(fault: FaultLabel, step: number, time: number, effects: FaultEffects = FLEET_1.effects): boolean {
  const p = progress(fault, time);
  if (p === undefined) return false;
  if (fault.kind === 'thermal') {
    const thermal = effects.thermal;
    return p > thermal.throttleFrom && inEpisode(faultKey(fault), step, thermal.throttleProbability * p, thermal.throttleSteps);
  }
  if (fault.kind === 'power_brake') {
    const brake = effects.power_brake;
    return inEpisodeOf(faultKey(fault), step, brake.base + brake.scale * p, brake.episodeSteps);
  }
  return false;
}

export function buildTimelines(plan: FleetPlan): Map<string, NodeTimeline> {
  const steps = Math.floor((plan.end - plan.start) / plan.stepMs);
  const timelines = new Map<string, NodeTimeline>();
  for (const node of plan.nodes) {
    timelines.set(node, {
      mode: new Uint8Array(steps).fill(IDLE),
      load: new Float32Array(steps).fill(0),
      iteration: new Float32Array(steps).fill(Number.NaN),
      traffic: new Float32Array(steps).fill(0),
      checkpoint: new Uint8Array(steps),
      job: new Int8Array(steps).fill(-1),
    });
  }
  const timeOf = (step: number) => plan.start + step * plan.stepMs;
  const stepOf = (time: number) => Math.max(0, Math.min(steps, Math.round((time - plan.start) / plan.stepMs)));
  const effects = effectsOf(plan);

  plan.jobs.forEach((job, jobIndex) => {
    const members = job.nodes.map((node) => timelines.get(node) as NodeTimeline);
    const memberFaults = plan.faults.filter((fault) => job.nodes.includes(fault.node));
    for (let step = stepOf(job.from); step < stepOf(job.to); step += 1) {
      const time = timeOf(step);
      const phase = job.phases.find((candidate) => candidate.from <= time && time < candidate.to)?.kind;
      // A synchronous job runs at the pace of its slowest member (Greyhound §3.2, case 2).
      const straggling = memberFaults.some((fault) => throttledAt(fault, step, time, effects)) ? 1.25 : 1;
      // The NFS client of one node falling behind stalls the data loader for everybody.
      const starving = memberFaults.some((fault) => fault.kind === 'nfs_backlog' && (progress(fault, time) ?? 0) > effects.nfs_backlog.starveFrom) ? 1.15 : 1;
      let load = 0.93;
      let iteration = job.iterationSeconds * straggling * starving;
      let traffic = 1 / (straggling * starving);
      let mode = TRAINING;
      if (phase === 'restart') [mode, load, iteration, traffic] = [STOPPED, 0.01, Number.NaN, 0.001];
      else if (phase === 'checkpoint') [load, traffic] = [0.2, 0.05];
      else if (phase === 'evaluation') [load, traffic] = [0.55, 0.2];
      else if (phase === 'slowdown') [load, iteration, traffic] = [0.62, iteration * 1.6, traffic * 0.55];
      else load = 0.93 / (straggling * starving);
      job.nodes.forEach((node, index) => {
        const line = members[index] as NodeTimeline;
        if (plan.faults.some((fault) => fault.node === node && fault.drainedAt <= time && time < fault.repairedAt)) return;
        line.mode[step] = mode;
        line.load[step] = load;
        line.iteration[step] = iteration;
        line.traffic[step] = traffic;
        line.checkpoint[step] = phase === 'checkpoint' ? 1 : 0;
        line.job[step] = jobIndex;
      });
    }
  });

  applyDips(plan, timelines, stepOf);

  const down = (node: string, from: number, to: number) => {
    const line = timelines.get(node) as NodeTimeline;
    for (let step = stepOf(from); step < stepOf(to); step += 1) {
      line.mode[step] = DOWN;
      line.iteration[step] = Number.NaN;
    }
  };
  for (const fault of plan.faults) {
    if (fault.kind === 'silent') down(fault.node, fault.failure, fault.repairedAt);
    else down(fault.node, fault.repairedAt - 5 * MINUTE, fault.repairedAt); // the repair ends with a reboot
  }
  for (const confuser of plan.confusers) if (confuser.kind === 'reboot') down(confuser.node, confuser.at, confuser.at + 4 * MINUTE);
  return timelines;
}

/**
 * The one-node dips of real jobs (benign): they change only the steps where the node trains in
 * its job. A stalled data loader idles the node's GPUs and its RDMA transmit while the others
 * wait at the next collective (their GPUs stay busy in it; every rank's iteration grows); rank 0
 * writing the checkpoint alone dips its GPUs and fills its own RPC slots; a lighter pipeline
 * stage keeps one node a little below the others for good.
 */
function applyDips(plan: FleetPlan, timelines: ReadonlyMap<string, NodeTimeline>, stepOf: (time: number) => number): void {
  for (const confuser of plan.confusers) {
    if (confuser.kind !== 'loader_stall' && confuser.kind !== 'rank0_checkpoint' && confuser.kind !== 'uneven_stage') continue;
    const jobIndex = plan.jobs.findIndex((job) => job.name === confuser.job);
    const job = plan.jobs[jobIndex];
    const line = timelines.get(confuser.node);
    if (!job || !line) continue;
    for (let step = stepOf(confuser.at); step < stepOf(confuser.to); step += 1) {
      if (line.job[step] !== jobIndex || line.mode[step] !== TRAINING) continue;
      if (confuser.kind === 'uneven_stage') line.load[step] = (line.load[step] ?? 0) * confuser.factor;
      else if (confuser.kind === 'rank0_checkpoint') {
        line.load[step] = (line.load[step] ?? 0) * 0.45;
        line.checkpoint[step] = 2;
      } else {
        line.load[step] = Math.min(line.load[step] ?? 0, confuser.level);
        line.traffic[step] = (line.traffic[step] ?? 0) * confuser.level;
        for (const member of job.nodes) {
          const other = timelines.get(member);
          if (other && other.job[step] === jobIndex) other.iteration[step] = (other.iteration[step] ?? Number.NaN) * 1.3;
        }
      }
    }
  }
}

/** A GPU's departures from health at one step, from the fault that affects it. */
export interface GpuEffect {
  temperature: number;
  memoryTemperature: number;
  clock: number;
  power: number;
  utilization: number;
  thermal: boolean;
  brake: boolean;
  /** Expected increments per step. */
  ecc: number;
  remaps: number;
  replays: number;
  /** The GPU is off the bus (Xid 79): only `present 0` remains. */
  gone: boolean;
}

export function healthyEffect(): GpuEffect {
  return { temperature: 0, memoryTemperature: 0, clock: 1, power: 1, utilization: 1, thermal: false, brake: false, ecc: 0, remaps: 0, replays: 0, gone: false };
}

/** Writes `fault`'s effect on GPU `gpu` at the step into `effect` (left as is when it has none). */
export function applyFault(effect: GpuEffect, fault: FaultLabel, gpu: number, step: number, time: number, effects: FaultEffects = FLEET_1.effects): void {
  const p = progress(fault, time);
  const failed = time >= fault.failure && time < fault.repairedAt;
  const key = faultKey(fault);
  const own = gpu === fault.gpu;
  if (failed && own && fault.xid === 79) effect.gone = true;
  switch (fault.kind) {
    case 'hbm_ecc':
      // Correctable errors accelerate towards the uncorrectable one; rows get remapped on the way
      // (the 504-GPU report, Fig. 4).
      if (own && p !== undefined) {
        const memory = effects.hbm_ecc;
        effect.ecc = memory.base + memory.scale * p * p * (noise(key, step) < memory.burstProbability ? memory.burst : memory.calm);
        effect.remaps = p >= memory.remapFrom ? memory.remapBase + memory.remapScale * p : 0;
        effect.memoryTemperature = memory.memoryWarming * p;
      }
      break;
    case 'pcie_replay':
      if (own && p !== undefined) effect.replays = effects.pcie_replay.base + effects.pcie_replay.scale * power(p, effects.pcie_replay.exponent);
      break;
    case 'thermal':
      // A failing fan: the GPU warms steadily, then thermal slowdown grabs its clocks.
      if (own && p !== undefined) {
        effect.temperature = thermalPeak(fault, effects) * p;
        if (throttledAt(fault, step, time, effects)) Object.assign(effect, { thermal: true, clock: effects.thermal.clock, power: effects.thermal.power });
      }
      if (own && failed) Object.assign(effect, { temperature: thermalPeak(fault, effects) + 2, thermal: true, clock: 0.6, power: 0.75 });
      break;
    case 'power_brake':
      // The board's power brake (a PSU or its sensing) pulls every GPU down together.
      if ((p !== undefined && throttledAt(fault, step, time, effects)) || failed)
        Object.assign(effect, { brake: true, clock: effects.power_brake.clock, power: effects.power_brake.power });
      break;
    case 'sudden_xid':
      // Xid 119: the GSP stops answering; the GPU runs nothing and idles until it is reset.
      if (own && failed && fault.xid === 119) Object.assign(effect, { utilization: 0, power: 0.12 });
      break;
    default:
      break;
  }
}

/** Extra per-port symbol and receive errors per step, and whether the link is down. */
export function linkEffect(
  fault: FaultLabel,
  port: number,
  time: number,
  effects: FaultEffects = FLEET_1.effects,
): { symbols: number; receive: number; down: boolean } {
  if (fault.kind !== 'ib_link' || port !== fault.gpu % 4) return { symbols: 0, receive: 0, down: false };
  const p = progress(fault, time);
  const down = time >= fault.failure && time < fault.repairedAt;
  const link = effects.ib_link;
  return p === undefined
    ? { symbols: 0, receive: 0, down }
    : { symbols: link.symbolBase + link.symbolScale * p * p, receive: link.receiveBase + link.receiveScale * p * p, down };
}

/** NFS client trouble: round-trip multiplier, retransmitted share, RPC backlog, major timeouts per step. */
export function mountEffect(
  fault: FaultLabel,
  time: number,
  effects: FaultEffects = FLEET_1.effects,
): { rtt: number; retransmit: number; backlog: number; timeouts: number } {
  const p = progress(fault, time);
  if (fault.kind === 'nfs_backlog') {
    const nfs = effects.nfs_backlog;
    if (p !== undefined)
      return { rtt: 1 + nfs.rtt * p, retransmit: nfs.retransmit * p, backlog: nfs.backlog * p, timeouts: p > nfs.timeoutsFrom ? nfs.timeouts : 0 };
    if (time >= fault.failure && time < fault.failure + 10 * MINUTE) return { rtt: 12, retransmit: 0.05, backlog: 80, timeouts: 1 };
  }
  // The 504-GPU report (Fig. 3): GETATTR response time misbehaved on the node whose GPU later
  // logged an ECC error; given to every other memory fault here, late in its precursor.
  const memory = effects.hbm_ecc;
  if (fault.kind === 'hbm_ecc' && p !== undefined && p > memory.getattrFrom && Number(fault.id.slice(1)) % 2 === 1)
    return { rtt: memory.getattrRtt, retransmit: 0.002, backlog: 4, timeouts: 0 };
  return { rtt: 1, retransmit: 0, backlog: 0, timeouts: 0 };
}
