import { Queue, Worker } from 'bullmq';
import type { Logger } from '../core/log.js';
import { LEGACY_QUEUE_NAMES, parseStepsJob, type StepsJob } from '../core/queues.js';
import type { Redis } from '../core/redis.js';

/**
 * Work an earlier release left on its queues (`actions`: a node's drain or remedy, `recovery`: a
 * job ladder's transition) moves onto the one steps queue, rewritten into this release's contract
 * under the same transition id (core/queues.ts parseStepsJob), so a controller upgraded in the
 * middle of an incident still carries out what its predecessor decided, once. A forwarder runs
 * only while its queue holds work (it also takes back jobs a dead controller held) and stops once
 * the queue is empty.
 */

export interface LegacyForwardDeps {
  readonly connection: () => Redis;
  readonly prefix: string;
  readonly timing: { readonly lockDuration: number; readonly stalledInterval: number };
  readonly steps: Queue<StepsJob>;
  readonly logger: Logger;
}

const PENDING_STATES = ['wait', 'active', 'delayed', 'prioritized', 'waiting-children'] as const;

export async function forwardLegacyQueues(deps: LegacyForwardDeps, started: (worker: Worker) => void): Promise<void> {
  for (const name of LEGACY_QUEUE_NAMES) {
    const connection = deps.connection();
    const queue = new Queue(name, { connection, prefix: deps.prefix });
    const closeQueue = async (): Promise<void> => {
      await queue.close();
      connection.disconnect();
    };
    const pending = async (): Promise<number> => Object.values(await queue.getJobCounts(...PENDING_STATES)).reduce((sum, count) => sum + count, 0);
    let left: number;
    try {
      left = await pending();
    } catch (error) {
      await closeQueue();
      throw error;
    }
    if (left === 0) {
      await closeQueue();
      continue;
    }
    deps.logger.info({ queue: name }, 'moving the work an earlier release left on this queue onto the steps queue');
    const worker = new Worker(
      name,
      async (job) => {
        const transition = parseStepsJob(job.data);
        await deps.steps.add(transition.job === undefined ? 'node' : 'job', transition, { jobId: transition.transitionId });
        return { forwarded: transition.transitionId };
      },
      { connection: deps.connection(), prefix: deps.prefix, ...deps.timing, concurrency: 4 },
    );
    worker.on('closed', () => void closeQueue().catch(() => undefined));
    worker.on('drained', () => {
      void pending()
        .then(async (left) => {
          if (left > 0 || worker.closing) return;
          deps.logger.info({ queue: name }, 'the earlier release\'s queue is empty; its forwarder stops');
          await worker.close();
        })
        .catch((error: unknown) => deps.logger.warn({ queue: name, err: error }, 'could not count the work left on an earlier release\'s queue'));
    });
    started(worker);
  }
}
