import type { AuditLog } from '../core/audit.js';
import { CONTROLLER_IDENTITY } from '../core/credentials.js';
import type { Keys, Redis } from '../core/redis.js';
import type { ClusterBackend, NodeState } from './backend.js';

/**
 * Others' drains and the cluster's own node problems, read as signals. A node an administrator,
 * another tool or Slurm's health check took out, or one node-problem-detector reports a problem
 * on (a Kubernetes condition with status True), is somebody's judgement that the node is not
 * fit: steadfast does not overrule it (NVIDIA/NVSentinel#1424, #1633). The controller reads the
 * nodes it knows — the registered jobs' nodes and the standby candidates — now and then, audits
 * each change once, and keeps the flagged nodes here, where the standby choice leaves them out.
 */

/** How often the nodes are read: each read costs the backend one query per node. */
export const FOREIGN_SCAN_INTERVAL_MS = 30_000;

/** What someone else says about a node now: empty when nothing. */
export function foreignHoldOf(state: NodeState): string {
  const parts: string[] = [];
  if (state.exists && state.drained && state.foreign !== undefined) parts.push(`drained by someone else (reason "${state.foreign}")`);
  if (state.exists && state.conditions !== undefined && state.conditions.length > 0) parts.push(`node conditions ${state.conditions.join(', ')}`);
  return parts.join('; ');
}

export class ForeignHolds {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {}

  private get key(): string {
    return this.keys.foreignHolds;
  }

  private get scanKey(): string {
    return this.keys.foreignHoldsScanned;
  }

  /** The nodes someone else holds out now, as last read. */
  async nodes(): Promise<Set<string>> {
    return new Set(Object.keys(await this.redis.hgetall(this.key)));
  }

  /** What was last read about each flagged node. */
  async all(): Promise<Record<string, string>> {
    return this.redis.hgetall(this.key);
  }

  /**
   * Reads `nodes` through the backend, at most once per FOREIGN_SCAN_INTERVAL_MS across every
   * controller replica (a marker in Redis), and audits each node whose hold began, changed or
   * ended. Returns the nodes read (none when another scan is recent).
   */
  async scan(backend: ClusterBackend, audit: AuditLog, nodes: () => Promise<Iterable<string>>, now = Date.now()): Promise<string[]> {
    const due = await this.redis.set(this.scanKey, String(now), 'PX', FOREIGN_SCAN_INTERVAL_MS, 'NX');
    if (due === null) return [];
    const read: string[] = [];
    for (const node of new Set(await nodes())) {
      let hold: string;
      try {
        hold = foreignHoldOf(await backend.nodeState(node));
      } catch {
        continue; // a node the backend cannot read now is read again next time
      }
      read.push(node);
      await this.note(audit, backend.name, node, hold, now);
    }
    return read;
  }

  /** Records `hold` for `node` and audits it when it differs from what was recorded before. */
  async note(audit: AuditLog, backend: string, node: string, hold: string, now = Date.now()): Promise<void> {
    const before = (await this.redis.hget(this.key, node)) ?? '';
    if (before === hold) return;
    if (hold === '') await this.redis.hdel(this.key, node);
    else await this.redis.hset(this.key, node, hold);
    const summary =
      hold === '' ? `${node}: no longer held out by someone else (was: ${before}); a standby candidate again` : `${node}: ${hold}; kept out of standby choice`;
    await audit.append(
      {
        type: 'signal',
        ref: `foreign-${node}-${now}`,
        node,
        summary,
        data: { kind: 'foreign_hold', node, hold, previous: before, backend },
        actor: CONTROLLER_IDENTITY,
      },
      `foreign:${node}:${now}`,
    );
  }
}
