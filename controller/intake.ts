import { Queue } from 'bullmq';
import { StoreUnavailableError, errorMessage } from '../core/errors.js';
import { type Redis } from '../core/redis.js';
import { QUEUE_JOB_OPTIONS, QUEUE_NAMES, type SignalJob } from '../core/queues.js';
import type { Signal } from '../core/signal.js';

const ENQUEUE_TIMEOUT_MS = 3000;
/**
 * How long a store still under way is awaited once Redis is late but connected: a big batch
 * behind others is slow, not lost, and answering 503 while it goes on to be stored would tell
 * the sender something untrue.
 */
const ENQUEUE_SLOW_LIMIT_MS = 30_000;

/**
 * The durable front door: a request is answered 2xx only after its signals are in Redis, so
 * Alertmanager's and the agent's own retries cover every failure.
 */
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
        defaultJobOptions: QUEUE_JOB_OPTIONS.signals,
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
    const queue = this.ready();
    // One signal (most webhooks, every single fast-path event) needs no transaction around it.
    const [only] = signals;
    const add =
      signals.length === 1 && only !== undefined
        ? queue.add(only.kind, { signal: only }, { jobId: only.id })
        : queue.addBulk(signals.map((signal) => ({ name: signal.kind, data: { signal }, opts: { jobId: signal.id } })));
    let timer: NodeJS.Timeout | undefined;
    const late = (ms: number): Promise<never> =>
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`Redis did not answer within ${ms} ms`)), ms);
      });
    const settled = add.then(() => true);
    // Its failure is read below or, when given up on, deliberately not: never an unhandled rejection.
    settled.catch(() => undefined);
    try {
      const onTime = await Promise.race([settled, late(ENQUEUE_TIMEOUT_MS).catch(() => false)]);
      clearTimeout(timer);
      if (!onTime) {
        if (this.connection.status !== 'ready') throw new Error(`Redis did not answer within ${ENQUEUE_TIMEOUT_MS} ms and the connection is ${this.connection.status}`);
        await Promise.race([settled, late(ENQUEUE_SLOW_LIMIT_MS)]);
      }
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
