/**
 * What differs between the held-out fleets, as data: the seed, the order of the fault kinds in
 * time, which faults strike idle nodes, how long each kind's precursor lasts and how strongly it
 * shows, and which benign events run beside them. bench/heldout/fleet.ts plans a fleet from a
 * variant and bench/heldout/timeline.ts draws the faults' effects from it; the code is one.
 *
 * One variant per fleet; once a fleet's figures have guided a change to the detector it is spent,
 * and a new fleet is added rather than tuning on the one held out. Which fleets are spent, and
 * what each guided, is in bench/heldout/README.md.
 */

/** The kinds of fault a fleet plans, each with its precursor (or none) on the way to the failure. */
export type FaultKind =
  | 'hbm_ecc' // correctable ECC and row remaps pile up, then Xid 48/63/64/79
  | 'pcie_replay' // PCIe replays climb, then the GPU falls off the bus (Xid 79)
  | 'thermal' // a GPU runs ever hotter until thermal slowdown holds its clocks down
  | 'power_brake' // intermittent power-brake slowdowns on the whole board, then sustained
  | 'ib_link' // symbol errors on one port, then the link goes down
  | 'nfs_backlog' // the NFS client's RPC slots fill, round trips grow, then major timeouts
  | 'sudden_xid' // no precursor: Xid 79 or 119 out of the blue
  | 'silent'; // the node stops answering: no series at all

export type FleetId = 1 | 2 | 3 | 4;

/** How each kind of fault shows on its way to the failure; `p` is the precursor's progress, 0 to 1. */
export interface FaultEffects {
  /** Correctable ECC per step: base + scale·p²·(burst with burstProbability, else calm); remaps from p ≥ remapFrom. */
  readonly hbm_ecc: {
    readonly base: number;
    readonly scale: number;
    readonly burstProbability: number;
    readonly burst: number;
    readonly calm: number;
    readonly remapFrom: number;
    readonly remapBase: number;
    readonly remapScale: number;
    /** HBM warmer by this many °C at the failure. */
    readonly memoryWarming: number;
    /** Every other memory fault also slows NFS GETATTR by `getattrRtt`× from p > getattrFrom. */
    readonly getattrFrom: number;
    readonly getattrRtt: number;
  };
  /** Replays per step: base + scale·p^exponent. */
  readonly pcie_replay: { readonly base: number; readonly scale: number; readonly exponent: number };
  /**
   * The GPU (and with it its HBM) warms linearly by a peak drawn per fault from `peak` (°C over
   * the node's own normal); thermal-slowdown episodes from p > throttleFrom; held at the failure.
   */
  readonly thermal: {
    readonly peak: readonly [number, number];
    readonly throttleFrom: number;
    readonly throttleProbability: number;
    readonly throttleSteps: number;
    readonly clock: number;
    readonly power: number;
  };
  /** Power-brake episodes on every GPU of the board: start probability base + scale·p per step, a length in steps. */
  readonly power_brake: {
    readonly base: number;
    readonly scale: number;
    readonly episodeSteps: readonly [number, number];
    readonly clock: number;
    readonly power: number;
  };
  /** Per-port errors per step: base + scale·p². */
  readonly ib_link: { readonly symbolBase: number; readonly symbolScale: number; readonly receiveBase: number; readonly receiveScale: number };
  /** Round trips (1 + rtt·p)×, retransmitted share, backlog, major timeouts from p > timeoutsFrom; the job starves from p > starveFrom. */
  readonly nfs_backlog: {
    readonly rtt: number;
    readonly retransmit: number;
    readonly backlog: number;
    readonly timeoutsFrom: number;
    readonly timeouts: number;
    readonly starveFrom: number;
  };
}

/** The one-node benign events a variant adds to the ones every fleet has (reboots, spikes, application Xids, warm nodes, job phases). */
export interface ConfuserSettings {
  /** Data-loader stalls of one node per job and day: its GPUs and its RDMA transmit idle down for a few minutes. */
  readonly loaderStallsPerJobDay: number;
  readonly loaderStallMinutes: readonly [number, number];
  /** The stalled node's load, as a share of full. */
  readonly loaderStallLevel: readonly [number, number];
  /** Jobs whose checkpoints rank 0 writes alone (the others keep computing), instead of every node at once. */
  readonly rank0CheckpointJobs: readonly string[];
  readonly rank0CheckpointMinutes: readonly [number, number];
  /** One node per job runs a lighter pipeline stage: its load times a factor from this range, for good. */
  readonly unevenStage?: readonly [number, number];
  /**
   * GPUs of healthy nodes whose PCIe link replays now and then for the whole period and never
   * fails (a marginal riser or slot that stays marginal): `gpus` of them, each at a rate per
   * sample drawn from `perSample`.
   */
  readonly replayTrickles?: { readonly gpus: number; readonly perSample: readonly [number, number] };
}

export interface FleetVariant {
  readonly id: FleetId;
  readonly seed: number;
  /** The fault kinds in the order of their failure times. */
  readonly faultMix: readonly FaultKind[];
  /** Indices in faultMix of the faults that strike idle nodes. */
  readonly idleFaults: readonly number[];
  /** Precursor length range per kind, minutes. */
  readonly precursorMinutes: Readonly<Record<FaultKind, readonly [number, number]>>;
  readonly effects: FaultEffects;
  readonly confusers: ConfuserSettings;
}

/** The first held-out fleet, exactly as it was first generated. */
export const FLEET_1: FleetVariant = {
  id: 1,
  seed: 20261123,
  // GPU memory and bus faults lead (the 504-GPU report; ByteRobust Table 2).
  faultMix: [
    'hbm_ecc',
    'hbm_ecc',
    'hbm_ecc',
    'hbm_ecc',
    'hbm_ecc',
    'pcie_replay',
    'pcie_replay',
    'pcie_replay',
    'thermal',
    'thermal',
    'thermal',
    'power_brake',
    'power_brake',
    'ib_link',
    'ib_link',
    'ib_link',
    'nfs_backlog',
    'nfs_backlog',
    'sudden_xid',
    'sudden_xid',
    'sudden_xid',
    'sudden_xid',
    'silent',
    'silent',
  ],
  idleFaults: [2, 6],
  precursorMinutes: {
    hbm_ecc: [120, 600],
    pcie_replay: [30, 240],
    thermal: [60, 180],
    power_brake: [60, 120],
    ib_link: [60, 360],
    nfs_backlog: [20, 60],
    sudden_xid: [0, 0],
    silent: [0, 0],
  },
  effects: {
    hbm_ecc: {
      base: 0.01,
      scale: 2.5,
      burstProbability: 0.3,
      burst: 3,
      calm: 0.2,
      remapFrom: 0,
      remapBase: 0.0015,
      remapScale: 0.01,
      memoryWarming: 2,
      getattrFrom: 0.7,
      getattrRtt: 2.5,
    },
    pcie_replay: { base: 0.02, scale: 6, exponent: 2 },
    thermal: { peak: [14, 14], throttleFrom: 0.4, throttleProbability: 0.05, throttleSteps: 3, clock: 0.68, power: 0.8 },
    power_brake: { base: 0.02, scale: 0.04, episodeSteps: [2, 2], clock: 0.45, power: 0.55 },
    ib_link: { symbolBase: 0.3, symbolScale: 40, receiveBase: 0.05, receiveScale: 4 },
    nfs_backlog: { rtt: 9, retransmit: 0.03, backlog: 60, timeoutsFrom: 0.8, timeouts: 0.2, starveFrom: 0.6 },
  },
  confusers: { loaderStallsPerJobDay: 0, loaderStallMinutes: [1, 15], loaderStallLevel: [0.1, 0.4], rank0CheckpointJobs: [], rank0CheckpointMinutes: [2, 8] },
};

/**
 * The second held-out fleet: the same eight kinds in the same numbers, in another order in time,
 * with other precursors — ECC errors fewer and burstier with the remaps only at the end (the
 * 504-GPU report's remapping before the failure); slower, lower PCIe replay climbs; a slow
 * thermal creep of 3–6 h, +8..12 °C, slowdown only near the end (ByteRobust's thermal gray
 * failure); rarer, shorter power-brake episodes for 1–3 h; link trouble that shows as receive
 * errors more than symbol errors; a shorter NFS backlog — and one-node dips real jobs produce
 * (data-loader stalls, rank 0 writing the checkpoint alone, an uneven pipeline stage).
 */
export const FLEET_2: FleetVariant = {
  id: 2,
  seed: 20261128,
  faultMix: [
    'ib_link',
    'hbm_ecc',
    'sudden_xid',
    'thermal',
    'pcie_replay',
    'nfs_backlog',
    'hbm_ecc',
    'power_brake',
    'silent',
    'thermal',
    'hbm_ecc',
    'ib_link',
    'sudden_xid',
    'pcie_replay',
    'hbm_ecc',
    'power_brake',
    'nfs_backlog',
    'sudden_xid',
    'thermal',
    'ib_link',
    'hbm_ecc',
    'pcie_replay',
    'silent',
    'sudden_xid',
  ],
  idleFaults: [9, 17],
  precursorMinutes: {
    hbm_ecc: [60, 360],
    pcie_replay: [90, 480],
    thermal: [180, 360],
    power_brake: [60, 180],
    ib_link: [30, 240],
    nfs_backlog: [8, 25],
    sudden_xid: [0, 0],
    silent: [0, 0],
  },
  effects: {
    hbm_ecc: {
      base: 0.003,
      scale: 1.5,
      burstProbability: 0.06,
      burst: 12,
      calm: 0.03,
      remapFrom: 0.8,
      remapBase: 0.002,
      remapScale: 0.02,
      memoryWarming: 1,
      getattrFrom: 0.8,
      getattrRtt: 2,
    },
    pcie_replay: { base: 0.01, scale: 2, exponent: 3 },
    thermal: { peak: [8, 12], throttleFrom: 0.9, throttleProbability: 0.08, throttleSteps: 2, clock: 0.72, power: 0.82 },
    power_brake: { base: 0.01, scale: 0.03, episodeSteps: [1, 2], clock: 0.55, power: 0.5 },
    ib_link: { symbolBase: 0.05, symbolScale: 4, receiveBase: 0.2, receiveScale: 20 },
    nfs_backlog: { rtt: 7, retransmit: 0.02, backlog: 45, timeoutsFrom: 0.75, timeouts: 0.3, starveFrom: 0.5 },
  },
  confusers: {
    loaderStallsPerJobDay: 4,
    loaderStallMinutes: [1, 15],
    loaderStallLevel: [0.1, 0.4],
    rank0CheckpointJobs: ['pretrain-b', 'ablation-d'],
    rank0CheckpointMinutes: [2, 8],
    unevenStage: [0.9, 0.95],
  },
};

/**
 * The third held-out fleet, written before any detector ran on it: the same eight kinds in the
 * same numbers in yet another order, with precursors between fleet 1's and fleet 2's — ECC
 * errors moderately bursty with remaps from halfway; PCIe replays climbing as p^2.5 from a low
 * start; thermal creeps of 1.5–5 h peaking anywhere from +6 to +16 °C; power-brake episodes of
 * one to three samples; link trouble in symbol and receive errors alike; NFS backlogs of
 * 15–45 min — and the one-node dips again with other rates and lengths (rank 0 writing alone in
 * two other jobs, longer and deeper loader stalls), plus three GPUs that trickle PCIe replays for
 * the whole three days and never fail.
 */
export const FLEET_3: FleetVariant = {
  id: 3,
  seed: 20261130,
  faultMix: [
    'hbm_ecc',
    'thermal',
    'ib_link',
    'sudden_xid',
    'pcie_replay',
    'silent',
    'power_brake',
    'hbm_ecc',
    'nfs_backlog',
    'ib_link',
    'sudden_xid',
    'thermal',
    'pcie_replay',
    'hbm_ecc',
    'power_brake',
    'sudden_xid',
    'ib_link',
    'nfs_backlog',
    'hbm_ecc',
    'silent',
    'thermal',
    'pcie_replay',
    'sudden_xid',
    'hbm_ecc',
  ],
  idleFaults: [4, 15],
  precursorMinutes: {
    hbm_ecc: [90, 480],
    pcie_replay: [60, 360],
    thermal: [90, 300],
    power_brake: [45, 150],
    ib_link: [45, 300],
    nfs_backlog: [15, 45],
    sudden_xid: [0, 0],
    silent: [0, 0],
  },
  effects: {
    hbm_ecc: {
      base: 0.006,
      scale: 2,
      burstProbability: 0.15,
      burst: 6,
      calm: 0.1,
      remapFrom: 0.5,
      remapBase: 0.001,
      remapScale: 0.015,
      memoryWarming: 1.5,
      getattrFrom: 0.75,
      getattrRtt: 2.2,
    },
    pcie_replay: { base: 0.015, scale: 3, exponent: 2.5 },
    thermal: { peak: [6, 16], throttleFrom: 0.7, throttleProbability: 0.06, throttleSteps: 2, clock: 0.7, power: 0.85 },
    power_brake: { base: 0.015, scale: 0.035, episodeSteps: [1, 3], clock: 0.5, power: 0.52 },
    ib_link: { symbolBase: 0.1, symbolScale: 15, receiveBase: 0.1, receiveScale: 8 },
    nfs_backlog: { rtt: 8, retransmit: 0.025, backlog: 50, timeoutsFrom: 0.8, timeouts: 0.25, starveFrom: 0.55 },
  },
  confusers: {
    loaderStallsPerJobDay: 3,
    loaderStallMinutes: [2, 20],
    loaderStallLevel: [0.05, 0.5],
    rank0CheckpointJobs: ['pretrain-a', 'finetune-c'],
    rank0CheckpointMinutes: [3, 10],
    unevenStage: [0.85, 0.95],
    replayTrickles: { gpus: 3, perSample: [0.03, 0.15] },
  },
};

/**
 * The fourth held-out fleet, written before any detector ran on it: the same kinds and numbers in
 * another order (a memory fault and a thermal creep on idle nodes), precursors of other lengths —
 * sparse ECC bursts with remaps from two thirds of the way; PCIe replays climbing as p^2.8 from
 * the lowest start yet; thermal creeps of 2–5.5 h by +7..13 °C; brakes of one or two samples;
 * link trouble mostly as receive errors; NFS backlogs of 12–40 min — and the one-node dips again:
 * more frequent, shorter loader stalls, rank 0 writing alone in two other jobs, lighter pipeline
 * stages down to 80 % of the load, and two GPUs that trickle PCIe replays all along.
 */
export const FLEET_4: FleetVariant = {
  id: 4,
  seed: 20261201,
  faultMix: [
    'thermal',
    'sudden_xid',
    'hbm_ecc',
    'ib_link',
    'power_brake',
    'pcie_replay',
    'hbm_ecc',
    'silent',
    'nfs_backlog',
    'thermal',
    'sudden_xid',
    'ib_link',
    'hbm_ecc',
    'pcie_replay',
    'sudden_xid',
    'power_brake',
    'hbm_ecc',
    'nfs_backlog',
    'ib_link',
    'thermal',
    'silent',
    'pcie_replay',
    'hbm_ecc',
    'sudden_xid',
  ],
  idleFaults: [6, 19],
  precursorMinutes: {
    hbm_ecc: [75, 420],
    pcie_replay: [75, 420],
    thermal: [120, 330],
    power_brake: [50, 160],
    ib_link: [40, 270],
    nfs_backlog: [12, 40],
    sudden_xid: [0, 0],
    silent: [0, 0],
  },
  effects: {
    hbm_ecc: {
      base: 0.004,
      scale: 1.8,
      burstProbability: 0.1,
      burst: 8,
      calm: 0.06,
      remapFrom: 0.65,
      remapBase: 0.0015,
      remapScale: 0.012,
      memoryWarming: 1.2,
      getattrFrom: 0.7,
      getattrRtt: 2.5,
    },
    pcie_replay: { base: 0.008, scale: 2.5, exponent: 2.8 },
    thermal: { peak: [7, 13], throttleFrom: 0.8, throttleProbability: 0.07, throttleSteps: 2, clock: 0.7, power: 0.83 },
    power_brake: { base: 0.012, scale: 0.03, episodeSteps: [1, 2], clock: 0.52, power: 0.5 },
    ib_link: { symbolBase: 0.08, symbolScale: 10, receiveBase: 0.15, receiveScale: 12 },
    nfs_backlog: { rtt: 6, retransmit: 0.02, backlog: 40, timeoutsFrom: 0.75, timeouts: 0.3, starveFrom: 0.5 },
  },
  confusers: {
    loaderStallsPerJobDay: 5,
    loaderStallMinutes: [1, 10],
    loaderStallLevel: [0.2, 0.6],
    rank0CheckpointJobs: ['pretrain-b', 'finetune-c'],
    rank0CheckpointMinutes: [2, 9],
    unevenStage: [0.8, 0.92],
    replayTrickles: { gpus: 2, perSample: [0.02, 0.2] },
  },
};

export const FLEETS: Readonly<Record<FleetId, FleetVariant>> = { 1: FLEET_1, 2: FLEET_2, 3: FLEET_3, 4: FLEET_4 };

/** The fleet STEADFAST_BENCH_HELDOUT_FLEET selects: 1 (the default), 2, 3 or 4; anything else is an error. */
export function fleetFromEnv(value: string | undefined): FleetVariant {
  if (value === undefined || value.trim() === '') return FLEET_1;
  const variant = Object.hasOwn(FLEETS, value.trim()) ? FLEETS[Number(value.trim()) as FleetId] : undefined;
  if (!variant) throw new RangeError(`STEADFAST_BENCH_HELDOUT_FLEET must be 1, 2, 3 or 4 (the held-out fleet to evaluate), got "${value}"`);
  return variant;
}
