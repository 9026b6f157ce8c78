import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import type { AuditLog } from '../core/audit.js';
import { CONTROLLER_IDENTITY } from '../core/credentials.js';
import { errorMessage } from '../core/errors.js';
import { Locks } from '../core/locks.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import type { ClusterBackend } from './backend.js';
import { OwnDrains } from './own-drains.js';
import { returnToService } from './return-to-service.js';
import { validationFailure, type NodeValidation, type NodeValidator } from './node-validation.js';
import type { StandbyPool } from './standby-pool.js';

/**
 * The validations that wait for something rather than run inside a step, driven by the controller's
 * tick and run in the background so that a burn never holds a job's recovery:
 *
 * - a node rebooted with validation on comes back DOWN (the reboot step asks Slurm for
 *   `nextstate=DOWN`); once the backend shows the reboot done and slurmd answering, it is
 *   validated, then resumed, or drained with a reason naming the failed check;
 * - a warm standby that became ready is validated once (its agent's self-check has run the burn;
 *   here its throughput is compared with its peers'), and a failing one leaves the pool as failed
 *   (ByteRobust §6.2: only a self-checked standby stands in).
 *
 * One validation per node at a time across replicas (a Redis lease per node).
 */

const pendingSchema = z.object({ decision: z.string(), since: z.number(), lastTry: z.number().optional() });

/** How often a rebooted node whose agent does not answer yet is asked again. */
const RETRY_MS = 30_000;

const pendingKey = (keys: Keys): string => keys.validationAfterReboot;
const standbyKey = (keys: Keys): string => keys.validationStandbys;

function parsedOrUndefined(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

/** The reboot step records that `node` waits to be validated once it is back (actuators/steps/reboot.ts). */
export async function awaitValidationAfterReboot(redis: Redis, keys: Keys, node: string, decision: string, now: number): Promise<void> {
  await redis.hset(pendingKey(keys), node, JSON.stringify({ decision, since: now }));
}

/** Whether the backend still shows the reboot under way, or slurmd not answering (sinfo's `@ ^ *`, slurmrestd's flags). */
export function stillRebooting(raw: string): boolean {
  return /REBOOT|NOT_RESPONDING|POWER|[@^*]/i.test(raw);
}

export interface ValidationUpkeepDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly backend: ClusterBackend;
  readonly validator: NodeValidator;
  readonly audit: AuditLog;
  readonly logger: Logger;
  readonly pool?: StandbyPool | undefined;
  /** A rebooted node not back and validated within this long is left out of service, audited. */
  readonly giveUpMs: number;
  /** How long one validation may take (the lease per node). */
  readonly timeoutMs: number;
}

export class ValidationUpkeep {
  private readonly inFlight = new Map<string, Promise<void>>();
  /** One controller replica validates a node at a time; the lease outlives a validation that hangs. */
  private readonly locks: Locks;

  constructor(private readonly deps: ValidationUpkeepDeps) {
    this.locks = new Locks(deps.redis, deps.keys);
  }

  /** One pass, from the controller's tick: starts what is due in the background. Never throws. */
  tick(now: number): void {
    this.pass(now).catch((error: unknown) => this.deps.logger.warn({ err: error }, 'validation upkeep failed; the next tick tries again'));
  }

  /** Waits for the validations now running (tests, shutdown). */
  async settled(): Promise<void> {
    await Promise.all([...this.inFlight.values()]);
  }

  private async pass(now: number): Promise<void> {
    const { redis, keys, backend } = this.deps;
    for (const [node, text] of Object.entries(await redis.hgetall(pendingKey(keys)))) {
      const entry = pendingSchema.safeParse(parsedOrUndefined(text));
      if (!entry.success || this.inFlight.has(node)) continue;
      if (now - entry.data.since > this.deps.giveUpMs) {
        await redis.hdel(pendingKey(keys), node);
        await this.record(
          node,
          entry.data.decision,
          'failed',
          `not back from its reboot and validated within ${Math.round(this.deps.giveUpMs / 1000)} s; left out of service`,
        );
        continue;
      }
      if (entry.data.lastTry !== undefined && now - entry.data.lastTry < RETRY_MS) continue;
      if (stillRebooting((await backend.nodeState(node)).raw)) continue;
      this.start(node, () => this.afterReboot(node, entry.data, now));
    }
    const pool = this.deps.pool;
    if (pool === undefined) return;
    const validated = await redis.hgetall(standbyKey(keys));
    for (const member of await pool.members()) {
      if (member.state !== 'ready' || validated[member.node] === String(member.since) || this.inFlight.has(member.node)) continue;
      this.start(member.node, () => this.standby(pool, member.node, member.since));
    }
  }

  private start(node: string, work: () => Promise<void>): void {
    const holder = randomUUID();
    const running = (async () => {
      if (!(await this.locks.takeValidationLease(node, holder, this.deps.timeoutMs + 30_000))) return;
      try {
        await work();
      } finally {
        await this.locks.releaseValidationLease(node, holder);
      }
    })()
      .catch((error: unknown) => this.deps.logger.warn({ node, err: error }, 'validation of a node failed to run; the next tick tries again'))
      .finally(() => this.inFlight.delete(node));
    this.inFlight.set(node, running);
  }

  private async afterReboot(node: string, entry: z.infer<typeof pendingSchema>, now: number): Promise<void> {
    const { redis, keys, backend, validator } = this.deps;
    const verdict = await validator.validate(node);
    // Its agent not up yet: back from the reboot is not back in service; ask again later.
    if (!verdict.ok && verdict.failed === 'agent') {
      await redis.hset(pendingKey(keys), node, JSON.stringify({ ...entry, lastTry: now }));
      return;
    }
    await redis.hdel(pendingKey(keys), node);
    if (verdict.ok) {
      // Back only if this reboot's decision still holds the node out alone (return-to-service.ts).
      const back = await returnToService({ backend, ownDrains: new OwnDrains(redis, keys) }, node, { decisionId: entry.decision });
      if (!back.returned) {
        await this.record(
          node,
          entry.decision,
          'done',
          `back from its reboot and validated in ${verdict.seconds.toFixed(1)} s; left out of service: ${back.why}`,
          verdict,
        );
        return;
      }
      await this.record(
        node,
        entry.decision,
        'done',
        `back from its reboot and validated in ${verdict.seconds.toFixed(1)} s (${verdict.detail}); returned to service`,
        verdict,
      );
      return;
    }
    const why = validationFailure(verdict);
    await backend.drain(node, `steadfast: after its reboot, ${why} audit=${entry.decision}`.slice(0, 1000));
    await this.record(node, entry.decision, 'failed', `back from its reboot, but ${why}; kept out of service`, verdict);
  }

  private async standby(pool: StandbyPool, node: string, since: number): Promise<void> {
    const verdict = await this.deps.validator.validate(node);
    await this.deps.redis.hset(standbyKey(this.deps.keys), node, String(since));
    if (verdict.ok) return;
    const why = validationFailure(verdict);
    await pool.selfCheck(node, false, why);
    await this.record(node, `standby-${node}-${since}`, 'failed', `standby ${node} not trusted: ${why}`, verdict);
  }

  private async record(node: string, ref: string, state: 'done' | 'failed', detail: string, verdict?: NodeValidation): Promise<void> {
    await this.deps.audit
      .append(
        {
          type: 'action',
          ref,
          node,
          summary: `validate ${node}: ${state} (${detail})`.slice(0, 1000),
          data: { verb: 'validate', node, state, detail, ...(verdict ? { failed: verdict.failed, seconds: verdict.seconds } : {}) },
          actor: CONTROLLER_IDENTITY,
        },
        `validate:${ref}:${node}:${state}`,
      )
      .catch((error: unknown) => this.deps.logger.warn({ node, err: errorMessage(error) }, 'could not audit a validation'));
  }
}
