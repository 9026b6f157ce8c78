import { Queue, type JobsOptions } from 'bullmq';
import { StoreUnavailableError, errorMessage } from '../core/errors.js';
import { type Redis } from '../core/redis.js';
import { QUEUE_NAMES, signalBatchId, type SignalJob } from '../core/queues.js';
import type { Signal } from '../core/signal.js';
import { ReplicaAcks, type ReplicaAckSettings } from './replica-acks.js';

const ENQUEUE_TIMEOUT_MS = 3000;
/**
 * How long a store still under way is awaited once Redis is late but connected: a big batch
 * behind others is slow, not lost, and answering 503 while it goes on to be stored would tell
 * the sender something untrue.
 */
const ENQUEUE_SLOW_LIMIT_MS = 30_000;

export interface IntakeOptions {
  /** Job options of the signals queue (retries, retention: core/retention.ts). */
  readonly jobOptions: JobsOptions;
  /** With minReplicas > 0, a batch is acknowledged only once that many replicas hold it. */
  readonly replicaAck?: ReplicaAckSettings | undefined;
  /** The key the replica confirmation writes to (Keys.intakeReplicaMarker). */
  readonly replicaMarker: string;
}

/**
 * The durable front door: a request is answered 2xx only after its signals are in Redis, so
 * Alertmanager's and the agent's own retries cover every failure.
 *
 * A batch is stored as one job (SignalJob): one script run by Redis, so a failure leaves all of
 * it or none of it. A failure answered before Redis could reply (the connection dropped after
 * the write) may have stored all of it; the sender's retry then stores it again in another batch,
 * and the policy worker acts on each signal once: a signal's id is derived from what it reports
 * (the same alert or event gives the same id), and the worker passes over a signal whose id it
 * has already audited (policy/policy-worker.ts).
 */
export class SignalIntake {
  private queue: Queue<SignalJob> | undefined;
  private readonly replicas: ReplicaAcks | undefined;

  /** `connection` fails fast while Redis is unreachable (see intakeConnection). */
  constructor(
    private readonly connection: Redis,
    private readonly prefix: string,
    private readonly options: IntakeOptions,
  ) {
    const ack = options.replicaAck;
    this.replicas = ack && ack.minReplicas > 0 ? new ReplicaAcks(connection, options.replicaMarker, ack) : undefined;
  }

  // BullMQ checks the server version when a producer is made; with a fail-fast connection that
  // check must wait until Redis is reachable, or the producer would be unusable for good.
  private ready(): Queue<SignalJob> {
    if (this.connection.status !== 'ready') {
      throw new StoreUnavailableError(`Redis connection is ${this.connection.status}`);
    }
    if (!this.queue) {
      this.queue = new Queue<SignalJob>(QUEUE_NAMES.signals, { connection: this.connection, prefix: this.prefix });
      // Redis outages surface on the connection's own listener (service.ts) and as 503s from
      // enqueue; without a listener here Node would also print each one to the console.
      this.queue.on('error', () => undefined);
    }
    return this.queue;
  }

  /**
   * Stores all signals as one job (every one or none) and, when configured, waits for replicas
   * to confirm them. The same signals stored again while their job is kept are not added twice.
   * Throws StoreUnavailableError when the batch may not be stored.
   */
  async enqueue(signals: readonly Signal[]): Promise<void> {
    if (signals.length === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const timeoutMs = ENQUEUE_TIMEOUT_MS + (this.replicas ? (this.options.replicaAck?.timeoutMs ?? 0) * 2 : 0);
    const late = (ms: number): Promise<never> =>
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`Redis did not answer within ${ms} ms`)), ms);
      });
    const stored = this.store(signals).then(() => true);
    // Its failure is read below or, when given up on, deliberately not: never an unhandled rejection.
    stored.catch(() => undefined);
    try {
      const onTime = await Promise.race([stored, late(timeoutMs).catch(() => false)]);
      clearTimeout(timer);
      if (!onTime) {
        if (this.connection.status !== 'ready') throw new Error(`Redis did not answer within ${timeoutMs} ms and the connection is ${this.connection.status}`);
        await Promise.race([stored, late(ENQUEUE_SLOW_LIMIT_MS)]);
      }
    } catch (error) {
      if (error instanceof StoreUnavailableError) throw error;
      throw new StoreUnavailableError(`could not store signals: ${errorMessage(error)}`, error);
    } finally {
      clearTimeout(timer);
    }
  }

  private async store(signals: readonly Signal[]): Promise<void> {
    // Two requests of one batch may carry the same signal (an Alertmanager pair sends each alert twice).
    const unique = [...new Map(signals.map((signal) => [signal.id, signal])).values()];
    await this.ready().add('signals', { signals: unique }, { ...this.options.jobOptions, jobId: signalBatchId(unique) });
    await this.replicas?.confirm();
  }

  async close(): Promise<void> {
    await this.queue?.close();
  }
}
