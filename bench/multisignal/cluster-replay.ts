import { z } from 'zod';
import type { FeatureMatrix } from '../../analyzers/multisignal/types.js';
import { InputError } from '../../core/errors.js';
import { parseOrThrow } from '../../core/validate.js';
import { BENIGN_KINDS, FAULT_KINDS, type BenignKind, type BenignLabel, type FaultKind, type FaultLabel } from './labels.js';
import {
  AR_INNOVATION,
  AR_KEEP,
  BLIP_KINDS,
  BLIP_WEIGHTS,
  NOISE,
  GPUS,
  SLOT,
  Window,
  XidSlots,
  applyBlip,
  applyFault,
  neutral,
  readings,
  windows,
  type Blip,
  type NodeState,
} from './node-readings.js';
import { Random } from './replay-random.js';

/**
 * The labelled replay the multi-signal detector is evaluated on (evaluation.ts):
 * a seeded 63-node cluster (the 504-GPU report's, 002) over D days at one sample a minute, each
 * sample the node × feature matrix the default Prometheus queries would give
 * (analyzers/multisignal/source.ts), with faults whose onset and Xid time are known. What one
 * node reads at one step is node-readings.ts; the labels are labels.ts.
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

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

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
    /** Sizes of the training jobs, in nodes; the nodes left over idle, in no job. */
    jobs: z.array(z.int().min(1)).min(1),
    /** Nodes that are simply different (a hotter slot, a lower power cap), all the time. */
    differentNodes: z.int().min(0),
    /** Scrape gaps (a node missing one or two frames) per node and day. */
    scrapeGapsPerNodeDay: z.number().min(0),
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
  jobs: [24, 16, 16],
  differentNodes: 6,
  scrapeGapsPerNodeDay: 1,
};

/** A seeded cluster replay; `frames()` yields one matrix a step, in time order. */
export class ClusterReplay {
  readonly config: ReplayConfig;
  readonly faults: readonly FaultLabel[];
  readonly benign: readonly BenignLabel[];
  readonly steps: number;
  /** Job index per node (-1: idle, in no job). */
  readonly jobOf: readonly number[];
  private readonly nodes: NodeState[];
  private readonly blips: Blip[];
  private readonly gaps: Set<number>;

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
      offset[SLOT.memTemp] =
        (0.5 * (offset[SLOT.temp] as number) * (NOISE[SLOT.memTemp]?.[0] as number)) / (NOISE[SLOT.temp]?.[0] as number) +
        Math.sqrt(0.75) * (offset[SLOT.memTemp] as number);
      return {
        name: `gpu${String(index + 1).padStart(3, '0')}`,
        offset,
        drift: new Float64Array(NOISE.length),
        eccBase: rng.next() < 0.05 ? rng.uniform(0.02, 0.08) : 0.0005,
        extra: { temp: 0, power: 0 },
        load: 1,
        ecc: windows(10),
        remaps: windows(60),
        pcie: windows(5),
        pcieSlots: Array.from({ length: GPUS }, () => new XidSlots()),
        xid: new Window(5),
        xidFatal: new Window(5),
        xidHour: new XidSlots(),
        link: new Window(5),
        throttle: new Window(5),
      };
    });

    // Jobs take the nodes in order; the rest are idle. Some nodes are simply different.
    let cursor = 0;
    const jobOf = this.nodes.map(() => -1);
    this.config.jobs.forEach((size, job) => {
      for (let index = 0; index < size && cursor < nodes; index += 1) jobOf[cursor++] = job;
    });
    this.jobOf = jobOf;
    for (let count = 0; count < this.config.differentNodes; count += 1) {
      const node = this.nodes[Math.floor(rng.next() * nodes)] as NodeState;
      if (count % 2 === 0) node.extra.temp = rng.uniform(6, 10);
      else node.extra.power = -rng.uniform(40, 70);
    }

    // Faults: spread over the run after an 8-hour warm-up, kinds in turn, each on its own node of a job.
    const warmup = 8 * HOUR;
    const span = (end - 2 * HOUR - (start + warmup)) / Math.max(1, this.config.faults);
    const victims = this.nodes.map((_, index) => index).filter((index) => jobOf[index] !== -1);
    for (let index = victims.length - 1; index > 0; index -= 1) {
      const other = Math.floor(rng.next() * (index + 1));
      [victims[index], victims[other]] = [victims[other] as number, victims[index] as number];
    }
    const leads: Record<FaultKind, [number, number]> = {
      thermal: [1 * HOUR, 6 * HOUR],
      memory: [20 * MINUTE, 3 * HOUR],
      pcie: [10 * MINUTE, HOUR],
      slowdown: [30 * MINUTE, 2 * HOUR],
      sudden: [0, 0],
      powerbrake: [1 * HOUR, 3 * HOUR],
      hang: [10 * MINUTE, 30 * MINUTE],
    };
    const codes: Record<FaultKind, number> = { thermal: 79, memory: 48, pcie: 74, slowdown: 62, sudden: 79, powerbrake: 79, hang: 119 };
    this.faults = Array.from({ length: this.config.faults }, (_, index) => {
      const kind = FAULT_KINDS[index % FAULT_KINDS.length] as FaultKind;
      const xid = this.snap(start + warmup + (index + rng.uniform(0.2, 0.8)) * span);
      const drained = this.snap(xid + rng.uniform(15, 45) * MINUTE);
      const [low, high] = leads[kind];
      return {
        node: (this.nodes[victims[index % victims.length] as number] as NodeState).name,
        kind,
        onset: this.snap(xid - rng.uniform(low, high)),
        xid,
        xidCode: codes[kind],
        drained,
        repaired: this.snap(drained + rng.uniform(6, 24) * HOUR),
        strength: rng.uniform(...this.config.strengthRange),
        device: Math.floor(rng.next() * 8),
      };
    });

    this.blips = [];
    const stepOf = (time: number) => Math.floor((time - start) / (stepSeconds * 1000));
    const faultNear = (node: string, time: number) =>
      this.faults.some((fault) => fault.node === node && time > fault.onset - 2 * HOUR && time < fault.repaired + HOUR);
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
    // Scrape gaps: a node of a job missing from one or two frames, and nothing wrong with it.
    this.gaps = new Set();
    this.nodes.forEach((_, node) => {
      for (let count = rng.poisson(this.config.scrapeGapsPerNodeDay * days); count > 0; count -= 1) {
        const first = Math.floor(rng.next() * this.steps);
        const length = rng.next() < 0.7 ? 1 : 2;
        for (let step = first; step < first + length; step += 1) this.gaps.add(step * nodes + node);
      }
    });
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

  /** The frames, one a minute, each with its peer groups (node → job; drained nodes have left); every call starts over and yields the same sequence. */
  *frames(): Generator<{ time: number; matrix: FeatureMatrix; groups: Record<string, string> }> {
    const rng = new Random(this.config.seed ^ 0x5eed);
    for (const node of this.nodes) {
      node.drift.fill(0);
      node.load = 1;
      clearWindows(node);
    }
    const { start, stepSeconds } = this.config;
    const stepMs = stepSeconds * 1000;
    const lateness = () =>
      Int8Array.from(this.nodes, () => {
        const roll = rng.next();
        return roll < 0.8 ? 0 : roll < 0.95 ? 1 : 2;
      });
    // Every job has its own schedule: checkpoints, restarts, evaluation phases, slowdowns.
    const jobs = this.config.jobs.map((_, job) => ({
      nextCheckpoint: Math.round(rng.uniform(20, 60)),
      checkpoint: { until: -1, late: new Int8Array(this.nodes.length) },
      restart: { until: -1, late: new Int8Array(this.nodes.length) },
      evaluationOffset: job * 47 * MINUTE,
      slowdown: { until: -1, depth: 0 },
      dataPhase: 0,
    }));
    let congestion = 0;
    let blipIndex = 0;
    let active: Blip[] = [];

    for (let step = 0; step < this.steps; step += 1) {
      const time = start + step * stepMs;
      const diurnal = 2 * Math.sin((2 * Math.PI * (time - start)) / DAY);
      congestion = 0.95 * congestion + 0.3 * 0.5 * rng.normal();
      for (const job of jobs) {
        if (step === job.nextCheckpoint) {
          job.checkpoint = { until: step + Math.round(rng.uniform(3, 6)), late: lateness() };
          job.nextCheckpoint = step + Math.round(rng.uniform(40, 80));
        }
        // About 0.7 whole-job restarts a day, 4 to 10 minutes idle everywhere.
        if (step > job.restart.until && rng.next() < 0.7 / 1440) job.restart = { until: step + Math.round(rng.uniform(4, 10)), late: lateness() };
        // About one job-wide slowdown a day (a slow input shard, a throttled filesystem), 20 to 60 minutes.
        if (step > job.slowdown.until && rng.next() < 1 / 1440) job.slowdown = { until: step + Math.round(rng.uniform(20, 60)), depth: rng.uniform(0.5, 1) };
        job.dataPhase = 0.98 * job.dataPhase + 0.2 * 0.01 * rng.normal();
      }
      while (blipIndex < this.blips.length && (this.blips[blipIndex] as Blip).start <= step) active.push(this.blips[blipIndex++] as Blip);
      active = active.filter((blip) => blip.end > step);

      const rows: [string, Record<string, number | number[] | undefined>][] = [];
      const groups: Record<string, string> = {};
      this.nodes.forEach((node, index) => {
        const jobIndex = this.jobOf[index] as number;
        const job = jobs[jobIndex];
        const effects = neutral();
        for (const blip of active) if (blip.node === index) applyBlip(effects, blip);
        let absent = false;
        let silent = false;
        for (const fault of this.faults) {
          if (fault.node !== node.name || time < fault.onset || time >= fault.repaired) continue;
          if (time >= fault.drained) absent = true;
          else if (fault.kind === 'hang') silent = true;
          else applyFault(effects, fault, time, step === (fault.xid - start) / stepMs, rng);
        }
        if (absent) {
          clearWindows(node);
          node.load = 1;
          return;
        }
        if (job) groups[node.name] = `job-${jobIndex + 1}`;
        const gap = this.gaps.has(step * this.nodes.length + index);
        if (silent || gap) return;
        const inCheckpoint = job !== undefined && step <= job.checkpoint.until + (job.checkpoint.late[index] as number);
        const inRestart = job !== undefined && step <= job.restart.until + (job.restart.late[index] as number);
        const evaluationPhase = job !== undefined && (time - start + job.evaluationOffset) % (4 * HOUR) < 8 * MINUTE;
        const load = job === undefined ? 0.02 : effects.idle || inRestart ? 0.02 : inCheckpoint ? 0.15 : evaluationPhase ? 0.8 : 1;
        node.load += (load - node.load) * 0.3; // thermal inertia
        for (let slot = 0; slot < NOISE.length; slot += 1) {
          node.drift[slot] = AR_KEEP * (node.drift[slot] as number) + AR_INNOVATION * (NOISE[slot]?.[1] as number) * rng.normal();
        }
        const jobSlowdown = job !== undefined && step <= job.slowdown.until ? job.slowdown.depth : 0;
        rows.push([
          node.name,
          readings(node, effects, { load, inCheckpoint, inRestart, diurnal, dataPhase: job?.dataPhase ?? 0, congestion, jobSlowdown }, rng),
        ]);
      });
      yield { time, matrix: Object.fromEntries(rows), groups };
    }
  }
}

function clearWindows(node: NodeState): void {
  for (const window of [...node.ecc, ...node.remaps, ...node.pcie, ...node.pcieSlots, node.xid, node.xidFatal, node.xidHour, node.link, node.throttle])
    window.clear();
}
