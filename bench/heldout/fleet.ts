import { seededUniform } from '../../core/random.js';
import { FLEET_1, type FaultKind, type FleetVariant } from './variant.js';

/**
 * The labelled fleet of the held-out evaluation: which node runs what when, which faults strike
 * where (with their precursor start and failure time), and the benign events around them. It is
 * a plan only — bench/heldout/series.ts turns it into the agents' series. Every choice comes from
 * the seed, so a run is reproducible; the rates and shapes come from the published studies named
 * in bench/heldout/README.md, not from the detector under test.
 */

export const MINUTE = 60_000;
export const HOUR = 60 * MINUTE;
export const DAY = 24 * HOUR;

export interface FaultLabel {
  readonly id: string;
  readonly node: string;
  readonly gpu: number;
  readonly kind: FaultKind;
  /** When the first precursor begins (equal to `failure` for faults without one), ms. */
  readonly precursorStart: number;
  /** When the node fails: the Xid, the link down, the sustained slowdown, the silence, ms. */
  readonly failure: number;
  /** The Xid the failure logs, if any. */
  readonly xid?: number;
  /** The job is relaunched without the node then (the node stays registered until), ms. */
  readonly drainedAt: number;
  /** The node is out of service (drained, repaired, rebooted) until then, ms. */
  readonly repairedAt: number;
  /** The job the node belonged to at the failure; undefined for an idle node. */
  readonly job?: string;
}

export type JobPhaseKind = 'evaluation' | 'checkpoint' | 'slowdown' | 'restart';

export interface JobPhase {
  readonly kind: JobPhaseKind;
  readonly from: number;
  readonly to: number;
}

export interface JobPlan {
  readonly name: string;
  readonly nodes: readonly string[];
  readonly from: number;
  readonly to: number;
  readonly iterationSeconds: number;
  readonly phases: readonly JobPhase[];
}

/** Benign events: none of them is a fault, and a detector that raises them raises a false episode. */
export type Confuser =
  | { readonly kind: 'reboot'; readonly node: string; readonly at: number }
  | { readonly kind: 'spike'; readonly node: string; readonly gpu: number; readonly at: number }
  | { readonly kind: 'app_xid'; readonly node: string; readonly gpu: number; readonly xid: number; readonly at: number; readonly job: string }
  /** The node's data loader falls behind: its GPUs and its RDMA transmit idle down to `level` (the job waits on it). */
  | { readonly kind: 'loader_stall'; readonly node: string; readonly job: string; readonly at: number; readonly to: number; readonly level: number }
  /** Rank 0's node writes the job's checkpoint alone: its GPUs dip and its NFS round trips (GETATTR most) grow. */
  | { readonly kind: 'rank0_checkpoint'; readonly node: string; readonly job: string; readonly at: number; readonly to: number }
  /** The node runs a lighter pipeline stage for the whole job: its load times `factor`. */
  | { readonly kind: 'uneven_stage'; readonly node: string; readonly job: string; readonly at: number; readonly to: number; readonly factor: number }
  /** One GPU's PCIe link replays about `perSample` times a sample, all along, and never fails. */
  | { readonly kind: 'replay_trickle'; readonly node: string; readonly gpu: number; readonly at: number; readonly to: number; readonly perSample: number };

export interface NodeTraits {
  /** A constant offset: some nodes simply run warmer (airflow, position in the rack). */
  readonly temperatureOffset: number;
  readonly gpuOffsets: readonly number[];
  readonly powerScale: number;
}

export interface FleetPlan {
  readonly seed: number;
  readonly start: number;
  readonly end: number;
  readonly stepMs: number;
  readonly nodes: readonly string[];
  readonly gpusPerNode: number;
  readonly traits: ReadonlyMap<string, NodeTraits>;
  readonly jobs: readonly JobPlan[];
  readonly faults: readonly FaultLabel[];
  readonly confusers: readonly Confuser[];
  /** The variant the plan was drawn from, whose fault effects the series follow (default: fleet 1's). */
  readonly variant?: FleetVariant;
}

export interface FleetShape {
  readonly seed: number;
  /** Start of the data (ms), a whole minute. */
  readonly start: number;
  readonly days: number;
  readonly stepSeconds: number;
  readonly nodes: number;
  readonly gpusPerNode: number;
  /** The faults to place, one per node at most (default: the studies' mix of 24). */
  readonly faultKinds?: readonly FaultKind[];
  /** The fleet's shapes of faults and benign events (default: fleet 1, bench/heldout/variant.ts); `seed` stays the shape's. */
  readonly variant?: FleetVariant;
}

/** 64 nodes × 8 GPUs, three days at 30 s: the held-out fleets' size (the seed is fleet 1's; fleet 2 brings its own: variant.ts). */
export const DEFAULT_SHAPE = { seed: 20261123, days: 3, stepSeconds: 30, nodes: 64, gpusPerNode: 8 } as const;

export function nodeName(index: number): string {
  return `gpu${String(index + 1).padStart(3, '0')}`;
}

export function planFleet(shape: FleetShape): FleetPlan {
  const variant = shape.variant ?? FLEET_1;
  const random = seededUniform(shape.seed);
  const between = (low: number, high: number): number => low + (high - low) * random();
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;
  const end = shape.start + shape.days * DAY;
  const nodes = Array.from({ length: shape.nodes }, (_, index) => nodeName(index));

  const traits = new Map<string, NodeTraits>();
  for (const node of nodes) {
    // One node in eight is a "warm" node: 4-7 °C above its peers every day, for no fault.
    const warm = random() < 0.125 ? between(4, 7) : 0;
    traits.set(node, {
      temperatureOffset: warm + between(-1.5, 1.5),
      gpuOffsets: Array.from({ length: shape.gpusPerNode }, () => between(-2, 2)),
      powerScale: between(0.96, 1.04),
    });
  }

  // Disjoint jobs over three eighths, a quarter and two eighths of the fleet; the rest idle.
  const share = (from: number, to: number) => nodes.slice(Math.round(from * nodes.length), Math.round(to * nodes.length));
  const jobNodes = [share(0, 0.375), share(0.375, 0.625), share(0.625, 0.75), share(0.75, 0.875)];
  const jobs: { name: string; nodes: string[]; from: number; to: number; iterationSeconds: number; phases: JobPhase[] }[] = [
    { name: 'pretrain-a', nodes: jobNodes[0] ?? [], from: shape.start, to: end, iterationSeconds: 2.4, phases: [] },
    { name: 'pretrain-b', nodes: jobNodes[1] ?? [], from: shape.start, to: end, iterationSeconds: 3.1, phases: [] },
    { name: 'finetune-c', nodes: jobNodes[2] ?? [], from: shape.start, to: end, iterationSeconds: 1.2, phases: [] },
    {
      name: 'ablation-d',
      nodes: jobNodes[3] ?? [],
      from: shape.start + 0.3 * (end - shape.start),
      to: shape.start + 0.8 * (end - shape.start),
      iterationSeconds: 0.9,
      phases: [],
    },
  ];
  const idle = nodes.filter((node) => !jobs.some((job) => job.nodes.includes(node)));
  const minute = (time: number) => Math.round(time / MINUTE) * MINUTE;
  const confusers: Confuser[] = [];

  // Whole-job phases every node of a job shares (Greyhound §3: communication fail-slows last 24
  // minutes on average and slow every GPU of the job at once).
  for (const job of jobs) {
    // Checkpoints: every node of the job writes at once, or rank 0 alone while the others go on.
    const alone = variant.confusers.rank0CheckpointJobs.includes(job.name);
    const [shortest, longest] = alone ? variant.confusers.rank0CheckpointMinutes : [3, 8];
    for (let at = job.from + between(1, 2) * HOUR; at < job.to - HOUR; at += between(100, 140) * MINUTE) {
      const [from, to] = [minute(at), minute(at + between(shortest, longest) * MINUTE)];
      if (alone) confusers.push({ kind: 'rank0_checkpoint', node: job.nodes[0] as string, job: job.name, at: from, to });
      else job.phases.push({ kind: 'checkpoint', from, to });
    }
    for (let at = job.from + between(3, 6) * HOUR; at < job.to - HOUR; at += between(5, 7) * HOUR) {
      job.phases.push({ kind: 'evaluation', from: minute(at + 15 * MINUTE), to: minute(at + 15 * MINUTE + between(8, 15) * MINUTE) });
    }
    for (let at = job.from + between(4, 12) * HOUR; at < job.to - HOUR; at += between(10, 20) * HOUR) {
      job.phases.push({ kind: 'slowdown', from: minute(at + 30 * MINUTE), to: minute(at + 30 * MINUTE + between(10, 60) * MINUTE) });
    }
  }

  // Faults at distinct times on distinct nodes, most on job nodes, two on idle ones.
  const faults: FaultLabel[] = [];
  const used = new Set<string>();
  const kinds = shape.faultKinds ?? variant.faultMix;
  if (kinds.length > nodes.length) throw new RangeError(`${kinds.length} faults need at least as many nodes, not ${nodes.length}`);
  const slots = kinds.length;
  kinds.forEach((kind, index) => {
    const failure = minute(shape.start + (0.1 + (0.85 * (index + between(0.1, 0.9))) / slots) * (end - shape.start) * 1);
    const onIdle = shape.faultKinds === undefined && variant.idleFaults.includes(index);
    const running = jobs.filter((job) => job.from + 2 * HOUR < failure && failure < job.to);
    const job = onIdle ? undefined : pick(running);
    const pool = (job ? job.nodes : idle).filter((node) => !used.has(node));
    const node = pick(pool.length > 0 ? pool : nodes.filter((name) => !used.has(name)));
    used.add(node);
    const [low, high] = variant.precursorMinutes[kind];
    const precursorStart = minute(failure - between(low, high) * MINUTE);
    const relaunched = minute(failure + between(9, 13) * MINUTE);
    const xid = kind === 'hbm_ecc' ? pick([48, 63, 64, 79]) : kind === 'pcie_replay' ? 79 : kind === 'sudden_xid' ? pick([79, 119]) : undefined;
    faults.push({
      id: `F${String(index + 1).padStart(2, '0')}`,
      node,
      gpu: Math.floor(random() * shape.gpusPerNode),
      kind,
      precursorStart,
      failure,
      ...(xid === undefined ? {} : { xid }),
      drainedAt: relaunched,
      repairedAt: minute(failure + between(2, 4) * HOUR),
      ...(job ? { job: job.name } : {}),
    });
    // The job stops when a member fails and the launcher restarts it on the rest (the 504-GPU
    // report: a median of 11 minutes between automatic retries).
    if (job) job.phases.push({ kind: 'restart', from: failure, to: relaunched });
  });

  // Benign events: reboots (counters restart at 0), one-sample spikes, application Xids (user
  // code faults that crash the job; ByteRobust Table 2) that a plain Xid watch mistakes for hardware.
  const quiet = (node: string, at: number) =>
    !faults.some((fault) => fault.node === node && at > fault.precursorStart - 2 * HOUR && at < fault.repairedAt + HOUR);
  const daysSpan = (end - shape.start) / DAY;
  for (let count = 0; count < Math.round(3 * daysSpan);) {
    const node = pick(nodes);
    const at = minute(between(shape.start + HOUR, end - HOUR));
    if (quiet(node, at)) {
      confusers.push({ kind: 'reboot', node, at });
      count += 1;
    }
  }
  for (let count = 0; count < Math.round(8 * daysSpan);) {
    const node = pick(nodes);
    const at = minute(between(shape.start + HOUR, end - HOUR)) + 30_000;
    if (quiet(node, at)) {
      confusers.push({ kind: 'spike', node, gpu: Math.floor(random() * shape.gpusPerNode), at });
      count += 1;
    }
  }
  for (let count = 0; count < Math.round(2 * daysSpan);) {
    const at = minute(between(shape.start + 2 * HOUR, end - HOUR));
    const job = pick(jobs.filter((candidate) => candidate.from + HOUR < at && at < candidate.to));
    if (!job) continue;
    const node = pick(job.nodes);
    if (!quiet(node, at)) continue;
    confusers.push({ kind: 'app_xid', node, gpu: Math.floor(random() * shape.gpusPerNode), xid: pick([13, 31, 43]), at, job: job.name });
    job.phases.push({ kind: 'restart', from: at, to: minute(at + between(9, 13) * MINUTE) });
    count += 1;
  }
  confusers.push(...oneNodeDips(variant, jobs, faults, quiet, random));
  // GPUs that replay now and then all along, on nodes that never fault (drawn last: fleets without them draw as before).
  const trickles = variant.confusers.replayTrickles;
  const healthy = nodes.filter((node) => !faults.some((fault) => fault.node === node));
  for (let count = 0; trickles && count < trickles.gpus && healthy.length > 0; count += 1) {
    const node = healthy.splice(Math.floor(random() * healthy.length), 1)[0] as string;
    confusers.push({
      kind: 'replay_trickle',
      node,
      gpu: Math.floor(random() * shape.gpusPerNode),
      at: shape.start,
      to: end,
      perSample: between(...trickles.perSample),
    });
  }
  for (const job of jobs) job.phases.sort((a, b) => a.from - b.from);

  // A rank-0 checkpoint of a node on its way to a fault (or in repair) would be the fault's, not a confuser.
  const kept = confusers.filter((confuser) => confuser.kind !== 'rank0_checkpoint' || quiet(confuser.node, confuser.at));
  return {
    seed: shape.seed,
    start: shape.start,
    end,
    stepMs: shape.stepSeconds * 1000,
    nodes,
    gpusPerNode: shape.gpusPerNode,
    traits,
    jobs,
    faults,
    confusers: kept,
    variant,
  };
}

/**
 * The one-node dips of real jobs a variant turns on (none in fleet 1, which draws nothing here):
 * data-loader stalls of one node a few times a day per job, and one node per job on a lighter
 * pipeline stage for the whole job.
 */
function oneNodeDips(
  variant: FleetVariant,
  jobs: readonly { name: string; nodes: readonly string[]; from: number; to: number }[],
  faults: readonly FaultLabel[],
  quiet: (node: string, at: number) => boolean,
  random: () => number,
): Confuser[] {
  const between = (low: number, high: number): number => low + (high - low) * random();
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;
  const minute = (time: number) => Math.round(time / MINUTE) * MINUTE;
  const settings = variant.confusers;
  const dips: Confuser[] = [];
  for (const job of jobs) {
    const wanted = Math.round((settings.loaderStallsPerJobDay * (job.to - job.from)) / DAY);
    for (let count = 0, tries = 0; count < wanted && tries < 100 * wanted; tries += 1) {
      const at = minute(between(job.from + HOUR, job.to - HOUR));
      const node = pick(job.nodes);
      if (!quiet(node, at)) continue;
      const [shortest, longest] = settings.loaderStallMinutes;
      const [low, high] = settings.loaderStallLevel;
      dips.push({ kind: 'loader_stall', node, job: job.name, at, to: minute(at + between(shortest, longest) * MINUTE), level: between(low, high) });
      count += 1;
    }
  }
  if (settings.unevenStage) {
    const [low, high] = settings.unevenStage;
    for (const job of jobs) {
      const healthy = job.nodes.filter((node) => !faults.some((fault) => fault.node === node));
      if (healthy.length === 0) continue;
      dips.push({ kind: 'uneven_stage', node: pick(healthy), job: job.name, at: job.from, to: job.to, factor: between(low, high) });
    }
  }
  return dips;
}

/** The jobs running at `time`, each with the nodes it runs on then (failed nodes leave until repaired). */
export function jobsAt(plan: FleetPlan, time: number): { name: string; nodes: string[] }[] {
  return plan.jobs
    .filter((job) => job.from <= time && time < job.to)
    .map((job) => ({ name: job.name, nodes: job.nodes.filter((node) => !outOfService(plan, node, time)) }))
    .filter((job) => job.nodes.length > 0);
}

/** Whether `node` is out of its job at `time` (from the relaunch without it until its repair). */
export function outOfService(plan: FleetPlan, node: string, time: number): boolean {
  return plan.faults.some((fault) => fault.node === node && fault.drainedAt <= time && time < fault.repairedAt);
}
