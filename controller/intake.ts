import { Queue } from 'bullmq';
import { StoreUnavailableError, errorMessage } from '../core/errors.js';
import { QUEUE_NAMES, type Redis } from '../core/redis.js';
import type { Signal } from '../core/signal.js';

/** How long finished signal jobs are kept: repeats of a signal within it are dropped at intake. */
const SIGNAL_RETENTION_SECONDS = 24 * 3600;
const ENQUEUE_TIMEOUT_MS = 3000;

export interface SignalJob {
  readonly signal: Signal;
}

/**
 * The durable front door: a request is answered 2xx only after its signals are in Redis
 * (DESIGN.md §3), so Alertmanager's and the agent's own retries cover every failure.
 */
export const SIGNAL_JOB_OPTIONS = {
  attempts: 20,
  backoff: { type: 'exponential', delay: 500 },
  removeOnComplete: { age: SIGNAL_RETENTION_SECONDS },
  removeOnFail: { age: 7 * SIGNAL_RETENTION_SECONDS },
} as const;

export class SignalIntake {
  private queue: Queue<SignalJob> | undefined;

  /** `connection` fails fast while Redis is unreachable (see intakeConnection). */
  constructor(
    private readonly connection: Redis,
    private readonly prefix: string,
  ) {}

  // BullMQ checks the server version when a queue is made; with a fail-fast connection that
  // check must wait until Redis is reachable, or the queue would be unusable for good.
  private ready(): Queue<SignalJob> {
    if (this.connection.status !== 'ready') {
      throw new StoreUnavailableError(`Redis connection is ${this.connection.status}`);
    }
    if (!this.queue) {
      this.queue = new Queue<SignalJob>(QUEUE_NAMES.signals, {
        connection: this.connection,
        prefix: this.prefix,
        defaultJobOptions: SIGNAL_JOB_OPTIONS,
      });
      // Redis outages surface on the connection's own listener (service.ts) and as 503s from
      // enqueue; without a listener here Node would also print each one to the console.
      this.queue.on('error', () => undefined);
    }
    return this.queue;
  }

  /**
   * Enqueues all signals in one Redis transaction: either every one is stored or none is.
   * A signal whose id is already queued or recently done is a repeat and is not added again.
   */
  async enqueue(signals: readonly Signal[]): Promise<void> {
    const add = this.ready().addBulk(
      signals.map((signal) => ({ name: signal.kind, data: { signal }, opts: { jobId: signal.id } })),
    );
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`Redis did not answer within ${ENQUEUE_TIMEOUT_MS} ms`)), ENQUEUE_TIMEOUT_MS);
    });
    try {
      await Promise.race([add, timeout]);
    } catch (error) {
      throw new StoreUnavailableError(`could not store signals: ${errorMessage(error)}`, error);
    } finally {
      clearTimeout(timer);
    }
  }

  async close(): Promise<void> {
    await this.queue?.close();
  }
}
