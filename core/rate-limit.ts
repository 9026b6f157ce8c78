/**
 * Per-client token buckets for the HTTP write endpoints (controller and agent). Each client
 * (remote address) may send `burst` requests at once and `requestsPerSecond` after that; a
 * client over its limit learns how long to wait (Retry-After). Memory is bounded: past
 * `maxClients` the least recently seen client is forgotten, which can only ever be generous.
 */

export interface RateLimitSettings {
  /** Sustained requests per second per client; 0 turns the limit off. */
  readonly requestsPerSecond: number;
  /** Requests a client may send at once after being quiet. */
  readonly burst: number;
}

export type RateDecision = { readonly allowed: true } | { readonly allowed: false; readonly retryAfterSeconds: number };

interface Bucket {
  tokens: number;
  /** Milliseconds (of `now`) when `tokens` was last brought up to date. */
  at: number;
}

const ALLOWED: RateDecision = { allowed: true };

export class ClientRateLimiter {
  private readonly buckets = new Map<string, Bucket>();
  private readonly maxClients: number;
  private readonly now: () => number;

  constructor(
    readonly settings: RateLimitSettings,
    options: { readonly maxClients?: number; readonly now?: () => number } = {},
  ) {
    if (!(settings.requestsPerSecond >= 0) || !Number.isFinite(settings.requestsPerSecond)) {
      throw new RangeError(`requestsPerSecond must be a finite number ≥ 0, got ${settings.requestsPerSecond}`);
    }
    if (!Number.isInteger(settings.burst) || settings.burst < 1) throw new RangeError(`burst must be a whole number ≥ 1, got ${settings.burst}`);
    this.maxClients = options.maxClients ?? 10_000;
    this.now = options.now ?? Date.now;
  }

  get enabled(): boolean {
    return this.settings.requestsPerSecond > 0;
  }

  /** Clients with a bucket in memory now. */
  get trackedClients(): number {
    return this.buckets.size;
  }

  /** Takes one request's token from `client`'s bucket, or says how long until one is there. */
  take(client: string): RateDecision {
    if (!this.enabled) return ALLOWED;
    const { requestsPerSecond, burst } = this.settings;
    const now = this.now();
    const bucket = this.buckets.get(client) ?? { tokens: burst, at: now };
    // A clock that steps back refills nothing rather than draining the bucket.
    const elapsedSeconds = Math.max(0, now - bucket.at) / 1000;
    bucket.tokens = Math.min(burst, bucket.tokens + elapsedSeconds * requestsPerSecond);
    bucket.at = now;
    // Re-inserting keeps the map in least-recently-seen order, so the oldest entry goes first.
    this.buckets.delete(client);
    this.buckets.set(client, bucket);
    while (this.buckets.size > this.maxClients) {
      const oldest = this.buckets.keys().next().value as string;
      this.buckets.delete(oldest);
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1;
      return ALLOWED;
    }
    return { allowed: false, retryAfterSeconds: Math.max(1, Math.ceil((1 - bucket.tokens) / requestsPerSecond)) };
  }
}

/** The sentence a refused client reads. */
export function rateLimitMessage(settings: RateLimitSettings, retryAfterSeconds: number): string {
  return `too many requests from this client: at most ${settings.requestsPerSecond} per second (bursts of ${settings.burst}); retry after ${retryAfterSeconds} s`;
}
