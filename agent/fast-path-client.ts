import { Counter, type Registry } from 'prom-client';
import { JitteredBackoff } from '../core/backoff.js';
import { errorMessage } from '../core/errors.js';
import { fastPathEventSchema, type FastPathEvent } from '../core/fast-path-event.js';
import type { Logger } from '../core/log.js';
import { describeIssues } from '../core/validate.js';

/**
 * Sends fast-path events (core/fast-path-event.ts) from the agent to the controller's
 * `POST /api/v1/signals`. Sending never blocks a collector and never throws into the void:
 * events wait in a bounded queue, a passing failure (network, 5xx, 429) is retried with a
 * growing, jittered pause (core/backoff.ts) so that many agents do not retry in step, a refusal (other 4xx) is dropped with a log line.
 * A full queue drops training progress reports first, then the oldest event.
 */

/** A bearer token, or where to read it at each request: a Kubernetes service-account token rotates under the agent. */
export type TokenSource = string | (() => string);

export function currentToken(source: TokenSource): string {
  return typeof source === 'function' ? source() : source;
}

export interface FastPathClientOptions {
  /** Base URL of the controller; without one the client drops every event (no fast path). */
  readonly controllerUrl?: string | undefined;
  readonly token?: TokenSource | undefined;
  readonly registry: Registry;
  readonly logger: Logger;
  /** Events kept while the controller is unreachable; the oldest go first when full. */
  readonly queueLimit?: number;
  /** The shortest retry pause; pauses grow from it, jittered, up to maxBackoffMs. */
  readonly initialBackoffMs?: number;
  readonly maxBackoffMs?: number;
  /** A number in [0, 1) for the jitter; tests pass a seeded one. */
  readonly random?: () => number;
  readonly requestTimeoutMs?: number;
}

/**
 * What became of one event: `delivered` (the controller answered 2xx), `refused` (invalid, or a
 * 4xx other than 429), `dropped` (pushed out of a full queue) or `not_sent` (no controller
 * configured, or the agent closed first).
 */
export type FastPathOutcome = 'delivered' | 'refused' | 'dropped' | 'not_sent';

/** Told once what became of an event; must not throw. */
export type FastPathOutcomeHandler = (outcome: FastPathOutcome) => void;

export interface FastPathSender {
  /** Queues the event; `onOutcome`, when given, is called once when its fate is known. */
  send(event: FastPathEvent, onOutcome?: FastPathOutcomeHandler): void;
  /** Resolves once the queue is empty (sent or dropped) or the client is closed. */
  drained(): Promise<void>;
  close(): Promise<void>;
}

/** The controller accepts at most 100 events per request (core/fast-path-event.ts, fastPathBodySchema). */
const MAX_BATCH = 100;
const MESSAGE_LIMIT = 2048;

type FailureReason = 'network' | 'server_error' | 'throttled' | 'rejected' | 'queue_full' | 'invalid';

class RetryableSendError extends Error {
  constructor(
    message: string,
    readonly reason: FailureReason,
  ) {
    super(message);
    this.name = 'RetryableSendError';
  }
}

class RejectedSendError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'RejectedSendError';
  }
}

interface QueuedEvent {
  readonly event: FastPathEvent;
  readonly onOutcome: FastPathOutcomeHandler | undefined;
}

class FastPathClient implements FastPathSender {
  private readonly queue: QueuedEvent[] = [];
  private readonly sent: Counter;
  private readonly failed: Counter<'reason'>;
  private readonly closing = new AbortController();
  private readonly endpoint: string | undefined;
  private pump: Promise<void> | undefined;
  private closed = false;

  constructor(private readonly options: FastPathClientOptions) {
    this.endpoint = options.controllerUrl ? new URL('/api/v1/signals', options.controllerUrl).toString() : undefined;
    this.sent = new Counter({
      name: 'steadfast_agent_fast_path_sent_total',
      help: 'Fast-path events the controller accepted.',
      registers: [options.registry],
    });
    this.failed = new Counter({
      name: 'steadfast_agent_fast_path_failed_total',
      help: 'Fast-path send attempts that failed (retried: network, server_error, throttled) or events dropped (rejected, queue_full, invalid).',
      labelNames: ['reason'],
      registers: [options.registry],
    });
  }

  send(event: FastPathEvent, onOutcome?: FastPathOutcomeHandler): void {
    if (this.closed) {
      tell(onOutcome, 'not_sent', this.options.logger);
      return;
    }
    if (!this.endpoint) {
      this.options.logger.debug({ event }, 'no controller configured; fast-path event not sent');
      tell(onOutcome, 'not_sent', this.options.logger);
      return;
    }
    const checked = fastPathEventSchema.safeParse({ ...event, message: event.message.slice(0, MESSAGE_LIMIT) });
    if (!checked.success) {
      this.failed.inc({ reason: 'invalid' });
      this.options.logger.error({ event, err: describeIssues(checked.error.issues) }, 'invalid fast-path event dropped');
      tell(onOutcome, 'refused', this.options.logger);
      return;
    }
    this.queue.push({ event: checked.data, onOutcome });
    const limit = this.options.queueLimit ?? 1000;
    while (this.queue.length > limit) {
      // Progress reports go before faults: the next one says the same, a lost fault is lost.
      const progress = this.queue.findIndex((queued) => queued.event.kind === 'training_progress');
      const [dropped] = this.queue.splice(progress === -1 ? 0 : progress, 1);
      this.failed.inc({ reason: 'queue_full' });
      this.options.logger.error({ event: dropped?.event }, 'fast-path queue full; oldest event dropped');
      tell(dropped?.onOutcome, 'dropped', this.options.logger);
    }
    this.pump ??= this.run().finally(() => {
      this.pump = undefined;
    });
  }

  async drained(): Promise<void> {
    while (this.pump) await this.pump;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.closing.abort();
    await this.pump;
    if (this.queue.length > 0) {
      this.options.logger.warn({ events: this.queue.length }, 'agent closing; unsent fast-path events dropped');
      for (const entry of this.queue.splice(0)) tell(entry.onOutcome, 'not_sent', this.options.logger);
    }
  }

  /** Sends batches until the queue is empty; the only loop, so events go out in order. */
  private async run(): Promise<void> {
    const backoff = new JitteredBackoff(this.options.initialBackoffMs ?? 500, this.options.maxBackoffMs ?? 30_000, this.options.random);
    while (this.queue.length > 0 && !this.closed) {
      const batch = this.queue.slice(0, MAX_BATCH);
      try {
        await this.post(batch.map((entry) => entry.event));
        this.sent.inc(batch.length);
        for (const entry of this.take(batch)) tell(entry.onOutcome, 'delivered', this.options.logger);
        backoff.reset();
      } catch (error) {
        if (error instanceof RejectedSendError) {
          this.failed.inc({ reason: 'rejected' }, batch.length);
          this.options.logger.error({ events: batch.length, err: error }, 'controller refused fast-path events; dropped');
          for (const entry of this.take(batch)) tell(entry.onOutcome, 'refused', this.options.logger);
          continue;
        }
        const reason = error instanceof RetryableSendError ? error.reason : 'network';
        if (this.closed) return;
        this.failed.inc({ reason });
        const retryInMs = backoff.next();
        this.options.logger.warn({ events: batch.length, err: error, retryInMs }, 'fast-path send failed; will retry');
        await this.sleep(retryInMs);
      }
    }
  }

  /**
   * Takes a sent batch's entries out of the queue and returns those still there: a full queue may
   * have dropped some of them while they were on their way (and told their senders so).
   */
  private take(batch: readonly QueuedEvent[]): QueuedEvent[] {
    const taken: QueuedEvent[] = [];
    for (const entry of batch) {
      const index = this.queue.indexOf(entry);
      if (index === -1) continue;
      this.queue.splice(index, 1);
      taken.push(entry);
    }
    return taken;
  }

  private async post(batch: readonly FastPathEvent[]): Promise<void> {
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (this.options.token) headers.authorization = `Bearer ${currentToken(this.options.token)}`;
    let response: Response;
    try {
      response = await fetch(this.endpoint ?? '', {
        method: 'POST',
        headers,
        body: JSON.stringify(batch.length === 1 ? batch[0] : batch),
        signal: AbortSignal.any([this.closing.signal, AbortSignal.timeout(this.options.requestTimeoutMs ?? 10_000)]),
      });
    } catch (error) {
      throw new RetryableSendError(`cannot reach controller: ${errorMessage(error)}`, 'network');
    }
    // Read the body so the connection can be reused; its text only serves the log line.
    let detail: string;
    try {
      detail = (await response.text()).slice(0, 300);
    } catch (error) {
      detail = `(body unreadable: ${errorMessage(error)})`;
    }
    if (response.ok) return;
    if (response.status === 429) throw new RetryableSendError(`controller answered 429 ${detail}`, 'throttled');
    if (response.status >= 500) throw new RetryableSendError(`controller answered ${response.status} ${detail}`, 'server_error');
    throw new RejectedSendError(`controller answered ${response.status} ${detail}`);
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const signal = this.closing.signal;
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      signal.addEventListener('abort', done, { once: true });
    });
  }
}

/** Calls an outcome handler; one that throws is logged, never allowed to stop the send loop. */
function tell(onOutcome: FastPathOutcomeHandler | undefined, outcome: FastPathOutcome, logger: Logger): void {
  if (onOutcome === undefined) return;
  try {
    onOutcome(outcome);
  } catch (error) {
    logger.error({ err: error, outcome }, 'fast-path outcome handler failed');
  }
}

export function createFastPathClient(options: FastPathClientOptions): FastPathSender {
  return new FastPathClient(options);
}
