import { z } from 'zod';
import { PCI_BUS_ID_PATTERN } from './names.js';

/**
 * The one vocabulary of what steadfast does about a fault. Both ladders speak it — a registered
 * job's recovery ladder (controller/policy/ladder/) and the node ladder of a node outside any job
 * (controller/policy/node-ladder.ts) — and both put their steps on the one `steps` queue
 * (core/queues.ts), where one actuator per verb (actuators/steps/, registered in its index)
 * carries each out. A new verb is a line here, a file there and the rung that emits it.
 */

export const STEP_VERBS = [
  /** Halt every process of the job (ByteRobust §4.1: "stops all processes immediately"). */
  'stop',
  /** Drain a job's nodes and activate warm standbys in their place (§6.2). */
  'evict',
  /**
   * Hot swap (DeadPool §V-C, §VI): open a recovery epoch in which `spares` take the shards of the
   * failed `nodes` while the job keeps running, drain the failed nodes and put the spares in their
   * places; without nodes, an epoch with the same shards (a transient communication fault).
   */
  'hot_swap',
  /** Take a node outside any job out of service (the node ladder's first rung). */
  'drain',
  /**
   * Reset one GPU of one node through its agent. In a job (stopped first) the job then restarts
   * on the same nodes, and a refused or failed reset evicts the node; outside a job the node is
   * taken out for the reset and returned after it, and a refused or failed reset drains it.
   */
  'reset_gpu',
  /** Reboot a node outside any job through the backend (once idle; the node ladder's third rung). */
  'reboot',
  /** Drain a node, hold it and tell people: the node ladder's top rung. */
  'hand_off',
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
export const ACTING_VERBS: ReadonlySet<StepVerb> = new Set([
  'evict',
  'hot_swap',
  'drain',
  'reset_gpu',
  'reboot',
  'hand_off',
  'stop',
  'restart',
  'reattempt',
  'rollback',
  'apply_update',
  'quarantine',
  'run_diagnostics',
  'run_replay',
]);

/** The node ladder's rungs, lowest first: the verbs a node outside any job can be given. */
export const NODE_VERBS = ['drain', 'reset_gpu', 'reboot', 'hand_off'] as const satisfies readonly StepVerb[];
export type NodeVerb = (typeof NODE_VERBS)[number];

/** The node ladder's citation: a fault with an explicit machine signal takes the node out at once. */
export const NODE_LADDER_CITATION =
  'ByteRobust §4.1 (high-confidence machine faults are isolated at once, without diagnosis); docs/remedies.md (reset, reboot, hand-off)';

export interface Step {
  verb: StepVerb;
  /** The registered job the step is for; absent for a node outside any job. */
  job?: string | undefined;
  /** The nodes it acts on (a job's culprits, or the one node of a node step); a hint for analyses. */
  nodes?: string[];
  version?: string;
  /** The GPU (PCI bus id) a `reset_gpu` step resets. */
  gpu?: string;
  /** The hot-swap spares a `hot_swap` step puts in the places of its `nodes`, in the same order. */
  spares?: string[];
  reason: string;
  /** The paper section the step follows. */
  citation: string;
}

export const stepSchema = z.object({
  verb: z.enum(STEP_VERBS),
  job: z.string().min(1).max(128).optional(),
  nodes: z.array(z.string()).optional(),
  version: z.string().optional(),
  gpu: z.string().regex(PCI_BUS_ID_PATTERN).optional(),
  spares: z.array(z.string()).optional(),
  reason: z.string(),
  citation: z.string(),
}) satisfies z.ZodType<Step>;

/** How a step ended, as the audit and the action metrics count it; `running`: an acting step under way. */
export const STEP_STATES = ['running', 'done', 'failed', 'refused'] as const;
export type StepState = (typeof STEP_STATES)[number];

/** What the controller's metrics and Grafana annotations hear of each finished acting step. */
export interface StepRecord {
  /** The step's audit ref: `${transitionId}` for a node's one step, `${transitionId}:${index}` in a job's transition. */
  readonly ref: string;
  readonly verb: StepVerb;
  readonly job?: string | undefined;
  readonly node?: string | undefined;
  readonly state: StepState;
  /** Why the step is in this state: the backend's answer, the gate that refused it. */
  readonly detail: string;
  readonly backend: string;
  readonly time: string;
}

/**
 * The Grafana tag on every action annotation the controller posts (with the verb, the state and
 * the node as further tags); every steadfast dashboard's annotation query filters on it.
 */
export const ACTION_ANNOTATION_TAG = 'steadfast';
