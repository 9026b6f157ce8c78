/**
 * A collector's background poll: once at start (awaited by `--once`, so its scrape has data; not
 * by the serving agent, which answers scrapes while the first poll runs), then
 * every interval, one poll at a time, on a timer that does not keep the process alive (the
 * agent's HTTP server does). A query that hangs on a sick GPU delays the next poll, never a
 * scrape. `close()` stops the timer, aborts the poll in flight through `signal` and waits for it.
 */
export class BackgroundPoll {
  private readonly abort = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;
  private stopped = false;
  /** now() was asked while a poll ran: the next one starts as soon as it ends. */
  private again = false;

  /** `active`: false stops the polling for good (no binary on this node, say). */
  constructor(
    private readonly intervalMs: number,
    private readonly poll: () => Promise<void>,
    private readonly active: () => boolean = () => true,
  ) {}

  /** Aborted when the poll is closed: hand it to the command or request a poll runs. */
  get signal(): AbortSignal {
    return this.abort.signal;
  }

  /** True once close() was called: a poll that ends after it writes nothing. */
  get closed(): boolean {
    return this.stopped;
  }

  /** Runs the first poll; resolves when it is done, or at once with `waitForFirstRead` false. */
  async start(waitForFirstRead = true): Promise<void> {
    if (this.running || this.stopped || !this.active()) return;
    this.running = this.poll();
    const first = this.running.then(() => this.schedule());
    if (waitForFirstRead) await first;
  }

  /**
   * Polls now instead of at the next tick (something says the source changed: a failed event
   * wait on a GPU that may have fallen off the bus); while a poll runs, as soon as it ends.
   */
  now(): void {
    if (this.stopped || this.running === undefined || !this.active()) return;
    if (this.timer === undefined) {
      this.again = true;
      return;
    }
    clearTimeout(this.timer);
    this.timer = undefined;
    this.running = this.poll().finally(() => this.schedule());
  }

  async close(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.abort.abort();
    await this.running;
  }

  private schedule(): void {
    this.timer = undefined;
    if (this.stopped || !this.active()) return;
    const delay = this.again ? 0 : this.intervalMs;
    this.again = false;
    this.timer = setTimeout(() => {
      this.timer = undefined;
      this.running = this.poll().finally(() => this.schedule());
    }, delay);
    this.timer.unref();
  }
}
