import { Queue } from 'bullmq';
import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { errorMessage } from '../core/errors.js';
import { describeRedis, workerConnection, type Redis } from '../core/redis.js';
import { QUEUE_NAMES } from '../core/queues.js';
import { runCommand } from './common.js';

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
export async function summarizeQueue(connection: Redis, prefix: string, name: string, failedShown = FAILED_SHOWN): Promise<QueueSummary> {
  const queue = new Queue(name, { connection, prefix });
  let queueError: Error | undefined;
  queue.on('error', (error: Error) => {
    queueError = error;
  });
  try {
    const [raw, isPaused, failedJobs] = await Promise.all([
      queue.getJobCounts('waiting', 'prioritized', 'active', 'delayed', 'completed', 'failed'),
      queue.isPaused(),
      queue.getFailed(0, failedShown - 1),
    ]);
    if (queueError) throw queueError;
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
  } finally {
    await queue.close();
  }
}

export function formatQueueSummary(summary: QueueSummary): string {
  const counts = QUEUE_STATES.map((state) => `${state} ${summary.counts[state]}`).join('  ');
  const lines = [`${summary.name.padEnd(8)} ${counts}${summary.isPaused ? '  (queue paused)' : ''}`];
  for (const job of summary.failed) {
    const reason = job.failedReason.split('\n')[0] ?? '';
    lines.push(`  failed ${new Date(job.timestamp).toISOString()}  ${job.id ?? '-'}  ${job.name}  attempts ${job.attemptsMade}  ${reason}`);
  }
  return lines.join('\n');
}

/** host:port of a Redis URL, leaving out any password it carries. */
function redisHost(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return 'the configured URL';
  }
}

export function queuesCommand(): Command {
  return new Command('queues')
    .description(`Show the steadfast queues: jobs by state and the ${FAILED_SHOWN} newest failed jobs with their reasons.`)
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('--json', 'one JSON object: {"queues": [{name, isPaused, counts, failed}]}')
    .action(async (options: { config?: string; json?: boolean }) => {
      await runCommand(async () => {
        const config = loadConfig({ file: options.config });
        // Gives up after a few reconnects: BullMQ otherwise waits for a ready connection forever.
        const redis = workerConnection(config.redis, {
          maxRetriesPerRequest: 1,
          enableOfflineQueue: true,
          connectTimeout: 2000,
          retryStrategy: (attempt) => (attempt > 3 ? null : attempt * 200),
        });
        redis.on('error', () => undefined); // the failed command reports it
        try {
          await redis.ping().catch((error: unknown) => {
            throw new Error(`Redis at ${config.redis.sentinels ? describeRedis(config.redis) : redisHost(config.redis.url)} is not reachable: ${errorMessage(error)}`);
          });
          const queues: QueueSummary[] = [];
          for (const name of Object.values(QUEUE_NAMES)) queues.push(await summarizeQueue(redis, config.redis.prefix, name));
          process.stdout.write(options.json ? `${JSON.stringify({ queues })}\n` : `${queues.map(formatQueueSummary).join('\n')}\n`);
        } finally {
          redis.disconnect();
        }
      });
    });
}
