import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { ActionRecord, ActionState, Decision } from '../core/action.js';
import { decisionSchema } from '../core/action.js';
import type { AuditLog } from '../core/audit.js';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../core/errors.js';
import { parseJobPayload } from '../core/job-payload.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import type { ClusterBackend } from './backend.js';
import type { SafetyGates } from './safety.js';

export interface ActionJob {
  readonly decision: Decision;
}

export interface DrainResult {
  readonly state: ActionState;
  readonly detail: string;
}

export interface DrainActuatorDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly logger: Logger;
  /** Called once per finished action (metrics, annotations). */
  readonly onFinished?: (record: ActionRecord) => void;
  /**
   * Pages a person (steadfast_human_pages_total) about a refused drain: the first refusal of
   * each gate in a budget window pages, later ones are only audited (SafetyGates.claimPage).
   */
  readonly onPage?: (reason: string) => void;
}

const TERMINAL: ReadonlySet<ActionState> = new Set(['done', 'refused']);

/**
 * Carries out a drain decision, reconcile-style: look at the node first, act only if it is not
 * drained yet, and remember the outcome under the decision id so a redelivered job does nothing.
 * Gates in order: pause, budget, lease, then the backend (STYLE.md).
 */
export function createDrainProcessor(deps: DrainActuatorDeps): (job: Job<ActionJob>) => Promise<DrainResult> {
  const { redis, keys, audit, backend, gates, logger } = deps;

  // `attempt` keeps one audit entry per state per delivery: a retried drain shows each try.
  async function record(decision: Decision, state: ActionState, detail: string, attempt = 0): Promise<DrainResult> {
    const time = new Date().toISOString();
    const entry: ActionRecord = { decisionId: decision.id, verb: decision.verb, node: decision.node, state, detail, backend: backend.name, time };
    await redis.hset(keys.action(decision.id), { ...entry });
    await audit.append(
      { type: 'action', ref: decision.id, node: decision.node, summary: `drain ${decision.node}: ${state} (${detail})`, data: { ...entry } },
      `action:${decision.id}:${state}:${attempt}`,
    );
    if (TERMINAL.has(state) || state === 'failed') deps.onFinished?.(entry);
    return { state, detail };
  }

  async function carryOut(decision: Decision, attempt: number): Promise<DrainResult> {
    const before = await backend.nodeState(decision.node);
    if (!before.exists) throw new DoNotRetryError(`node ${decision.node} is unknown to the ${backend.name} backend`);
    if (before.drained) {
      return record(decision, 'done', `already out of service (${before.raw}${before.reason ? `: ${before.reason}` : ''}); nothing to do`);
    }
    await record(decision, 'running', `draining through ${backend.name}`, attempt);
    await backend.drain(decision.node, `steadfast: ${decision.reason} audit=${decision.id}`);
    const after = await backend.nodeState(decision.node);
    if (!after.drained) throw new RetryLaterError(`${backend.name} still shows ${decision.node} as ${after.raw} after the drain`);
    return record(decision, 'done', `${after.raw}: ${after.reason ?? decision.reason}`);
  }

  return async (job) => {
    const decision = parseJobPayload(decisionSchema, job.data?.decision, 'action job payload');
    const previous = (await redis.hget(keys.action(decision.id), 'state')) as ActionState | null;
    if (previous !== null && TERMINAL.has(previous)) {
      return { state: previous, detail: 'already handled; not acting twice' };
    }
    const admitted = await gates.admit(decision.id);
    if (!admitted.ok) {
      const refused = await record(decision, 'refused', admitted.reason);
      if (deps.onPage && (await gates.claimPage(admitted.gate))) {
        deps.onPage(admitted.reason);
        await audit.append(
          {
            type: 'action',
            ref: decision.id,
            node: decision.node,
            summary: `page_human: a person is needed: drain ${decision.node} refused (${admitted.reason}); later refusals in this window are audited without paging`,
            data: { verb: 'page_human', state: 'done', detail: admitted.reason, gate: admitted.gate, node: decision.node },
          },
          `action:${decision.id}:page`,
        );
      }
      return refused;
    }

    const holder = `${decision.id}:${job.id ?? ''}`;
    const lease = await gates.acquireLease(decision.node, holder);
    if (!lease.ok) throw new RetryLaterError(lease.reason);
    try {
      return await carryOut(decision, job.attemptsMade);
    } catch (error) {
      const final = error instanceof DoNotRetryError || job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
      await record(decision, 'failed', `${errorMessage(error)}${final ? '' : '; will retry'}`, job.attemptsMade).catch((auditError: unknown) =>
        logger.error({ err: errorMessage(auditError) }, 'could not record failed action'),
      );
      if (error instanceof DoNotRetryError) throw new UnrecoverableError(error.message);
      throw error;
    } finally {
      await gates.releaseLease(decision.node, holder);
    }
  };
}
