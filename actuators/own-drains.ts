import { z } from 'zod';
import type { Keys, Redis } from '../core/redis.js';

/**
 * Which nodes steadfast itself took out of service, per node with the decision that did it, kept
 * in Redis beside the scheduler's reason: a reason string can be rewritten by anyone who can
 * drain (an administrator re-draining with `steadfast: …` copied in, a script restoring old
 * reasons), so steadfast returns a node to service automatically only when both say it is its own.
 */

const ownDrainSchema = z.object({
  decisionId: z.string(),
  reason: z.string(),
  time: z.number(),
});
export type OwnDrain = z.infer<typeof ownDrainSchema>;

export class OwnDrains {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {}

  private get key(): string {
    return this.keys.ownDrains;
  }

  /** Notes that `decisionId` took `node` out (the latest decision wins: it is the one that will return it). */
  async record(node: string, decisionId: string, reason: string, now = Date.now()): Promise<void> {
    await this.redis.hset(this.key, node, JSON.stringify({ decisionId, reason: reason.slice(0, 500), time: now }));
  }

  async get(node: string): Promise<OwnDrain | undefined> {
    const text = await this.redis.hget(this.key, node);
    if (text === null) return undefined;
    try {
      const parsed = ownDrainSchema.safeParse(JSON.parse(text));
      return parsed.success ? parsed.data : undefined;
    } catch {
      return undefined;
    }
  }

  /** The node is back in service, or no longer out by steadfast. */
  async forget(node: string): Promise<void> {
    await this.redis.hdel(this.key, node);
  }
}
