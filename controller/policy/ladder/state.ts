import { z } from 'zod';
import { FAULT_CLASSES, type FaultClass } from '../../../core/ladder.js';
import { stepSchema, type Step } from '../../../core/steps.js';

/**
 * The recovery state of one job, as the controller keeps it in Redis between events: a plain JSON
 * object, validated by `ladderStateSchema` when read back.
 */

export const LADDER_PHASES = ['running', 'swapping', 'stopped', 'diagnosing', 'reattempting', 'rolling_back', 'replaying', 'waiting_for_human'] as const;
/**
 * - running: training progresses, no incident is open.
 * - swapping: a hot swap's epoch is open (spares take failed nodes' shards while the job keeps
 *   running); waiting for every shard to step in it, or for the fallback.
 * - stopped: the job was halted and relaunched (after an eviction or a code update); waiting to
 *   hear whether it trains.
 * - diagnosing: stop-time diagnostics run; waiting for their result.
 * - reattempting: relaunched in place on the same nodes; waiting for the outcome.
 * - rolling_back: relaunched on the last good code version; waiting for the outcome.
 * - replaying: dual-phase replay runs; waiting for its result.
 * - waiting_for_human: automation gave up; only a successful restart closes the incident.
 */
export type LadderPhase = (typeof LADDER_PHASES)[number];

export const LADDER_RUNGS = ['hot_swap', 'evict', 'diagnose', 'reattempt', 'rollback', 'replay', 'update', 'human'] as const;
export type LadderRung = (typeof LADDER_RUNGS)[number];

export const VERSION_VERDICTS = ['unproven', 'good', 'bad'] as const;
export type VersionVerdict = (typeof VERSION_VERDICTS)[number];

/** One code version of the job; every version ever requested stays listed (ByteRobust §6.1). */
export interface CodeVersion {
  version: string;
  requestedAt: number;
  urgent: boolean;
  /** When it was last put into the job (hot update or rollback); null if never. */
  appliedAt: number | null;
  /** good: training progressed on it; bad: a rollback moved away from it. */
  verdict: VersionVerdict;
  verdictAt: number | null;
}

export interface PendingUpdate {
  version: string;
  urgent: boolean;
  requestedAt: number;
  /** Applied on the first tick at or past this time while the job runs (now, for urgent ones). */
  deadline: number;
}

export interface RetryChain {
  /** Restarts this incident has used. */
  attempts: number;
  /** Wait before the next restart. */
  nextBackoffMs: number;
}

export interface Incident {
  openedAt: number;
  trigger: FaultClass | 'code_update';
  /** Signals folded into this incident, oldest first (at most 32). */
  signalIds: string[];
  rung: LadderRung;
  /** How often each rung ran in this incident. */
  tried: Record<LadderRung, number>;
  evictedNodes: string[];
  /** The version a rollback in this incident moved away from. */
  rolledBackFrom: string | null;
  retry: RetryChain;
  /** Failure signatures (evidence.ts) of the faults folded into this incident, oldest first, each once. */
  signatures: string[];
}

/**
 * The newest eviction and the evidence it acted on, kept after its incident closes: a crash soon
 * after is compared with it to tell "the eviction did not help" from a new failure (ByteRobust
 * §4.2 step ⑦).
 */
export interface EvictionRecord {
  at: number;
  /** Every node the incident evicted. */
  nodes: string[];
  /** The failure signatures of the incident that evicted. */
  signatures: string[];
}

/** A warm standby that took an evicted node's place (ByteRobust §6.2), as the evict step reported it. */
export interface Replacement {
  node: string;
  replaced: string;
  at: number;
}

/** Restart steps held back by the retry chain's backoff until a tick at or after `notBefore`. */
export interface ScheduledRestart {
  notBefore: number;
  steps: Step[];
}

/** Times of events per node, oldest first. An array, not a map: node names are not trusted keys. */
export interface NodeTimes {
  node: string;
  times: number[];
}

/** An open hot swap: which failed nodes the spares replace (none for a communication fault's epoch). */
export interface SwapRecord {
  openedAt: number;
  /** The failed nodes, in the order of `spares`. */
  nodes: string[];
  spares: string[];
}

export interface LadderState {
  schema: 1;
  job: string;
  phase: LadderPhase;
  incident: Incident | null;
  scheduled: ScheduledRestart | null;
  lastEvictionAt: number | null;
  /** Null until the first eviction, and in states stored before the evidence was kept. */
  lastEviction: EvictionRecord | null;
  /** Standbys that joined the job within `crashAfterEvictionWindowMs`, oldest first. */
  replacements: Replacement[];
  networkAlerts: NodeTimes[];
  codeVersions: CodeVersion[];
  runningVersion: string | null;
  pendingUpdate: PendingUpdate | null;
  /** Evictions per node within the exclusion window. */
  exclusions: NodeTimes[];
  /** Nodes excluded too often; never handed back automatically. */
  quarantined: string[];
  /** Signal ids already handled, newest last. */
  recentSignals: string[];
  /**
   * GPU resets in place within the last RESET_REJOIN_MS, keyed `node|failure signature`: the same
   * fault reported again (the Prometheus alert after the agent's fast path) joins its reset.
   */
  gpuResets: NodeTimes[];
  /** The hot swap under way (phase `swapping`); null otherwise, and in states stored before hot swaps. */
  swap: SwapRecord | null;
}

export interface LadderTransition {
  state: LadderState;
  steps: Step[];
}

export function initialLadderState(job: string, options: { readonly time: number; readonly version?: string }): LadderState {
  const versions: CodeVersion[] =
    options.version === undefined
      ? []
      : [{ version: options.version, requestedAt: options.time, urgent: false, appliedAt: options.time, verdict: 'unproven', verdictAt: null }];
  return {
    schema: 1,
    job,
    phase: 'running',
    incident: null,
    scheduled: null,
    lastEvictionAt: null,
    lastEviction: null,
    replacements: [],
    networkAlerts: [],
    codeVersions: versions,
    runningVersion: options.version ?? null,
    pendingUpdate: null,
    exclusions: [],
    quarantined: [],
    recentSignals: [],
    gpuResets: [],
    swap: null,
  };
}

// Validation of a stored state (the controller reads it back from Redis). Fields added after the
// first release are defaulted, so a state an older controller stored still parses.

const time = z.number().finite();
const nodeTimes = z.array(z.object({ node: z.string().min(1), times: z.array(time) }));
const rungCounts = z.object({
  hot_swap: z.number().int().min(0).default(0),
  evict: z.number().int().min(0),
  diagnose: z.number().int().min(0),
  reattempt: z.number().int().min(0),
  rollback: z.number().int().min(0),
  replay: z.number().int().min(0),
  update: z.number().int().min(0),
  human: z.number().int().min(0),
});

export const ladderStateSchema = z.object({
  schema: z.literal(1),
  job: z.string().min(1),
  phase: z.enum(LADDER_PHASES),
  incident: z
    .object({
      openedAt: time,
      trigger: z.enum([...FAULT_CLASSES, 'code_update']),
      signalIds: z.array(z.string()),
      rung: z.enum(LADDER_RUNGS),
      tried: rungCounts,
      evictedNodes: z.array(z.string()),
      rolledBackFrom: z.string().nullable(),
      retry: z.object({ attempts: z.number().int().min(0), nextBackoffMs: z.number().min(0) }),
      signatures: z.array(z.string()).default([]),
    })
    .nullable(),
  scheduled: z.object({ notBefore: time, steps: z.array(stepSchema) }).nullable(),
  lastEvictionAt: time.nullable(),
  lastEviction: z
    .object({ at: time, nodes: z.array(z.string()), signatures: z.array(z.string()) })
    .nullable()
    .default(null),
  replacements: z.array(z.object({ node: z.string().min(1), replaced: z.string().min(1), at: time })).default([]),
  networkAlerts: nodeTimes,
  codeVersions: z.array(
    z.object({
      version: z.string().min(1),
      requestedAt: time,
      urgent: z.boolean(),
      appliedAt: time.nullable(),
      verdict: z.enum(VERSION_VERDICTS),
      verdictAt: time.nullable(),
    }),
  ),
  runningVersion: z.string().nullable(),
  pendingUpdate: z.object({ version: z.string().min(1), urgent: z.boolean(), requestedAt: time, deadline: time }).nullable(),
  exclusions: nodeTimes,
  quarantined: z.array(z.string()),
  recentSignals: z.array(z.string()),
  gpuResets: nodeTimes.default([]),
  swap: z
    .object({ openedAt: time, nodes: z.array(z.string()), spares: z.array(z.string()) })
    .nullable()
    .default(null),
}) satisfies z.ZodType<LadderState>;
