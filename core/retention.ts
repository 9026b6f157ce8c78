import type { JobsOptions } from 'bullmq';

/**
 * How much of Redis steadfast's history may take (docs/limits.md). Redis holds the queues
 * (BullMQ) and the audit trail; work still to do is never dropped, but finished jobs and old
 * audit entries are, by count, by age and (for signals, whose size their senders choose) by the
 * bytes Redis holds for them, whichever comes first. The counts come from a byte budget and the
 * bytes one item takes at most, measured by bench/redis-durability.ts on Redis 7 (the figures
 * there, rounded up).
 */

/** A signal of the usual size in a finished signal job (the signal with its evidence), with the job's own share. */
export const SIGNAL_BYTES = 3 * 1024;
/** Most signals the intake combines from several requests into one signal job. */
export const SIGNAL_BATCH_MAX = 100;
/** A finished action, recovery or analysis job (a decision, steps or a request). */
export const WORK_JOB_BYTES = 4 * 1024;
/** Most an audit entry's summary and data may take, in bytes; AuditLog cuts larger ones to fit. */
export const AUDIT_SUMMARY_MAX_BYTES = 512;
export const AUDIT_DATA_MAX_BYTES = 3 * 1024;
/**
 * An audit entry's members in the audit's index (core/audit-index.ts) at their largest: type,
 * node, ref and node with type, with a node of 192 bytes and a ref of 384, measured at 1,476
 * bytes on Redis 7.0 (about 720 with the usual names).
 */
export const AUDIT_INDEX_BYTES = 1536;
/** An audit entry at its largest, with its stream overhead, its write-once marker and its index members. */
export const AUDIT_ENTRY_BYTES = AUDIT_SUMMARY_MAX_BYTES + AUDIT_DATA_MAX_BYTES + 512 + AUDIT_INDEX_BYTES;

const DAY_SECONDS = 24 * 3600;

/** The budget's shares: the audit is what people read later, signals what dedupe needs. */
const SHARE = { audit: 0.45, signals: 0.4, work: 0.15 } as const;

export interface Retention {
  /** Finished-job retention per queue, for BullMQ's removeOnComplete / removeOnFail. */
  readonly signals: { readonly completed: KeepJobs; readonly failed: KeepJobs };
  /**
   * The most bytes Redis may hold for finished signal jobs, completed and failed apart
   * (controller/signal-retention.ts): a signal's size is its sender's choice (an agent's message
   * of control characters takes six bytes a character as JSON), so the count alone bounds nothing.
   */
  readonly signalBytes: { readonly completed: number; readonly failed: number };
  readonly work: { readonly completed: KeepJobs; readonly failed: KeepJobs };
  /** Entries the audit stream is trimmed to, exactly (core/audit-index.ts: an entry's index members go with it). */
  readonly auditEntries: number;
}

export interface KeepJobs {
  readonly age: number;
  readonly count: number;
}

/**
 * The retention for `budgetMB` MiB. `auditMaxEntries` (controller.auditMaxLength) caps the audit
 * further. Failed jobs get a tenth of their queue's share: they are kept longer, for review.
 */
export function retentionFromBudget(budgetMB: number, auditMaxEntries = Number.POSITIVE_INFINITY): Retention {
  const bytes = budgetMB * 1024 * 1024;
  const count = (share: number, itemBytes: number, least = 100): number => Math.max(least, Math.floor((bytes * share) / itemBytes));
  // Counted as full batches of signals of the usual size; batches of bigger signals are trimmed
  // sooner, by their bytes (signalBytes). What a finished signal job is kept for is review
  // (bull-board); repeats are told apart by the audit.
  const signals = count(SHARE.signals, SIGNAL_BYTES * SIGNAL_BATCH_MAX, 2);
  const work = count(SHARE.work, WORK_JOB_BYTES);
  const signalBytes = bytes * SHARE.signals;
  return {
    signals: {
      completed: { age: DAY_SECONDS, count: Math.ceil(signals * 0.9) },
      failed: { age: 7 * DAY_SECONDS, count: Math.max(1, Math.floor(signals * 0.1)) },
    },
    signalBytes: { completed: Math.floor(signalBytes * 0.9), failed: Math.floor(signalBytes * 0.1) },
    work: {
      completed: { age: 7 * DAY_SECONDS, count: Math.ceil(work * 0.9) },
      failed: { age: 30 * DAY_SECONDS, count: Math.max(100, Math.floor(work * 0.1)) },
    },
    auditEntries: Math.min(auditMaxEntries, count(SHARE.audit, AUDIT_ENTRY_BYTES)),
  };
}

/** BullMQ job options: `retry` with the retention of the queue's kind. */
export function withRetention(retry: JobsOptions, keep: Retention['signals']): JobsOptions {
  return { ...retry, removeOnComplete: { ...keep.completed }, removeOnFail: { ...keep.failed } };
}
