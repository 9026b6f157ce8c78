import { createHash, randomUUID } from 'node:crypto';
import { z } from 'zod';
import { identitySchema } from './credentials.js';
import { nodeNameSchema } from './names.js';

/**
 * A Signal is the normalised form of everything that reaches the controller: an Alertmanager
 * alert, an agent's fast-path event. Policy only ever sees Signals (docs/architecture.md, contracts).
 */

/** `preflight_failed`: a job's preflight all-reduce named the node's link as bad (POST /api/v1/jobs/:id/preflight). */
export const SIGNAL_KINDS = ['xid', 'gpu_lost', 'nccl_timeout', 'worker_failed', 'alert', 'suspect_node', 'sxid', 'preflight_failed'] as const;
export type SignalKind = (typeof SIGNAL_KINDS)[number];

export const SIGNAL_SEVERITIES = ['critical', 'warning', 'info'] as const;
export type SignalSeverity = (typeof SIGNAL_SEVERITIES)[number];

export const SIGNAL_SOURCES = ['agent', 'alertmanager', 'analyzer'] as const;
export type SignalSource = (typeof SIGNAL_SOURCES)[number];

/** Longest evidence text and key a signal stores; the intake cuts or refuses to fit them. */
export const EVIDENCE_TEXT_MAX = 4096;
export const EVIDENCE_KEY_MAX = 128;

/** The bytes a text takes in a stored signal (its JSON string, without the quotes): a control character takes six. */
export function storedBytes(text: string): number {
  return Buffer.byteLength(JSON.stringify(text)) - 2;
}

const evidenceValue = z.union([z.string().max(EVIDENCE_TEXT_MAX), z.number(), z.boolean()]);

/** Earliest fault time taken from a sender; anything older is a broken clock or a made-up value. */
const EARLIEST_TIME_MS = Date.parse('2000-01-01T00:00:00Z');
/** How far ahead of the controller's clock a sender's clock may run. */
const CLOCK_SKEW_MS = 24 * 3600 * 1000;

/** Whether an instant (ms) is one a real report of a fault can carry: from 2000 until a day from now. */
export function isPlausibleTime(ms: number, now = Date.now()): boolean {
  return Number.isFinite(ms) && ms >= EARLIEST_TIME_MS && ms <= now + CLOCK_SKEW_MS;
}

/**
 * A time a sender reports (an alert's startsAt, an agent's event time): ISO 8601 with an offset,
 * no earlier than 2000 and no later than a day from now, so a year-9999 time cannot sort a
 * fault after every other or stretch a window for ever.
 */
export const reportedTimeSchema = z.iso
  .datetime({ offset: true })
  .refine((text) => isPlausibleTime(Date.parse(text)), { message: 'must be a time between 2000-01-01 and one day from now' });

export const signalSchema = z.object({
  id: z.string().min(1).max(128),
  kind: z.enum(SIGNAL_KINDS),
  /** The node the signal is about; absent for cluster-wide alerts. */
  node: nodeNameSchema.optional(),
  gpu: z.string().max(64).optional(),
  job: z.string().max(128).optional(),
  severity: z.enum(SIGNAL_SEVERITIES),
  /** When the fault happened (the alert's startsAt, the log line's arrival), ISO 8601. */
  time: z.iso.datetime({ offset: true }),
  /** When steadfast received it, ISO 8601. */
  receivedAt: z.iso.datetime({ offset: true }),
  /** Identity of the fault, equal for every report of the same fault whatever its source. */
  fingerprint: z.string().min(1).max(256),
  source: z.enum(SIGNAL_SOURCES),
  evidence: z.record(z.string().max(EVIDENCE_KEY_MAX), evidenceValue),
  /** The credential that delivered it (an agent of its node, Alertmanager, an operator); absent for the controller's own analyzers. */
  origin: identitySchema.optional(),
});

export type Signal = z.infer<typeof signalSchema>;

/** The identity of one fault: a fast-path Xid and the alert for that Xid share it. */
export function faultFingerprint(parts: { kind: SignalKind; node?: string | undefined; gpu?: string | undefined; detail?: string | undefined }): string {
  return [parts.kind, parts.node ?? '-', parts.gpu ?? '-', parts.detail ?? '-'].join('/');
}

export function newSignalId(): string {
  return randomUUID();
}

/** Short stable hash used for job ids built from free text. */
export function stableHash(text: string): string {
  return createHash('sha256').update(text).digest('hex').slice(0, 24);
}
