import { z } from 'zod';

/**
 * The config's `redis:` section (docs/configuration.md): where the queues, the audit and the
 * state live, how to reach them (password file, TLS, Sentinel), how sure a 202 must be
 * (replica acknowledgement) and how much memory steadfast may keep there.
 */

// Numbers are coerced so that environment overrides, which are always strings, validate too.
const int = () => z.coerce.number<unknown>().int();
const hostSchema = z.string().min(1).max(255);
const portSchema = int().min(0).max(65535);

/** Whether a redis:// URL carries a password (`redis://:secret@host`, `redis://user:secret@host`). */
function urlHasPassword(url: string): boolean {
  try {
    return new URL(url).password !== '';
  } catch {
    return false;
  }
}

export const redisConfigSchema = z
  .object({
    url: z
      .string()
      .regex(/^rediss?:\/\//, 'must start with redis:// or rediss://')
      .refine((url) => URL.canParse(url), 'is not a valid URL')
      .default('redis://127.0.0.1:6379'),
    /** Key prefix for queues, the audit stream and state keys; lets two installations share a Redis. */
    prefix: z
      .string()
      .regex(/^[A-Za-z0-9_-]+$/, 'letters, digits, "_" and "-" only')
      .default('steadfast'),
    /** File holding the Redis password (AUTH; a user name may stay in the URL), read at start; keeps the password out of the config. */
    passwordFile: z.string().min(1).optional(),
    /** TLS settings for a rediss:// URL: the CA bundle (PEM) that signed the server's certificate, when not a public one. */
    tls: z
      .object({ caFile: z.string().min(1).optional() })
      .strict()
      .optional(),
    /**
     * Redis Sentinel: ask these sentinels which server is the primary of the group `name`, and
     * follow a failover. The URL then gives only the user, password, database and scheme.
     */
    sentinels: z
      .array(z.object({ host: hostSchema, port: portSchema.refine((port) => port > 0, 'must be a port number') }).strict())
      .min(1)
      .max(16)
      .optional(),
    name: z
      .string()
      .regex(/^[A-Za-z0-9._-]{1,64}$/, 'a sentinel master group name: letters, digits, ".", "_" or "-"')
      .optional(),
    /** File holding the sentinels' own password (their requirepass), when they have one. */
    sentinelPasswordFile: z.string().min(1).optional(),
    /**
     * Answer 202 only once this many replicas confirm a request's signals (Redis WAIT), so a
     * failover to a replica loses no acknowledged signal; when they do not within
     * replicaAckTimeoutMs the answer is 503 and the sender retries. 0: the primary's word suffices.
     */
    minReplicasAcked: int().min(0).max(16).default(0),
    replicaAckTimeoutMs: int().min(10).max(60_000).default(1000),
    /** Memory steadfast's finished jobs and audit trail may take in Redis, in MiB (docs/limits.md). */
    retentionBudgetMB: int()
      .min(1)
      .max(1024 * 1024)
      .default(1024),
  })
  .strict()
  .refine((redis) => (redis.sentinels === undefined) === (redis.name === undefined), {
    message: 'sentinels and name go together: the sentinels and the master group name they watch',
    path: ['name'],
  })
  .refine((redis) => redis.sentinelPasswordFile === undefined || redis.sentinels !== undefined, {
    message: 'sentinelPasswordFile needs sentinels',
    path: ['sentinelPasswordFile'],
  })
  .refine((redis) => redis.passwordFile === undefined || !urlHasPassword(redis.url), {
    message: 'give the password in the URL or in passwordFile, not both',
    path: ['passwordFile'],
  })
  .refine((redis) => redis.tls === undefined || redis.url.startsWith('rediss://'), { message: 'tls settings need a rediss:// URL', path: ['tls'] });

export type RedisConfig = z.output<typeof redisConfigSchema>;
