import { ANY_XID_5M, REPLAY_FEATURES as F, type BenignKind, type FaultLabel } from './labels.js';
import type { Random } from './replay-random.js';

/**
 * One node of the labelled replay (cluster-replay.ts) at one step: its state between steps
 * (offsets, drift, the counter windows), what blips, benign transients and faults do to it, and
 * the readings that come out, as the default feature queries would return them.
 */

const MINUTE = 60_000;

/** Sliding sum over the last `length` steps: what increase()/rate() over a window sees. */
export class Window {
  private readonly ring: Float64Array;
  private next = 0;
  sum = 0;
  constructor(length: number) {
    this.ring = new Float64Array(length);
  }
  push(value: number): number {
    this.sum += value - (this.ring[this.next] as number);
    this.ring[this.next] = value;
    this.next = (this.next + 1) % this.ring.length;
    return Math.max(0, this.sum);
  }
  clear(): void {
    this.ring.fill(0);
    this.sum = 0;
  }
}

/**
 * The last hour's Xids in 5-minute slots: how many of the twelve saw any, as the xid_errors_1h
 * query counts them (count_over_time of "a new Xid in 5 minutes" over [1h:5m]).
 */
export class XidSlots {
  private readonly minutes = new Float64Array(60);
  private next = 0;
  push(events: number): number {
    this.minutes[this.next] = events;
    this.next = (this.next + 1) % 60;
    let slots = 0;
    for (let slot = 0; slot < 12; slot += 1) {
      let any = false;
      for (let minute = 0; minute < 5 && !any; minute += 1) any = (this.minutes[(this.next + slot * 5 + minute) % 60] as number) > 0;
      if (any) slots += 1;
    }
    return slots;
  }
  clear(): void {
    this.minutes.fill(0);
  }
}

/** Per-step changes to one node's readings; neutral unless a blip, transient or fault says otherwise. */
export interface Effects {
  temp: number;
  memTemp: number;
  power: number;
  clock: number;
  throttle: number;
  eccRate: number;
  remapRate: number;
  pcieRate: number;
  linkRate: number;
  xidEvents: number;
  /** The Xid lines of this step are fatal (a failing GPU), not an application's. */
  xidFatal: boolean;
  /** The GPU per-GPU effects (ECC, remaps, PCIe replays, throttling) show on. */
  device: number;
  retries: number;
  txFactor: number;
  getattrFactor: number;
  iterFactor: number;
  idle: boolean;
}
export const neutral = (): Effects => ({
  temp: 0,
  memTemp: 0,
  power: 0,
  clock: 0,
  throttle: 0,
  eccRate: 0,
  remapRate: 0,
  pcieRate: 0,
  linkRate: 0,
  xidEvents: 0,
  xidFatal: false,
  device: 0,
  retries: 0,
  txFactor: 1,
  getattrFactor: 1,
  iterFactor: 1,
  idle: false,
});

export const BLIP_KINDS = ['temp_spike', 'dataloader', 'power_sag', 'error_burst', 'app_xid'] as const;
export const BLIP_WEIGHTS = [0.3, 0.25, 0.2, 0.2, 0.05];
export interface Blip {
  readonly node: number;
  readonly start: number;
  readonly end: number;
  readonly kind: (typeof BLIP_KINDS)[number] | BenignKind;
  readonly size: number;
}

/** Continuous readings, each with [per-node offset σ, AR(1) drift σ, white σ] at its slot. */
export const SLOT = { temp: 0, memTemp: 1, power: 2, clock: 3, util: 4, retries: 5, tx: 6, getattr: 7, iteration: 8 } as const;
export const NOISE: readonly (readonly [number, number, number])[] = [
  [2.5, 0.7, 0.3], // temp, °C
  [2.0, 0.6, 0.3], // memTemp, °C
  [12, 8, 6], // power, W
  [8e6, 5e6, 3e6], // clock, Hz
  [0, 0.005, 0.01], // util
  [0.15, 0.1, 0.3], // retries: offset relative, drift and white per second
  [0.01, 0.015, 0.01], // tx, relative
  [0.05, 0.08, 0.15], // getattr, log scale
  [0.004, 0.003, 0.006], // iteration, relative
];
export const AR_KEEP = 0.9;
export const AR_INNOVATION = Math.sqrt(1 - AR_KEEP ** 2);

export interface NodeState {
  readonly name: string;
  readonly offset: Float64Array;
  readonly drift: Float64Array;
  readonly eccBase: number;
  load: number;
  /** Static offsets on top of the drawn ones: a node that is simply different (a hotter slot, a lower power cap). */
  readonly extra: { temp: number; power: number };
  /** Per GPU (8). */
  readonly ecc: Window[];
  readonly remaps: Window[];
  readonly pcie: Window[];
  /** Per GPU: the last hour's 5-minute slots with a replay. */
  readonly pcieSlots: XidSlots[];
  readonly xid: Window;
  readonly xidFatal: Window;
  readonly xidHour: XidSlots;
  readonly link: Window;
  readonly throttle: Window;
}

export interface Moment {
  readonly load: number;
  readonly inCheckpoint: boolean;
  readonly inRestart: boolean;
  readonly diurnal: number;
  readonly dataPhase: number;
  readonly congestion: number;
  /** A job-wide slowdown (input pipeline, a slow shard of storage): every node of the job at once. */
  readonly jobSlowdown: number;
}

export const GPUS = 8;
export const windows = (length: number): Window[] => Array.from({ length: GPUS }, () => new Window(length));

/** Offset + drift + white noise of one continuous reading. */
function wobble(node: NodeState, slot: number, rng: Random): number {
  return (node.offset[slot] as number) + (node.drift[slot] as number) + rng.noise(NOISE[slot]?.[2] as number);
}

/** One node's readings at one step, as the default feature queries would return them. */
export function readings(node: NodeState, effects: Effects, at: Moment, rng: Random): Record<string, number | number[] | undefined> {
  const { load, inCheckpoint, inRestart } = at;
  const row: Record<string, number | number[] | undefined> = {};
  row[F.temp] = 42 + 24 * node.load + at.diurnal + wobble(node, SLOT.temp, rng) + node.extra.temp + effects.temp;
  row[F.memTemp] = 48 + 26 * node.load + at.diurnal + wobble(node, SLOT.memTemp, rng) + 0.6 * node.extra.temp + effects.memTemp;
  row[F.power] = Math.max(60, 95 + 575 * load * (1 - 0.15 * at.jobSlowdown) + wobble(node, SLOT.power, rng) + node.extra.power + effects.power);
  row[F.clock] = 0.7e9 + 1.16e9 * Math.min(1, 1.25 * load) + wobble(node, SLOT.clock, rng) + effects.clock;
  row[F.util] = Math.min(1, Math.max(0, 0.97 * load + wobble(node, SLOT.util, rng)));
  const throttled = node.throttle.push(effects.throttle) / 5;
  row[F.slowdown] = Array.from({ length: GPUS }, (_, gpu) => (gpu === effects.device ? throttled : 0));
  const perGpu = (windows: Window[], base: number, extra: number, scale: number) =>
    windows.map((window, gpu) => window.push(rng.poisson(base / GPUS + (gpu === effects.device ? extra : 0))) / scale);
  row[F.ecc] = perGpu(node.ecc, node.eccBase, effects.eccRate, 1);
  const remaps = perGpu(node.remaps, 0, effects.remapRate, 1);
  row[F.remaps] = remaps;
  row[F.remapPending] = remaps.map((count) => (count > 0 ? 1 : 0));
  const replays = node.pcie.map((_, gpu) => rng.poisson(0.3 / GPUS + (gpu === effects.device ? effects.pcieRate : 0)));
  row[F.pcie] = node.pcie.map((window, gpu) => window.push(replays[gpu] as number) / 300);
  row[F.pcieSlots] = node.pcieSlots.map((slots, gpu) => slots.push(replays[gpu] as number));
  const fatal = effects.xidFatal ? effects.xidEvents : 0;
  row[F.xidFatal] = node.xidFatal.push(fatal);
  row[F.xidHour] = node.xidHour.push(effects.xidEvents);
  row[ANY_XID_5M] = node.xid.push(effects.xidEvents);
  row[F.link] = node.link.push(rng.poisson(0.05 + effects.linkRate)) / 300;
  const congestion = Math.max(0.2, 1.5 + at.congestion) * load * (1 + (node.offset[SLOT.retries] as number));
  row[F.retries] = Math.max(0, congestion + (node.drift[SLOT.retries] as number) + rng.noise(NOISE[SLOT.retries]?.[2] as number) + effects.retries);
  row[F.tx] = Math.max(0, 4.2e10 * load * (1 - 0.2 * at.jobSlowdown) * (1 + wobble(node, SLOT.tx, rng)) * effects.txFactor);
  row[F.getattr] = 6e-4 * (inCheckpoint ? 6 : 1) * Math.exp(wobble(node, SLOT.getattr, rng)) * effects.getattrFactor;
  row[F.retrans] = Math.max(0, 1e-4 + (inCheckpoint ? 0.003 : 0) + rng.noise(3e-4));
  row[F.iteration] =
    effects.idle || inRestart || load < 0.1
      ? undefined
      : 4.2 * (1 + at.dataPhase) * (1 + 0.4 * at.jobSlowdown) * (inCheckpoint ? 2.5 : 1) * (1 + wobble(node, SLOT.iteration, rng)) * effects.iterFactor;
  return row;
}

export function applyBlip(effects: Effects, blip: Blip): void {
  const size = blip.size;
  switch (blip.kind) {
    case 'temp_spike':
      effects.temp += 7 * size;
      break;
    case 'dataloader':
      effects.iterFactor *= 1 + 0.3 * size;
      effects.getattrFactor *= 1 + 2.5 * size;
      break;
    case 'power_sag':
      effects.power -= 90 * size;
      effects.clock -= 1e8 * size;
      break;
    case 'error_burst':
      effects.linkRate += 25 * size;
      break;
    case 'app_xid':
      effects.xidEvents += 1;
      break;
    case 'nic_flap':
      effects.linkRate += 20 * size;
      effects.retries += 8 * size;
      effects.txFactor *= 1 - 0.4 * size;
      break;
    case 'host_contention':
      effects.iterFactor *= 1 + 0.2 * size;
      effects.getattrFactor *= 1 + 2 * size;
      effects.power -= 80 * size;
      break;
  }
}

/** One fault's effect on its node at `time` (before the drain). */
export function applyFault(effects: Effects, fault: FaultLabel, time: number, isXidStep: boolean, rng: Random): void {
  if (time >= fault.xid) {
    // The Xid line(s), a few follow-ups, and the job carrying on without this node.
    effects.xidEvents += isXidStep ? 1 + rng.poisson(0.5) : time < fault.xid + 5 * MINUTE ? rng.poisson(0.3) : 0;
    effects.xidFatal = true;
    effects.idle = true;
    return;
  }
  const q = fault.strength * ((time - fault.onset) / Math.max(MINUTE, fault.xid - fault.onset)) ** 2;
  const late = Math.max(0, q - 0.5);
  effects.device = fault.device;
  switch (fault.kind) {
    case 'thermal':
      effects.temp += 18 * q;
      effects.memTemp += 12 * q;
      effects.throttle += Math.min(1, 2.5 * late);
      effects.clock -= 2.5e8 * late;
      effects.power -= 120 * late;
      effects.iterFactor *= 1 + 0.04 * late;
      break;
    case 'memory':
      effects.eccRate += 3 * q;
      effects.remapRate += 0.02 * q;
      effects.memTemp += 3 * q;
      effects.getattrFactor *= 1 + 1.5 * q;
      break;
    case 'pcie':
      effects.pcieRate += 60 * q;
      effects.linkRate += 30 * q;
      effects.retries += 20 * q;
      effects.txFactor *= 1 - 0.15 * q;
      effects.iterFactor *= 1 + 0.05 * q;
      break;
    case 'slowdown':
      effects.power -= 100 * q;
      effects.clock -= 1.5e8 * q;
      effects.iterFactor *= 1 + 0.08 * q;
      effects.temp -= 3 * q;
      break;
    case 'powerbrake': {
      // The power brake held a minute or two at a time, more often as the fault grows: each
      // episode alone is as short as a benign blip.
      const minute = Math.floor((time - fault.onset) / MINUTE);
      const period = Math.max(6, Math.round(20 - 12 * (q / Math.max(fault.strength, 1e-9))));
      if (minute % period < 1 + (minute % 3 === 0 ? 1 : 0)) {
        effects.throttle += 1;
        effects.power -= 250 * fault.strength;
        effects.clock -= 4e8 * fault.strength;
      }
      break;
    }
    case 'sudden':
    case 'hang':
      break;
  }
}
