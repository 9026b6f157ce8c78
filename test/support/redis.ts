import { randomBytes } from 'node:crypto';
import { inject } from 'vitest';
import { Keys, workerConnection, type Redis } from '../../core/redis.js';

/** A fresh key prefix on the shared test Redis, and a cleanup that removes every key under it. */
export function testRedis(): { url: string; prefix: string; keys: Keys; redis: Redis; cleanup: () => Promise<void> } {
  const url = inject('redisUrl');
  const prefix = `t${randomBytes(6).toString('hex')}`;
  const redis = workerConnection(url);
  return {
    url,
    prefix,
    keys: new Keys(prefix),
    redis,
    cleanup: async () => {
      let cursor = '0';
      do {
        const [next, found] = await redis.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 1000);
        if (found.length > 0) await redis.del(...found);
        cursor = next;
      } while (cursor !== '0');
      redis.disconnect();
    },
  };
}
