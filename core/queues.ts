import type { JobsOptions } from 'bullmq';
import { z } from 'zod';
import { identitySchema, type Identity } from './credentials.js';
import type { LadderEvent } from './ladder.js';
import { nodeNameSchema } from './names.js';
import { stepSchema } from './steps.js';
import { SIGNAL_BATCH_MAX, withRetention, type Retention } from './retention.js';

export { SIGNAL_BATCH_MAX };
import { stableHash, type Signal } from './signal.js';

/**
 * The queues on Redis (BullMQ), what each one carries and how its jobs are retried — the contract
 * between whoever adds a job and the worker that takes it, kept here so that neither side imports
 * the other:
 *
 *   signals   intake (HTTP)                 → policy worker     SignalJob (the signals of requests stored together)
 *   steps     the node ladder, a job ladder → step actuators    StepsJob (one transition: its steps, in order)
 *   analysis  the step actuators            → analysis worker   AnalysisJob
 *
 * Results travel back to a job's ladder as LadderEventJobs (RecoveryDispatcher.apply).
 */

export const QUEUE_NAMES = { signals: 'signals', steps: 'steps', analysis: 'analysis' } as const;
export type QueueName = keyof typeof QUEUE_NAMES;

/**
 * The retry policy, one entry per queue:
 * - signals are retried long (an intake answers 2xx only once they are stored, so a signal must
 *   survive a worker or Redis blip);
 * - transitions of steps get five tries: a lease held by another actuator or a backend briefly
 *   unreachable clears within seconds;
 * - analyses get three, further apart: an agent restarting, and a long diagnosis is one try's work.
 */
export const QUEUE_RETRIES = {
  signals: { attempts: 20, backoff: { type: 'exponential', delay: 500 } },
  steps: { attempts: 5, backoff: { type: 'exponential', delay: 1000 } },
  analysis: { attempts: 3, backoff: { type: 'exponential', delay: 5000 } },
} as const satisfies Record<QueueName, JobsOptions>;

/**
 * Each queue's job options: its retries, and how long and how many of its finished jobs Redis
 * keeps (core/retention.ts). A done signal is kept so that a repeat of its id (a retried
 * webhook, a re-sent event) is dropped at intake; finished work so that a redelivered job id is
 * recognised, failed work longer for review.
 */
export function queueJobOptions(retention: Retention): Record<QueueName, JobsOptions> {
  return {
    signals: withRetention(QUEUE_RETRIES.signals, retention.signals),
    steps: withRetention(QUEUE_RETRIES.steps, retention.work),
    analysis: withRetention(QUEUE_RETRIES.analysis, retention.work),
  };
}

/**
 * How soon a job held by a dead worker goes to another (config `queues:`). A worker holds a lock
 * on each job it runs, renewed every half lock; once the lock has lapsed, a stalled-job check
 * (run every `stalledIntervalSeconds` by any live worker of the queue, at most once per interval
 * across them) that already saw the job active puts it back on the queue. So a killed
 * controller's recovery resumes on another worker within about lockDurationSeconds + 2 ×
 * stalledIntervalSeconds of its death, given a live worker. BullMQ's defaults are 30 s and 30 s.
 * A short lock resumes sooner but must outlast any stall of the worker's event loop (the
 * renewal is a timer): a job that loses its lock twice is failed.
 */
export const queueTimingSchema = z
  .object({
    lockDurationSeconds: z.coerce.number<unknown>().int().min(2).max(600).default(30),
    stalledIntervalSeconds: z.coerce.number<unknown>().int().min(1).max(600).default(30),
  })
  .strict();
export type QueueTiming = z.output<typeof queueTimingSchema>;

/** The BullMQ Worker options for `timing`, in milliseconds. */
export function workerTiming(timing: QueueTiming): { lockDuration: number; stalledInterval: number } {
  return { lockDuration: timing.lockDurationSeconds * 1000, stalledInterval: timing.stalledIntervalSeconds * 1000 };
}

/**
 * Signals stored together: every request the intake took in one turn of its event loop, in one
 * job (one atomic write). A request's signals are never split across jobs. At most
 * SIGNAL_BATCH_MAX signals are combined; a single request with more is a job of its own.
 */
export interface SignalJob {
  readonly signals: readonly Signal[];
}

/** The job id of a batch: the same signals give the same id, so storing a batch again adds nothing. */
export function signalBatchId(signals: readonly Pick<Signal, 'id'>[]): string {
  return `sb-${stableHash(signals.map((signal) => signal.id).join('\n'))}`;
}

/** The version of the steps contract: a queued transition of another version is malformed. */
export const STEPS_JOB_VERSION = 2;

/**
 * One transition of a ladder: its steps run in order (stop, evict, then restart), each at most
 * once. A job's ladder names the job; the node ladder names the node (one step, its `fault` the
 * signal it follows, for signal-to-action latency).
 */
export const stepsJobSchema = z
  .object({
    v: z.literal(STEPS_JOB_VERSION),
    transitionId: z.string().min(1).max(128),
    job: z.string().min(1).max(128).optional(),
    node: nodeNameSchema.optional(),
    steps: z.array(stepSchema).max(64),
    /** Who caused the transition (LadderEventJob.origin, the signal's sender). */
    origin: identitySchema.optional(),
    fault: z.object({ signalId: z.string().min(1).max(128), fingerprint: z.string().min(1).max(256), time: z.iso.datetime({ offset: true }) }).optional(),
  })
  .refine((job) => (job.job === undefined) !== (job.node === undefined), { message: 'a transition names either a job or a node' });
export type StepsJob = z.infer<typeof stepsJobSchema>;

/** A queued transition, validated: throws a ZodError naming what is wrong. */
export function parseStepsJob(raw: unknown): StepsJob {
  return stepsJobSchema.parse(raw);
}

/** An event for a job's ladder, from the policy worker, an actuator, an analyzer or the clock. */
export interface LadderEventJob {
  readonly job: string;
  readonly event: LadderEvent;
  /** Unique per event, for idempotent transitions (a signal id, or a step's id for feedback). */
  readonly eventId: string;
  /** Who caused the event (the signal's sender, the operator's request); the controller itself when absent. */
  readonly origin?: Identity | undefined;
}

export const ANALYSIS_KINDS = ['diagnostics', 'replay', 'stacks'] as const;
export type AnalysisKind = (typeof ANALYSIS_KINDS)[number];

export const analysisJobSchema = z.object({
  kind: z.enum(ANALYSIS_KINDS),
  job: z.string().min(1).max(128),
  /** The recovery step that asked, `${transitionId}:${index}`: the analysis' identity. */
  ref: z.string().min(1).max(256),
  reason: z.string().max(4096),
});

export type AnalysisJob = z.infer<typeof analysisJobSchema>;

/** The ladder event for diagnostics or a replay that found no machine; `unrun` says why none ran, when none did. */
export function nothingFound(kind: 'diagnostics' | 'replay', time: number, unrun?: string): LadderEvent {
  const why = unrun === undefined ? {} : { unrun };
  return kind === 'diagnostics' ? { type: 'diagnostics_result', time, suspects: [], ...why } : { type: 'replay_result', time, culprits: [], ...why };
}
