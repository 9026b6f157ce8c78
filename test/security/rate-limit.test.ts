import { describe, expect, it } from 'vitest';
import { ClientRateLimiter, rateLimitMessage } from '../../core/rate-limit.js';

/** A clock the test moves by hand. */
function manualClock(start = 1_000_000): { now: () => number; advance: (ms: number) => void } {
  let time = start;
  return { now: () => time, advance: (ms) => (time += ms) };
}

describe('per-client token bucket', () => {
  it('lets a client send its burst at once, then refuses with the seconds until a token is back', () => {
    const clock = manualClock();
    const limiter = new ClientRateLimiter({ requestsPerSecond: 0.5, burst: 3 }, { now: clock.now });
    expect([1, 2, 3].map(() => limiter.take('10.0.0.1').allowed)).toEqual([true, true, true]);
    expect(limiter.take('10.0.0.1')).toEqual({ allowed: false, retryAfterSeconds: 2 });
    clock.advance(1000);
    // Half a token back: still refused, one second to go.
    expect(limiter.take('10.0.0.1')).toEqual({ allowed: false, retryAfterSeconds: 1 });
    clock.advance(1000);
    expect(limiter.take('10.0.0.1').allowed).toBe(true);
  });

  it('keeps one bucket per client, so one client spending its burst does not throttle another', () => {
    const clock = manualClock();
    const limiter = new ClientRateLimiter({ requestsPerSecond: 1, burst: 2 }, { now: clock.now });
    limiter.take('a');
    limiter.take('a');
    expect(limiter.take('a').allowed).toBe(false);
    expect(limiter.take('b').allowed).toBe(true);
  });

  it('refills at the sustained rate and never above the burst, however long the client was quiet', () => {
    const clock = manualClock();
    const limiter = new ClientRateLimiter({ requestsPerSecond: 10, burst: 5 }, { now: clock.now });
    clock.advance(3_600_000);
    const allowed = Array.from({ length: 8 }, () => limiter.take('a').allowed).filter(Boolean).length;
    expect(allowed).toBe(5);
    clock.advance(300);
    expect(Array.from({ length: 5 }, () => limiter.take('a').allowed).filter(Boolean).length).toBe(3);
  });

  it('does not drain a bucket when the clock steps back', () => {
    const clock = manualClock();
    const limiter = new ClientRateLimiter({ requestsPerSecond: 1, burst: 2 }, { now: clock.now });
    limiter.take('a');
    clock.advance(-60_000);
    expect(limiter.take('a').allowed).toBe(true);
  });

  it('holds at most maxClients buckets, forgetting the least recently seen client first', () => {
    const clock = manualClock();
    const limiter = new ClientRateLimiter({ requestsPerSecond: 1, burst: 1 }, { now: clock.now, maxClients: 3 });
    for (const client of ['a', 'b', 'c']) limiter.take(client);
    // 'a' is seen again, so 'b' is now the oldest.
    expect(limiter.take('a').allowed).toBe(false);
    limiter.take('d');
    expect(limiter.trackedClients).toBe(3);
    expect(limiter.take('c').allowed).toBe(false);
    expect(limiter.take('b').allowed).toBe(true);
  });

  it('allows everything when requestsPerSecond is 0 and refuses settings that make no sense', () => {
    const limiter = new ClientRateLimiter({ requestsPerSecond: 0, burst: 1 });
    expect(limiter.enabled).toBe(false);
    expect(Array.from({ length: 1000 }, () => limiter.take('a').allowed).every(Boolean)).toBe(true);
    expect(limiter.trackedClients).toBe(0);
    expect(() => new ClientRateLimiter({ requestsPerSecond: -1, burst: 1 })).toThrow(RangeError);
    expect(() => new ClientRateLimiter({ requestsPerSecond: Number.NaN, burst: 1 })).toThrow(RangeError);
    expect(() => new ClientRateLimiter({ requestsPerSecond: 1, burst: 0 })).toThrow(RangeError);
  });

  it('says the limit and the wait in its refusal', () => {
    expect(rateLimitMessage({ requestsPerSecond: 50, burst: 200 }, 3)).toBe(
      'too many requests from this client: at most 50 per second (bursts of 200); retry after 3 s',
    );
  });
});
