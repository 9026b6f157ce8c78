import { Locks } from '../../core/locks.js';
import type { Keys, Redis } from '../../core/redis.js';

/**
 * An operator returning a node to service (`steadfast resume`) closes every fault reported on it
 * before then: the one its drain claim points at, and any other report of an earlier time. A
 * report of such a fault that comes later (Alertmanager re-sending an old webhook, an agent's
 * late delivery) is recorded and not acted on, so it cannot take the node's claim back for a
 * closed decision and make the node's next real fault "the same fault" as one already handled.
 * A fault reported after the resume is decided afresh.
 *
 * One time per node, in one hash: bounded by the nodes the backend knows (resume refuses others).
 */

/** Records that `node` went back to service at `at` (ms) and releases its drain claim (core/locks.ts); returns the decision the claim pointed at. */
export async function closeFaultsOnResume(redis: Redis, keys: Keys, node: string, at: number): Promise<string | undefined> {
  return new Locks(redis, keys).closeNodeClaimOnResume(node, at);
}

/** When an operator last returned `node` to service (ms), if one ever did. */
export async function lastResume(redis: Redis, keys: Keys, node: string): Promise<number | undefined> {
  const raw = await redis.hget(keys.nodeResumes, node);
  const at = raw === null ? Number.NaN : Number(raw);
  return Number.isFinite(at) ? at : undefined;
}
