import { StoreUnavailableError, errorMessage } from '../core/errors.js';
import type { Redis } from '../core/redis.js';

export interface ReplicaAckSettings {
  /** Replicas that must hold a write before it is acknowledged (Redis WAIT). */
  readonly minReplicas: number;
  readonly timeoutMs: number;
}

/** Fewer replicas than required confirmed the write in time: the sender should retry. */
export class ReplicasBehindError extends StoreUnavailableError {}

/**
 * Confirms that writes already answered by the primary reached enough replicas, with one
 * `WAIT` shared by every request waiting at the time (a group commit): WAIT covers all earlier
 * writes of its connection, and it blocks that connection, so one per request would queue the
 * intake behind each replica round trip in turn.
 *
 * Each WAIT follows a write of its own (`marker`): a retried request whose signals were already
 * stored writes nothing, and WAIT would otherwise return at once on a fresh connection while
 * the first copy had not yet reached any replica.
 */
export class ReplicaAcks {
  /** The WAIT that callers arriving now join; it starts once the one before it answered. */
  private next: Promise<void> | undefined;
  private previous: Promise<void> = Promise.resolve();

  constructor(
    private readonly connection: Redis,
    private readonly marker: string,
    private readonly settings: ReplicaAckSettings,
  ) {}

  /** Resolves once every write this connection made before the call is on enough replicas. */
  confirm(): Promise<void> {
    if (this.next) return this.next;
    const next = this.previous.then(() => {
      // From here on, callers join the following WAIT: this one may be sent before their writes.
      this.next = undefined;
      return this.waitOnce();
    });
    this.next = next;
    this.previous = next.catch(() => undefined);
    return next;
  }

  private async waitOnce(): Promise<void> {
    const { minReplicas, timeoutMs } = this.settings;
    let acked: number;
    try {
      const [, replicas] = await Promise.all([this.connection.incr(this.marker), this.connection.wait(minReplicas, timeoutMs)]);
      acked = replicas;
    } catch (error) {
      throw new StoreUnavailableError(`could not confirm the write on replicas: ${errorMessage(error)}`, error);
    }
    if (acked < minReplicas) {
      throw new ReplicasBehindError(`${acked} of the ${minReplicas} required replicas confirmed the write within ${timeoutMs} ms`);
    }
  }
}
