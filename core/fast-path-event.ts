import { z } from 'zod';
import { reportedTimeSchema } from './signal.js';
import { MAX_TRAINING_RANK, nodeNameSchema, PCI_BUS_ID_PATTERN, TRAINING_JOB_PATTERN, TRAINING_JOB_RULE } from './names.js';

/**
 * The agent's fast path (docs/architecture.md): a fatal event the agent saw itself, POSTed straight to
 * the controller's `/api/v1/signals` without waiting for a Prometheus scrape and rule
 * evaluation. The body is one event or an array of up to 100.
 *
 * `training_progress` is no fault: a rank of the job on this node recorded a new iteration
 * (sent when a run starts or resumes, then at most once a minute). The controller keeps the
 * newest per job and node to judge a relaunch without waiting on Prometheus (controller/progress.ts).
 *
 * `sxid` is an NVSwitch error. An agent sends one only for a code the controller listed in its
 * answer to GET /api/v1/xid-policy (core/xid-policy.ts): a controller that predates the kind
 * would refuse the whole batch, and one that lists the code is one that knows it.
 */
export const FAST_PATH_KINDS = ['xid', 'gpu_lost', 'nccl_timeout', 'worker_failed', 'training_progress', 'sxid'] as const;
export type FastPathKind = (typeof FAST_PATH_KINDS)[number];

/** Kinds about one GPU carry its PCI bus id; training kinds carry the job and rank instead. */
const GPU_KINDS: ReadonlySet<string> = new Set(['xid', 'gpu_lost']);

/** An NVSwitch's PCI address as the nvswitch driver logs it, lower case, with its function digit. */
export const NVSWITCH_ADDRESS_PATTERN = /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/;

export const fastPathEventSchema = z
  .object({
    kind: z.enum(FAST_PATH_KINDS),
    node: nodeNameSchema,
    /** PCI bus id, `dddd:bb:dd`; required for xid and gpu_lost. */
    gpu: z.string().regex(PCI_BUS_ID_PATTERN, 'must be a PCI bus id like 0000:3b:00').optional(),
    /** Training job and global rank, for nccl_timeout and worker_failed. */
    job: z.string().regex(TRAINING_JOB_PATTERN, `must be ${TRAINING_JOB_RULE}`).optional(),
    rank: z.number().int().min(0).max(MAX_TRAINING_RANK).optional(),
    /** The iteration a rank recorded; required when kind is training_progress. */
    iteration: z.number().int().min(0).max(Number.MAX_SAFE_INTEGER).optional(),
    /** Xid code; required when kind is xid. */
    xid: z.number().int().min(0).max(100_000).optional(),
    /** SXid code; required when kind is sxid. */
    sxid: z.number().int().min(0).max(100_000).optional(),
    /** The NVSwitch's PCI address, `dddd:bb:dd.f`; required when kind is sxid. */
    nvswitch: z.string().regex(NVSWITCH_ADDRESS_PATTERN, 'must be a PCI address like 0000:05:00.0').optional(),
    message: z.string().max(2048).default(''),
    /** When the agent saw it, ISO 8601. */
    time: reportedTimeSchema,
  })
  .strict()
  .refine((event) => event.kind !== 'xid' || event.xid !== undefined, { message: 'xid is required when kind is "xid"', path: ['xid'] })
  .refine((event) => event.kind !== 'sxid' || (event.sxid !== undefined && event.nvswitch !== undefined), {
    message: 'sxid and nvswitch are required when kind is "sxid"',
    path: ['sxid'],
  })
  .refine((event) => !GPU_KINDS.has(event.kind) || event.gpu !== undefined, { message: 'gpu is required for xid and gpu_lost events', path: ['gpu'] })
  .refine((event) => event.kind !== 'training_progress' || event.job !== undefined, { message: 'job is required for training_progress events', path: ['job'] })
  .refine((event) => event.kind !== 'training_progress' || event.iteration !== undefined, {
    message: 'iteration is required for training_progress events',
    path: ['iteration'],
  });

export type FastPathEvent = z.infer<typeof fastPathEventSchema>;

export const fastPathBodySchema = z.union([fastPathEventSchema, z.array(fastPathEventSchema).min(1).max(100)]);

/** A training_progress event, narrowed: the controller records these instead of storing them as signals. */
export type TrainingProgressEvent = FastPathEvent & { kind: 'training_progress'; job: string; iteration: number };

export function isTrainingProgress(event: FastPathEvent): event is TrainingProgressEvent {
  return event.kind === 'training_progress' && event.job !== undefined && event.iteration !== undefined;
}

/** The fault kinds of the fast path: every kind but training_progress becomes a Signal. */
export type FastPathFault = FastPathEvent & { kind: Exclude<FastPathKind, 'training_progress'> };

export function isFastPathFault(event: FastPathEvent): event is FastPathFault {
  return event.kind !== 'training_progress';
}

/**
 * How long before its arrival a fault may date. An agent sends a fault when it sees it and keeps
 * it queued while the controller cannot be reached (agent/fast-path-client.ts); what its
 * kernel log held when it started is counted, never sent (agent/xid-ledger.ts). A fault
 * older than this is no news the node acts on: an outage this long is covered by the alert.
 */
export const FAULT_MAX_AGE_MS = 24 * 3600 * 1000;
/**
 * How far ahead of its arrival a fault's time is taken as the agent's own. Past it the agent's
 * clock runs fast: the fault is real news all the same (a GPU that fell off the bus must not be
 * lost to a node whose NTP drifted), so it is dated at its arrival and its reported time kept in
 * its evidence (fast-path-signal.ts); a time in the future can then never place a fault after an
 * operator's resume that it came before.
 */
export const FAULT_MAX_AHEAD_MS = 10 * 60 * 1000;

/** Why a fault dated `event.time` is no news, arriving at `receivedAt` (ms); undefined when it is. */
export function staleFaultTime(event: FastPathFault, receivedAt: number): string | undefined {
  const at = Date.parse(event.time);
  if (at < receivedAt - FAULT_MAX_AGE_MS)
    return `${event.time} is more than ${FAULT_MAX_AGE_MS / 3600_000} h before the event arrived: an agent sends a fault when it sees it`;
  return undefined;
}
