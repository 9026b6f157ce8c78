/**
 * Retry pauses with decorrelated jitter: each pause is drawn uniformly between the base and three
 * times the previous pause, capped. After a controller restart hundreds of agents fail at the
 * same moment; with a plain doubling pause they would all retry in the same instant again and
 * again, while jittered pauses spread their retries over the whole window.
 * ("Exponential Backoff And Jitter", AWS Architecture Blog, 2015: the decorrelated variant.)
 */
export class JitteredBackoff {
  private previousMs: number;

  constructor(
    private readonly baseMs: number,
    private readonly capMs: number,
    /** A number in [0, 1); tests pass a seeded one. */
    private readonly random: () => number = Math.random,
  ) {
    if (!(baseMs > 0) || !(capMs >= baseMs)) throw new RangeError(`backoff needs 0 < base (${baseMs}) <= cap (${capMs})`);
    this.previousMs = baseMs;
  }

  /** The pause before the next retry, in whole milliseconds, from baseMs to capMs. */
  next(): number {
    const upper = Math.min(this.capMs, this.previousMs * 3);
    this.previousMs = Math.min(this.capMs, this.baseMs + this.random() * (upper - this.baseMs));
    return Math.round(this.previousMs);
  }

  /** Back to the base after a success. */
  reset(): void {
    this.previousMs = this.baseMs;
  }
}

/** A pause of `intervalMs` on average, drawn from half to one and a half times it, so that periodic pollers started together drift apart. */
export function jitteredInterval(intervalMs: number, random: () => number = Math.random): number {
  return Math.round(intervalMs * (0.5 + random()));
}
