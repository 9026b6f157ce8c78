/**
 * What the labelled replay (cluster-replay.ts) writes and what it knows: the features of each
 * frame, and the faults and benign transients it put in, each with its node and times.
 */

export const FAULT_KINDS = ['thermal', 'memory', 'pcie', 'slowdown', 'sudden', 'powerbrake', 'hang'] as const;
export type FaultKind = (typeof FAULT_KINDS)[number];
export const BENIGN_KINDS = ['nic_flap', 'host_contention'] as const;
export type BenignKind = (typeof BENIGN_KINDS)[number];

/** The features the generator writes; the same names as DEFAULT_FEATURES (a test checks). */
/** Every Xid line of the last 5 minutes: written for the Xid-counter baseline only, not a detector feature. */
export const ANY_XID_5M = 'xid_any_5m';

export const REPLAY_FEATURES = {
  temp: 'gpu_temperature_celsius',
  memTemp: 'gpu_memory_temperature_celsius',
  power: 'gpu_power_watts',
  clock: 'gpu_sm_clock_hertz',
  util: 'gpu_utilization',
  slowdown: 'gpu_hw_slowdown_share',
  ecc: 'gpu_ecc_correctable_10m',
  remaps: 'gpu_row_remaps_1h',
  remapPending: 'gpu_row_remap_pending',
  pcie: 'gpu_pcie_replays_per_second',
  pcieSlots: 'gpu_pcie_replay_slots_1h',
  xidFatal: 'xid_fatal_5m',
  xidHour: 'xid_errors_1h',
  link: 'rdma_link_errors_per_second',
  retries: 'rdma_transport_retries_per_second',
  tx: 'rdma_transmit_bytes_per_second',
  getattr: 'nfs_getattr_rtt_seconds',
  retrans: 'nfs_retransmissions_per_operation',
  iteration: 'training_iteration_seconds',
} as const;

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
  /** The GPU (0-7) a per-GPU precursor shows on. */
  readonly device: number;
}

export interface BenignLabel {
  readonly node: string;
  readonly kind: BenignKind;
  readonly start: number;
  readonly end: number;
}
