import { describe, expect, it } from 'vitest';
import { redisProbe, type Redis } from '../../core/redis.js';

/**
 * The health check answers within its deadline when Redis does not answer, and many callers at
 * once share one PING: a Redis that is stopped collects one unanswered PING, not one per request.
 */
describe('the Redis health check', () => {
  it('answers false within its deadline when PING never returns, with one PING for many callers at once', async () => {
    let pings = 0;
    const silent = { ping: () => ((pings += 1), new Promise<string>(() => undefined)) } as unknown as Redis;
    const probe = redisProbe(silent, 50);
    const answers = await Promise.all(Array.from({ length: 100 }, () => probe()));
    expect(answers.every((up) => !up)).toBe(true);
    expect(pings).toBe(1);
  });

  it('asks again once the previous PING has returned, and says true for PONG and false for an error', async () => {
    const replies: (() => Promise<string>)[] = [() => Promise.resolve('PONG'), () => Promise.reject(new Error('connection closed'))];
    const redis = { ping: () => (replies.shift() as () => Promise<string>)() } as unknown as Redis;
    const probe = redisProbe(redis, 1000);
    expect(await probe()).toBe(true);
    expect(await probe()).toBe(false);
  });
});
