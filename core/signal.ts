import { createHash, randomUUID } from 'node:crypto';
import { z } from 'zod';
import { identitySchema } from './credentials.js';
import { nodeNameSchema } from './names.js';

/**
 * A Signal is the normalised form of everything that reaches the controller: an Alertmanager
 * alert, an agent's fast-path event. Policy only ever sees Signals (docs/architecture.md, contracts).
 */

export const SIGNAL_KINDS = ['xid', 'gpu_lost', 'nccl_timeout', 'worker_failed', 'alert', 'suspect_node'] as const;
export type SignalKind = (typeof SIGNAL_KINDS)[number];

export const SIGNAL_SEVERITIES = ['critical', 'warning', 'info'] as const;
export type SignalSeverity = (typeof SIGNAL_SEVERITIES)[number];

export const SIGNAL_SOURCES = ['agent', 'alertmanager', 'analyzer'] as const;
export type SignalSource = (typeof SIGNAL_SOURCES)[number];

/** Longest evidence text and key a signal stores; the intake cuts or refuses to fit them. */
export const EVIDENCE_TEXT_MAX = 4096;
export const EVIDENCE_KEY_MAX = 128;

const evidenceValue = z.union([z.string().max(EVIDENCE_TEXT_MAX), z.number(), z.boolean()]);

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
export function faultFingerprint(parts: {
  kind: SignalKind;
  node?: string | undefined;
  gpu?: string | undefined;
  detail?: string | undefined;
}): string {
  return [parts.kind, parts.node ?? '-', parts.gpu ?? '-', parts.detail ?? '-'].join('/');
}

export function newSignalId(): string {
  return randomUUID();
}

/** Short stable hash used for job ids built from free text. */
export function stableHash(text: string): string {
  return createHash('sha256').update(text).digest('hex').slice(0, 24);
}
