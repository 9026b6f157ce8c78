import { Queue } from 'bullmq';
import { Command } from 'commander';
import { loadConfig } from '../core/config.js';
import { errorMessage } from '../core/errors.js';
import { describeRedis, workerConnection, type Redis } from '../core/redis.js';
import { QUEUE_NAMES } from '../core/queues.js';
import { FAILED_SHOWN, QUEUE_STATES, summarizeQueue as summarize, type QueueSummary } from '../controller/queue-summary.js';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { printable, printableJson, runCommand } from './common.js';

export { FAILED_SHOWN, QUEUE_STATES, type FailedJobSummary, type QueueState, type QueueSummary } from '../controller/queue-summary.js';

/** Counts by state and the newest failed jobs of one queue, read straight from Redis (`--redis`). */
export async function summarizeQueue(connection: Redis, prefix: string, name: string, failedShown = FAILED_SHOWN): Promise<QueueSummary> {
  const queue = new Queue(name, { connection, prefix });
  let queueError: Error | undefined;
  queue.on('error', (error: Error) => {
    queueError = error;
  });
  try {
    const summary = await summarize(queue, failedShown);
    if (queueError) throw queueError;
    return summary;
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
  return lines.map(printable).join('\n');
}

/** host:port of a Redis URL, leaving out any password it carries. */
function redisHost(url: string): string {
  try {
    return new URL(url).host;
  } catch {
    return 'the configured URL';
  }
}

/**
 * `steadfast queues`: over the controller's API (GET /api/v1/queues) by default; with `--redis`,
 * straight from Redis with the config's credentials, for when the controller itself is down.
 */
export function queuesCommand(): Command {
  return withControllerOptions(
    new Command('queues').description(`Show the steadfast queues: jobs by state and the ${FAILED_SHOWN} newest failed jobs with their reasons.`),
  )
    .option('--redis', "read Redis directly with the config's credentials (for when the controller is down)")
    .option('-c, --config <file>', 'YAML config file, with --redis', process.env.STEADFAST_CONFIG)
    .option('--json', 'one JSON object: {"queues": [{name, isPaused, counts, failed}]}')
    .action(async (options: Record<string, unknown>) => {
      await runCommand(async () => {
        const queues = options.redis
          ? await readQueuesFromRedis(typeof options.config === 'string' ? options.config : undefined)
          : (await callController<{ queues: QueueSummary[] }>(controllerConnection(options), 'GET', '/api/v1/queues')).queues;
        process.stdout.write(options.json ? `${printableJson({ queues })}\n` : `${queues.map(formatQueueSummary).join('\n')}\n`);
      });
    });
}

async function readQueuesFromRedis(configFile: string | undefined): Promise<QueueSummary[]> {
  const config = loadConfig({ file: configFile });
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
      throw new Error(
        `Redis at ${config.redis.sentinels ? describeRedis(config.redis) : redisHost(config.redis.url)} is not reachable: ${errorMessage(error)}`,
      );
    });
    const queues: QueueSummary[] = [];
    for (const name of Object.values(QUEUE_NAMES)) queues.push(await summarizeQueue(redis, config.redis.prefix, name));
    return queues;
  } finally {
    redis.disconnect();
  }
}
