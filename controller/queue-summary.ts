import type { Queue } from 'bullmq';

/**
 * What `steadfast queues` shows of each queue, read by the controller (GET /api/v1/queues) or,
 * with `--redis`, by the CLI itself.
 */

/**
 * Job states counted per queue, in the order printed. BullMQ 6 has no paused list: a paused
 * queue keeps its jobs in `wait`, so here they count as `paused` rather than `waiting`, as
 * they did in older BullMQ, and each job is counted once.
 */
export const QUEUE_STATES = ['waiting', 'active', 'delayed', 'completed', 'failed', 'paused'] as const;
export type QueueState = (typeof QUEUE_STATES)[number];

/** Failed jobs listed per queue, newest first. */
export const FAILED_SHOWN = 5;

export interface FailedJobSummary {
  readonly id: string | null;
  readonly name: string;
  readonly failedReason: string;
  readonly attemptsMade: number;
  readonly timestamp: number;
}

export interface QueueSummary {
  readonly name: string;
  /** Whether the queue itself is paused (BullMQ's pause, not `steadfast pause`). */
  readonly isPaused: boolean;
  readonly counts: Record<QueueState, number>;
  readonly failed: FailedJobSummary[];
}

/** Counts by state and the newest failed jobs of one queue. */
export async function summarizeQueue(queue: Queue, failedShown = FAILED_SHOWN): Promise<QueueSummary> {
  const name = queue.name;
  const [raw, isPaused, failedJobs] = await Promise.all([
    queue.getJobCounts('waiting', 'prioritized', 'active', 'delayed', 'completed', 'failed'),
    queue.isPaused(),
    queue.getFailed(0, failedShown - 1),
  ]);
  // Prioritized jobs wait in a set of their own; to a reader they are waiting all the same.
  const held = (raw.waiting ?? 0) + (raw.prioritized ?? 0);
  const counts: Record<QueueState, number> = {
    waiting: isPaused ? 0 : held,
    active: raw.active ?? 0,
    delayed: raw.delayed ?? 0,
    completed: raw.completed ?? 0,
    failed: raw.failed ?? 0,
    paused: isPaused ? held : 0,
  };
  const failed = failedJobs.map((job) => ({
    id: job.id ?? null,
    name: job.name,
    failedReason: job.failedReason,
    attemptsMade: job.attemptsMade,
    timestamp: job.timestamp,
  }));
  return { name, isPaused, counts, failed };
}
