import { z } from 'zod';
import { InputError } from '../core/errors.js';
import { parseOrThrow } from '../core/validate.js';
import type { FeatureMatrix } from './multisignal.js';
import { seededUniform } from '../core/random.js';

/**
 * The labelled replay the multi-signal detector is evaluated on (analyzers/multisignal-eval.ts):
 * a seeded 63-node cluster (the 504-GPU report's, 002) over D days at one sample a minute, each
 * sample the node × feature matrix the default Prometheus queries would give
 * (analyzers/multisignal-source.ts), with faults whose onset and Xid time are known.
 *
 * What the generator holds, and why:
 *  - common mode, which peers cancel: diurnal inlet temperature, evaluation phases, job restarts
 *    and checkpoint stalls that hit every node at once (002's NFS RPC slot saturation), with some
 *    nodes finishing their checkpoint writes a minute or two late;
 *  - node level: static offsets per node (hotter slots, slower NICs; the two temperatures share
 *    half their offset, as one cooling path serves both), slow AR(1) drift, white noise with rare
 *    4σ outliers, a few chronic correctable-ECC nodes, and short one-node blips (a dataloader
 *    hiccup, a power sag, a lone error burst, an application Xid);
 *  - labelled benign transients (a NIC flap that heals, host contention): several signals for 5 to
 *    20 minutes and no failure after; a detector that raises them scores a false positive;
 *  - faults of five kinds (002, Figs. 2-4 for the shapes): thermal (hours of rising temperature,
 *    then throttling), memory (correctable ECC and row remaps, and the GETATTR latency of Fig. 3),
 *    pcie (PCIe replays, RDMA errors and retries, less traffic: the NVLink + bus fault of Fig. 2),
 *    slowdown (power and clocks sag, iterations slow) and sudden (nothing before the Xid). A
 *    precursor grows quadratically from its onset to the Xid, scaled by a strength drawn per fault,
 *    so weak ones can stay invisible until the Xid. At the Xid the Xid counter rises and the job
 *    goes on without the node (idle GPUs, no traffic, no iterations) until it is drained; it comes
 *    back repaired hours later.
 * Faults are far more frequent here than in the report (about one a day against 10 in 55 days),
 * for statistics; the false-positive rate is measured on the time no fault covers.
 */

export const FAULT_KINDS = ['thermal', 'memory', 'pcie', 'slowdown', 'sudden'] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];
export const BENIGN_KINDS = ['nic_flap', 'host_contention'] as const;
export type BenignKind = (typeof BENIGN_KINDS)[number];

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

/** The features the generator writes; the same names as DEFAULT_FEATURES (a test checks). */
export const REPLAY_FEATURES = {
  temp: 'gpu_temperature_max_celsius',
  memTemp: 'gpu_memory_temperature_max_celsius',
  power: 'gpu_power_min_watts',
  clock: 'gpu_sm_clock_min_hertz',
  util: 'gpu_utilization_mean',
  slowdown: 'gpu_hw_slowdown_gpus',
  ecc: 'gpu_ecc_correctable_10m',
  remaps: 'gpu_row_remaps_1h',
  pcie: 'gpu_pcie_replays_per_second',
  xid: 'xid_errors_5m',
  link: 'rdma_link_errors_per_second',
  retries: 'rdma_transport_retries_per_second',
  tx: 'rdma_transmit_bytes_per_second',
  getattr: 'nfs_getattr_rtt_seconds',
  retrans: 'nfs_retransmissions_per_operation',
  iteration: 'training_iteration_seconds',
} as const;
const F = REPLAY_FEATURES;

export interface FaultLabel {
  readonly node: string;
  readonly kind: FaultKind;
  /** Start of the precursor (ms); the Xid time for a sudden fault. */
  readonly onset: number;
  readonly xid: number;
  readonly xidCode: number;
  /** The node leaves the fleet (drained, no series) until `repaired`. */
  readonly drained: number;
  readonly repaired: number;
  /** Precursor strength (1: the full shapes in applyFault), from config.strengthRange. */
  readonly strength: number;
}

export interface BenignLabel {
  readonly node: string;
  readonly kind: BenignKind;
  readonly start: number;
  readonly end: number;
}

const replayConfigSchema = z
  .object({
    seed: z.int(),
    nodes: z.int().min(1).max(10_000),
    days: z.number().positive().max(366),
    faults: z.int().min(0),
    /** One sample a minute: the counter windows (5, 10, 60 steps) and late writers are counted in minutes. */
    stepSeconds: z.literal(60),
    start: z.number(),
    blipsPerNodeDay: z.number().min(0),
    benignTransientsPerDay: z.number().min(0),
    strengthRange: z.tuple([z.number().min(0), z.number().min(0)]).refine(([low, high]) => low <= high, 'low must not exceed high'),
  })
  .strict();

export type ReplayConfig = Readonly<z.output<typeof replayConfigSchema>>;

export const DEFAULT_REPLAY: Omit<ReplayConfig, 'seed'> = {
  nodes: 63,
  days: 14,
  faults: 15,
  stepSeconds: 60,
  start: Date.UTC(2025, 9, 1),
  blipsPerNodeDay: 4,
  benignTransientsPerDay: 0.5,
  strengthRange: [0.3, 1.3],
};

/** Seeded randomness for one replay: mulberry32 (small, fast, the same on every machine) and the draws built on it. */
class Random {
  readonly next: () => number;
  private spare: number | undefined;

  constructor(seed: number) {
    this.next = seededUniform(seed);
  }

  uniform(low: number, high: number): number {
    return low + (high - low) * this.next();
  }

  /** Standard normal (Marsaglia's polar method; the second value of a pair is kept for the next call). */
  normal(): number {
    if (this.spare !== undefined) {
      const value = this.spare;
      this.spare = undefined;
      return value;
    }
    for (;;) {
      const u = 2 * this.next() - 1;
      const v = 2 * this.next() - 1;
      const square = u * u + v * v;
      if (square === 0 || square >= 1) continue;
      const factor = Math.sqrt((-2 * Math.log(square)) / square);
      this.spare = v * factor;
      return u * factor;
    }
  }

  poisson(mean: number): number {
    if (mean <= 0) return 0;
    if (mean > 30) return Math.max(0, Math.round(mean + Math.sqrt(mean) * this.normal()));
    const limit = Math.exp(-mean);
    let count = 0;
    for (let product = this.next(); product > limit; product *= this.next()) count += 1;
    return count;
  }

  /** White noise with rare 4σ outliers, as real gauges have. */
  noise(sigma: number): number {
    return sigma * this.normal() * (this.next() < 0.003 ? 4 : 1);
  }
}

/** Sliding sum over the last `length` steps: what increase()/rate() over a window sees. */
class Window {
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

/** Per-step changes to one node's readings; neutral unless a blip, transient or fault says otherwise. */
interface Effects {
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
  retries: number;
  txFactor: number;
  getattrFactor: number;
  iterFactor: number;
  idle: boolean;
}
const neutral = (): Effects => ({
  temp: 0, memTemp: 0, power: 0, clock: 0, throttle: 0, eccRate: 0, remapRate: 0, pcieRate: 0, linkRate: 0,
  xidEvents: 0, retries: 0, txFactor: 1, getattrFactor: 1, iterFactor: 1, idle: false,
});

const BLIP_KINDS = ['temp_spike', 'dataloader', 'power_sag', 'error_burst', 'app_xid'] as const;
const BLIP_WEIGHTS = [0.3, 0.25, 0.2, 0.2, 0.05];
interface Blip {
  readonly node: number;
  readonly start: number;
  readonly end: number;
  readonly kind: (typeof BLIP_KINDS)[number] | BenignKind;
  readonly size: number;
}

/** Continuous readings, each with [per-node offset σ, AR(1) drift σ, white σ] at its slot. */
const SLOT = { temp: 0, memTemp: 1, power: 2, clock: 3, util: 4, retries: 5, tx: 6, getattr: 7, iteration: 8 } as const;
const NOISE: readonly (readonly [number, number, number])[] = [
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
const AR_KEEP = 0.9;
const AR_INNOVATION = Math.sqrt(1 - AR_KEEP ** 2);

interface NodeState {
  readonly name: string;
  readonly offset: Float64Array;
  readonly drift: Float64Array;
  readonly eccBase: number;
  load: number;
  readonly ecc: Window;
  readonly remaps: Window;
  readonly pcie: Window;
  readonly xid: Window;
  readonly link: Window;
  readonly throttle: Window;
}

/** A seeded cluster replay; `frames()` yields one matrix a step, in time order. */
export class ClusterReplay {
  readonly config: ReplayConfig;
  readonly faults: readonly FaultLabel[];
  readonly benign: readonly BenignLabel[];
  readonly steps: number;
  private readonly nodes: NodeState[];
  private readonly blips: Blip[];

  constructor(config: Partial<ReplayConfig> & { seed: number }) {
    this.config = parseOrThrow(replayConfigSchema, { ...DEFAULT_REPLAY, ...config }, 'replay configuration');
    // Faults sit after an 8-hour warm-up and end 2 hours before the end (see below).
    if (this.config.faults > 0 && this.config.days < 0.5) throw new InputError('a replay with faults needs at least half a day (days ≥ 0.5)', 'days');
    const { nodes, days, stepSeconds, start } = this.config;
    const rng = new Random(this.config.seed);
    this.steps = Math.floor((days * DAY) / (stepSeconds * 1000));
    const end = start + days * DAY;
    this.nodes = Array.from({ length: nodes }, (_, index) => {
      const offset = Float64Array.from(NOISE, ([sigma]) => sigma * rng.normal());
      // One cooling path serves both: the memory temperature shares half of the core's offset.
      offset[SLOT.memTemp] = (0.5 * (offset[SLOT.temp] as number) * (NOISE[SLOT.memTemp]?.[0] as number)) / (NOISE[SLOT.temp]?.[0] as number) + Math.sqrt(0.75) * (offset[SLOT.memTemp] as number);
      return {
        name: `gpu${String(index + 1).padStart(3, '0')}`,
        offset,
        drift: new Float64Array(NOISE.length),
        eccBase: rng.next() < 0.05 ? rng.uniform(0.02, 0.08) : 0.0005,
        load: 1,
        ecc: new Window(10),
        remaps: new Window(60),
        pcie: new Window(5),
        xid: new Window(5),
        link: new Window(5),
        throttle: new Window(5),
      };
    });

    // Faults: spread over the run after an 8-hour warm-up, kinds in turn, each on its own node.
    const warmup = 8 * HOUR;
    const span = (end - 2 * HOUR - (start + warmup)) / Math.max(1, this.config.faults);
    const victims = this.nodes.map((_, index) => index);
    for (let index = victims.length - 1; index > 0; index -= 1) {
      const other = Math.floor(rng.next() * (index + 1));
      [victims[index], victims[other]] = [victims[other] as number, victims[index] as number];
    }
    const leads: Record<FaultKind, [number, number]> = { thermal: [1 * HOUR, 6 * HOUR], memory: [20 * MINUTE, 3 * HOUR], pcie: [10 * MINUTE, HOUR], slowdown: [30 * MINUTE, 2 * HOUR], sudden: [0, 0] };
    const codes: Record<FaultKind, number> = { thermal: 79, memory: 48, pcie: 74, slowdown: 62, sudden: 79 };
    this.faults = Array.from({ length: this.config.faults }, (_, index) => {
      const kind = FAULT_KINDS[index % FAULT_KINDS.length] as FaultKind;
      const xid = this.snap(start + warmup + (index + rng.uniform(0.2, 0.8)) * span);
      const drained = this.snap(xid + rng.uniform(15, 45) * MINUTE);
      const [low, high] = leads[kind];
      return {
        node: (this.nodes[victims[index % nodes] as number] as NodeState).name,
        kind,
        onset: this.snap(xid - rng.uniform(low, high)),
        xid,
        xidCode: codes[kind],
        drained,
        repaired: this.snap(drained + rng.uniform(6, 24) * HOUR),
        strength: rng.uniform(...this.config.strengthRange),
      };
    });

    this.blips = [];
    const stepOf = (time: number) => Math.floor((time - start) / (stepSeconds * 1000));
    const faultNear = (node: string, time: number) => this.faults.some((fault) => fault.node === node && time > fault.onset - 2 * HOUR && time < fault.repaired + HOUR);
    const benign: BenignLabel[] = [];
    // A fixed count (rate × days, like the faults), not a Poisson draw: these transients are most
    // of what a sensitive detector raises falsely, and a short replay should not swing on their number.
    const wanted = Math.round(this.config.benignTransientsPerDay * days);
    for (let attempt = 0; benign.length < wanted && attempt < 100 * wanted; attempt += 1) {
      const node = Math.floor(rng.next() * nodes);
      const from = this.snap(rng.uniform(start + HOUR, end - HOUR));
      const to = this.snap(from + rng.uniform(5, 20) * MINUTE);
      const name = (this.nodes[node] as NodeState).name;
      if (faultNear(name, from)) continue;
      const kind = BENIGN_KINDS[Math.floor(rng.next() * BENIGN_KINDS.length)] as BenignKind;
      benign.push({ node: name, kind, start: from, end: to });
      this.blips.push({ node, start: stepOf(from), end: stepOf(to), kind, size: rng.uniform(0.6, 1.2) });
    }
    this.benign = benign;
    this.nodes.forEach((_, node) => {
      for (let count = rng.poisson(this.config.blipsPerNodeDay * days); count > 0; count -= 1) {
        const roll = rng.next();
        const length = roll < 0.65 ? 1 : roll < 0.9 ? 2 : roll < 0.97 ? 3 : 4 + Math.floor(rng.next() * 2);
        let pick = rng.next();
        let kind = 0;
        while (kind < BLIP_WEIGHTS.length - 1 && pick > (BLIP_WEIGHTS[kind] as number)) pick -= BLIP_WEIGHTS[kind++] as number;
        const first = Math.floor(rng.next() * this.steps);
        this.blips.push({ node, start: first, end: first + length, kind: BLIP_KINDS[kind] as Blip['kind'], size: rng.uniform(0.6, 1.2) });
      }
    });
    this.blips.sort((a, b) => a.start - b.start);
  }

  private snap(time: number): number {
    const step = this.config.stepSeconds * 1000;
    return this.config.start + Math.round((time - this.config.start) / step) * step;
  }

  /** The frames, one a minute; every call starts over and yields the same sequence. */
  *frames(): Generator<{ time: number; matrix: FeatureMatrix }> {
    const rng = new Random(this.config.seed ^ 0x5eed);
    for (const node of this.nodes) {
      node.drift.fill(0);
      node.load = 1;
      for (const window of [node.ecc, node.remaps, node.pcie, node.xid, node.link, node.throttle]) window.clear();
    }
    const { start, stepSeconds } = this.config;
    const stepMs = stepSeconds * 1000;
    let nextCheckpoint = Math.round(rng.uniform(20, 60));
    let checkpoint = { until: -1, late: new Int8Array(this.nodes.length) };
    let restart = { until: -1, late: new Int8Array(this.nodes.length) };
    let dataPhase = 0;
    let congestion = 0;
    let blipIndex = 0;
    let active: Blip[] = [];
    const lateness = () => Int8Array.from(this.nodes, () => { const roll = rng.next(); return roll < 0.8 ? 0 : roll < 0.95 ? 1 : 2; });

    for (let step = 0; step < this.steps; step += 1) {
      const time = start + step * stepMs;
      if (step === nextCheckpoint) {
        checkpoint = { until: step + Math.round(rng.uniform(3, 6)), late: lateness() };
        nextCheckpoint = step + Math.round(rng.uniform(40, 80));
      }
      // About 0.7 whole-job restarts a day, 4 to 10 minutes idle everywhere.
      if (step > restart.until && rng.next() < 0.7 / 1440) restart = { until: step + Math.round(rng.uniform(4, 10)), late: lateness() };
      const evaluationPhase = ((time - start) % (4 * HOUR)) < 8 * MINUTE;
      const diurnal = 2 * Math.sin((2 * Math.PI * (time - start)) / DAY);
      dataPhase = 0.98 * dataPhase + 0.2 * 0.01 * rng.normal();
      congestion = 0.95 * congestion + 0.3 * 0.5 * rng.normal();
      while (blipIndex < this.blips.length && (this.blips[blipIndex] as Blip).start <= step) active.push(this.blips[blipIndex++] as Blip);
      active = active.filter((blip) => blip.end > step);

      const rows: [string, Record<string, number | undefined>][] = [];
      this.nodes.forEach((node, index) => {
        const effects = neutral();
        for (const blip of active) if (blip.node === index) applyBlip(effects, blip);
        let absent = false;
        for (const fault of this.faults) {
          if (fault.node !== node.name || time < fault.onset || time >= fault.repaired) continue;
          if (time >= fault.drained) absent = true;
          else applyFault(effects, fault, time, step === (fault.xid - start) / stepMs, rng);
        }
        if (absent) {
          for (const window of [node.ecc, node.remaps, node.pcie, node.xid, node.link, node.throttle]) window.clear();
          node.load = 1;
          return;
        }
        const inCheckpoint = step <= checkpoint.until + (checkpoint.late[index] as number);
        const inRestart = step <= restart.until + (restart.late[index] as number);
        const load = effects.idle || inRestart ? 0.02 : inCheckpoint ? 0.15 : evaluationPhase ? 0.8 : 1;
        node.load += (load - node.load) * 0.3; // thermal inertia
        for (let slot = 0; slot < NOISE.length; slot += 1) {
          node.drift[slot] = AR_KEEP * (node.drift[slot] as number) + AR_INNOVATION * (NOISE[slot]?.[1] as number) * rng.normal();
        }
        rows.push([node.name, readings(node, effects, { load, inCheckpoint, inRestart, diurnal, dataPhase, congestion }, rng)]);
      });
      yield { time, matrix: Object.fromEntries(rows) };
    }
  }
}

interface Moment {
  readonly load: number;
  readonly inCheckpoint: boolean;
  readonly inRestart: boolean;
  readonly diurnal: number;
  readonly dataPhase: number;
  readonly congestion: number;
}

/** Offset + drift + white noise of one continuous reading. */
function wobble(node: NodeState, slot: number, rng: Random): number {
  return (node.offset[slot] as number) + (node.drift[slot] as number) + rng.noise(NOISE[slot]?.[2] as number);
}

/** One node's readings at one step, as the default feature queries would return them. */
function readings(node: NodeState, effects: Effects, at: Moment, rng: Random): Record<string, number | undefined> {
  const { load, inCheckpoint, inRestart } = at;
  const row: Record<string, number | undefined> = {};
  row[F.temp] = 42 + 24 * node.load + at.diurnal + wobble(node, SLOT.temp, rng) + effects.temp;
  row[F.memTemp] = 48 + 26 * node.load + at.diurnal + wobble(node, SLOT.memTemp, rng) + effects.memTemp;
  row[F.power] = Math.max(60, 95 + 575 * load + wobble(node, SLOT.power, rng) + effects.power);
  row[F.clock] = 0.7e9 + 1.16e9 * Math.min(1, 1.25 * load) + wobble(node, SLOT.clock, rng) + effects.clock;
  row[F.util] = Math.min(1, Math.max(0, 0.97 * load + wobble(node, SLOT.util, rng)));
  row[F.slowdown] = node.throttle.push(effects.throttle) / 5;
  row[F.ecc] = node.ecc.push(rng.poisson(node.eccBase + effects.eccRate));
  row[F.remaps] = node.remaps.push(rng.poisson(effects.remapRate));
  row[F.pcie] = node.pcie.push(rng.poisson(0.3 + effects.pcieRate)) / 300;
  row[F.xid] = node.xid.push(effects.xidEvents);
  row[F.link] = node.link.push(rng.poisson(0.05 + effects.linkRate)) / 300;
  const congestion = Math.max(0.2, 1.5 + at.congestion) * load * (1 + (node.offset[SLOT.retries] as number));
  row[F.retries] = Math.max(0, congestion + (node.drift[SLOT.retries] as number) + rng.noise(NOISE[SLOT.retries]?.[2] as number) + effects.retries);
  row[F.tx] = Math.max(0, 4.2e10 * load * (1 + wobble(node, SLOT.tx, rng)) * effects.txFactor);
  row[F.getattr] = 6e-4 * (inCheckpoint ? 6 : 1) * Math.exp(wobble(node, SLOT.getattr, rng)) * effects.getattrFactor;
  row[F.retrans] = Math.max(0, 1e-4 + (inCheckpoint ? 0.003 : 0) + rng.noise(3e-4));
  row[F.iteration] = effects.idle || inRestart ? undefined : 4.2 * (1 + at.dataPhase) * (inCheckpoint ? 2.5 : 1) * (1 + wobble(node, SLOT.iteration, rng)) * effects.iterFactor;
  return row;
}

function applyBlip(effects: Effects, blip: Blip): void {
  const size = blip.size;
  switch (blip.kind) {
    case 'temp_spike': effects.temp += 7 * size; break;
    case 'dataloader': effects.iterFactor *= 1 + 0.3 * size; effects.getattrFactor *= 1 + 2.5 * size; break;
    case 'power_sag': effects.power -= 90 * size; effects.clock -= 1e8 * size; break;
    case 'error_burst': effects.linkRate += 25 * size; break;
    case 'app_xid': effects.xidEvents += 1; break;
    case 'nic_flap': effects.linkRate += 20 * size; effects.retries += 8 * size; effects.txFactor *= 1 - 0.4 * size; break;
    case 'host_contention': effects.iterFactor *= 1 + 0.2 * size; effects.getattrFactor *= 1 + 2 * size; effects.power -= 80 * size; break;
  }
}

/** One fault's effect on its node at `time` (before the drain). */
function applyFault(effects: Effects, fault: FaultLabel, time: number, isXidStep: boolean, rng: Random): void {
  if (time >= fault.xid) {
    // The Xid line(s), a few follow-ups, and the job carrying on without this node.
    effects.xidEvents += isXidStep ? 1 + rng.poisson(0.5) : time < fault.xid + 5 * MINUTE ? rng.poisson(0.3) : 0;
    effects.idle = true;
    return;
  }
  const q = fault.strength * ((time - fault.onset) / Math.max(MINUTE, fault.xid - fault.onset)) ** 2;
  const late = Math.max(0, q - 0.5);
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
    case 'sudden':
      break;
  }
}
