import { z } from 'zod';
import { PCI_BUS_ID_PATTERN } from './names.js';

/**
 * What crosses the recovery queue: the classes of fault the recovery ladder knows, the events it
 * is fed, and the steps it hands to the recovery actuator. The ladder itself (controller/ladder/)
 * and the actuator (actuators/recovery/) both speak these nouns; neither imports the other.
 */

/**
 * DeadPool's error classification (003, Table II and §VI-B) refined by ByteRobust's real-time
 * checks (000, §4.1); controller/fault-class.ts maps signals onto it.
 */
export const FAULT_CLASSES = ['machine', 'network', 'user_code', 'crash', 'numerical', 'performance', 'transient'] as const;
export type FaultClass = (typeof FAULT_CLASSES)[number];

export const STEP_VERBS = [
  /** Halt every process of the job (ByteRobust §4.1: "stops all processes immediately"). */
  'stop',
  /** Drain the nodes and activate warm standbys in their place (§6.2). */
  'evict',
  /**
   * Reset one GPU of one node through its agent, the job stopped, so that the job can restart on
   * the same nodes; when the reset is refused or fails, the node is evicted as by `evict`.
   */
  'reset_gpu',
  /** Relaunch the job on its current node set. */
  'restart',
  /** Relaunch in place on the same nodes, nothing changed (§4.2 Reattempt). */
  'reattempt',
  /** Hot-update the job's code back to `version` (§4.2 Rollback, §6.1). */
  'rollback',
  /** Hot-update the job's code to `version` (§6.1). */
  'apply_update',
  /** Stop-time diagnostics (EUD, NCCL tests, bit-wise alignment), `nodes` as a hint (§4.2, §4.3). */
  'run_diagnostics',
  /** Dual-phase replay (§4.2, Algorithm 1). */
  'run_replay',
  /** Stack aggregation over the running job, `nodes` as a hint (§5.1). */
  'analyze_stacks',
  /** Keep the nodes out of every pool until an operator returns them (504-GPU report). */
  'quarantine',
  /** Hand the incident to a person. */
  'page_human',
  /** Tell the code owners something that needs no one woken up (§4.2: examine a rolled-back version). */
  'notify',
  /** Record only: the event was seen and deliberately not acted on. */
  'tolerate',
] as const;
export type StepVerb = (typeof STEP_VERBS)[number];

/** The steps that act on the cluster or the job; the safety gates and a job's recovery policy can refuse them. */
export const ACTING_VERBS: ReadonlySet<StepVerb> = new Set(['evict', 'reset_gpu', 'stop', 'restart', 'reattempt', 'rollback', 'apply_update', 'quarantine', 'run_diagnostics', 'run_replay']);

export interface LadderStep {
  verb: StepVerb;
  job: string;
  nodes?: string[];
  version?: string;
  /** The GPU (PCI bus id) a `reset_gpu` step resets. */
  gpu?: string;
  reason: string;
  /** The paper section the step follows. */
  citation: string;
}

export const ladderStepSchema = z.object({
  verb: z.enum(STEP_VERBS),
  job: z.string(),
  nodes: z.array(z.string()).optional(),
  version: z.string().optional(),
  gpu: z.string().regex(PCI_BUS_ID_PATTERN).optional(),
  reason: z.string(),
  citation: z.string(),
}) satisfies z.ZodType<LadderStep>;

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
   * (controller/remedy-policy.ts). Without it a machine fault evicts the node.
   */
  resetGpu?: string;
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
   * The recovery actuator refused an acting step of transition `transitionId` (actions paused,
   * the job's recovery off, the eviction budget spent): what the ladder decided did not happen.
   */
  | { type: 'recovery_refused'; time: number; transitionId: string; detail: string }
  /** A warm standby took an evicted node's place in the job (ByteRobust §6.2); the recovery actuator reports it. */
  | { type: 'standby_activated'; time: number; replaced: string; by: string }
  /** Time passes: fires held-back restarts and due updates. The controller ticks every few seconds. */
  | { type: 'tick'; time: number };
