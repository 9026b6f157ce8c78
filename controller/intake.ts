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

/** Which signals the intake remembers having stored, so that it stores none twice. */
export interface SeenSignalsSettings {
  /** The sorted set of stored signal ids, scored by when they were stored (Keys.intakeSeenSignals). */
  readonly key: string;
  /** How long an id is remembered: as long as a finished signal batch is kept (core/retention.ts). */
  readonly windowSeconds: number;
  /** The most ids remembered, the oldest forgotten first: as many as the kept batches hold at most. */
  readonly maxIds: number;
}

export interface IntakeOptions {
  /** Job options of the signals queue (retries, retention: core/retention.ts). */
  readonly jobOptions: JobsOptions;
  readonly seen: SeenSignalsSettings;
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
 * it or none of it. A signal's id is derived from what it reports (the same alert or event gives
 * the same id), and the intake remembers the ids it stored (SeenSignalsSettings): a signal sent
 * again, alone or among others (Alertmanager re-sends a firing group with each change, an HA pair
 * sends everything twice, a sender retries), is not stored again while its id is remembered.
 * The ids are remembered after the batch is stored, never before, so a failure loses nothing: a
 * failure answered before Redis could reply (the connection dropped after the write) may have
 * stored all of it unremembered; the sender's retry then stores it again in another batch, and
 * the policy worker acts on each signal once: it passes over a signal whose id it has already
 * audited (policy/policy-worker.ts).
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
    const queue = this.ready();
    const fresh = await this.unseen(unique);
    if (fresh.length > 0) {
      await queue.add('signals', { signals: fresh }, { ...this.options.jobOptions, jobId: signalBatchId(fresh) });
      await this.remember(fresh);
    }
    // Also when every signal was stored before: that earlier store may not have reached the replicas.
    await this.replicas?.confirm();
  }

  /** The signals whose ids were not stored within the window. */
  private async unseen(signals: readonly Signal[]): Promise<Signal[]> {
    const { key, windowSeconds } = this.options.seen;
    const scores = await this.connection.zmscore(key, ...signals.map((signal) => signal.id));
    const since = Date.now() - windowSeconds * 1000;
    return signals.filter((_, index) => {
      const storedAt = scores[index];
      return storedAt === null || storedAt === undefined || Number(storedAt) < since;
    });
  }

  /** Remembers the ids of stored signals; forgets those past the window, then the oldest past the cap. */
  private async remember(signals: readonly Signal[]): Promise<void> {
    const { key, windowSeconds, maxIds } = this.options.seen;
    const now = Date.now();
    const members = signals.flatMap((signal) => [now, signal.id]);
    const replies = await this.connection
      .multi()
      .zadd(key, ...members)
      .zremrangebyscore(key, '-inf', `(${now - windowSeconds * 1000}`)
      .zremrangebyrank(key, 0, -maxIds - 1)
      .pexpire(key, windowSeconds * 1000)
      .exec();
    const failed = replies?.find(([error]) => error !== null)?.[0];
    if (failed) throw failed;
  }

  async close(): Promise<void> {
    await this.queue?.close();
  }
}
