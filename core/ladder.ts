/**
 * What a job's recovery ladder is fed: the classes of fault it knows and the events that move
 * it. The steps it emits are the one vocabulary of core/steps.ts.
 */

/**
 * DeadPool's error classification (003, Table II and §VI-B) refined by ByteRobust's real-time
 * checks (000, §4.1); controller/policy/fault-class.ts maps signals onto it.
 */
export const FAULT_CLASSES = ['machine', 'network', 'user_code', 'crash', 'numerical', 'performance', 'transient'] as const;
export type FaultClass = (typeof FAULT_CLASSES)[number];

/**
 * What a verdict of each class cites: the paper and section whose handling it follows. The
 * controller's classification (controller/policy/fault-class.ts) and the alert rules' meanings
 * (rules/domains/) both read this one table.
 */
export const FAULT_CITATIONS: Readonly<Record<FaultClass, string>> = {
  machine:
    'ByteRobust §4.1 (GPU unavailable, disk fault: high-confidence, evict without diagnosis); DeadPool Table II (GPU memory / host faults: node replacement)',
  network: 'ByteRobust §4.1 (network alerts are tolerated, e.g. twice within 5 minutes, before eviction); DeadPool §VI-B',
  user_code: 'ByteRobust §4.1 step ② (user-space errors such as TypeError or IndexError trigger a code rollback)',
  crash: 'ByteRobust §4.1 step ③ (a crash without a clear culprit goes to stop-time checks)',
  numerical: 'ByteRobust §4.1 (5x loss / grad-norm increase or NaN) and §4.3 (NaN loss diagnosis)',
  performance: 'ByteRobust §4.1 (zero RDMA traffic, low utilisation) and §5 (aggregation analysis for hangs and MFU decline)',
  transient: 'DeadPool Table II / §VI-B (transient faults: local recovery first)',
};

export interface FaultEvent {
  type: 'fault';
  time: number;
  signalId: string;
  faultClass: FaultClass;
  /**
   * The nodes the fault names: the culprits for `machine` and `network` (several when an analyzer
   * over-evicts a parallel group, ByteRobust §5.1), a hint for every other class.
   */
  nodes?: string[];
  detail: string;
  /**
   * What kind of failure this is, without where it happened: the exception type, the Xid, the
   * NCCL error kind, the alert's name. With the fault class it is the failure's signature, which
   * tells "the same failure again" from a new one (ByteRobust §4.2 step ⑦: did the eviction
   * help?). Without it the ladder normalises `detail`.
   */
  signature?: string;
  /**
   * The GPU (PCI bus id) whose reset may cure this machine fault in place: the Xid catalogue's
   * remedy, with GPU resets on and the node's escalation history allowing one
   * (controller/policy/node-ladder.ts). Without it a machine fault evicts the node.
   */
  resetGpu?: string;
  /**
   * The job's hot swap (DeadPool §V-C, §VI), when it has one: its unused spares as the fault
   * arrived, in order. The controller adds it from the job's record, so that the ladder stays a
   * function of its events; without it the job has no hot swap.
   */
  hotSwap?: { spares: string[] };
}

/** A hot swap's epoch finished: every shard completed a step in it (the world store reports it). */
export interface HotSwapDoneEvent {
  type: 'hot_swap_done';
  time: number;
  epoch: number;
  /** The figures, for the audit: "epoch 3, node-3 in place of node-1, first step 41 in 1.2 s". */
  summary: string;
}

/**
 * A hot swap cannot finish: its bound passed, a rank reported `failed`, or the swap could not
 * start. `evict`: nodes the swap did not take out of the job, which the fallback evicts.
 */
export interface HotSwapFailedEvent {
  type: 'hot_swap_failed';
  time: number;
  detail: string;
  evict?: string[];
}

/** Every event carries its own time, in Unix epoch milliseconds: the ladder reads no clock. */
export type LadderEvent =
  | FaultEvent
  /** Training progressed after a restart (any restart, a person's included). */
  | { type: 'restart_succeeded'; time: number }
  | { type: 'restart_failed'; time: number; detail?: string }
  /** `unrun`: why no check ran (none configured, the analysis failed), when none did. */
  | { type: 'diagnostics_result'; time: number; suspects: string[]; unrun?: string }
  /** `unrun`: why no replay ran (no replay command, the analysis failed), when none did. */
  | { type: 'replay_result'; time: number; culprits: string[]; unrun?: string }
  | { type: 'code_update'; time: number; version: string; urgent: boolean }
  /**
   * The step processor refused an acting step of transition `transitionId` (actions paused,
   * the job's recovery off, the eviction budget spent): what the ladder decided did not happen.
   */
  | { type: 'recovery_refused'; time: number; transitionId: string; detail: string }
  /** A warm standby took an evicted node's place in the job (ByteRobust §6.2); the evict step reports it. */
  | { type: 'standby_activated'; time: number; replaced: string; by: string }
  /**
   * No warm standby was left for these evicted nodes: they left the job, which is not relaunched
   * without them; the evict step reports it and stops its transition before the restart.
   */
  | { type: 'standby_missing'; time: number; nodes: string[] }
  | HotSwapDoneEvent
  | HotSwapFailedEvent
  /** Time passes: fires held-back restarts and due updates. The controller ticks every few seconds. */
  | { type: 'tick'; time: number };
