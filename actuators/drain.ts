import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { ActionState, Decision } from '../core/action.js';
import { decisionSchema } from '../core/action.js';
import { DoNotRetryError, errorMessage } from '../core/errors.js';
import { parseJobPayload } from '../core/job-payload.js';
import type { ActionJob } from '../core/queues.js';
import { NodeLeasedError, TERMINAL_STATES, drainNode, pageOncePerWindow, recordAction, releaseRefusedClaim, type NodeActuatorDeps } from './drain-node.js';

export interface DrainResult {
  readonly state: ActionState;
  readonly detail: string;
}

export interface DrainActuatorDeps extends NodeActuatorDeps {
  /** Carries out the decisions that are remedies short of a drain (remedy.ts); without it they are drained. */
  readonly remedy?: (job: Job<ActionJob>, decision: Decision) => Promise<DrainResult>;
}

/**
 * Carries out a drain decision (a node's fault outside any job's ladder): remember the outcome
 * under the decision id so a redelivered job does nothing, pass the gates in order — pause, the
 * node's hold and budget here, the node's lease in drainNode — then drain through the backend (drain-node.ts).
 */
export function createDrainProcessor(deps: DrainActuatorDeps): (job: Job<ActionJob>) => Promise<DrainResult> {
  const { redis, keys, audit, backend, gates, logger } = deps;

  // `attempt` keeps one audit entry per state per delivery: a retried drain shows each try.
  function record(decision: Decision, state: ActionState, detail: string, attempt = 0): Promise<DrainResult> {
    return recordAction(deps, decision, { state, detail, attempt }, { what: `drain ${decision.node}` });
  }

  return async (job) => {
    const decision = parseJobPayload(decisionSchema, job.data?.decision, 'action job payload');
    if (decision.verb !== 'drain' && deps.remedy) return deps.remedy(job, decision);
    const previous = (await redis.hget(keys.action(decision.id), 'state')) as ActionState | null;
    if (previous !== null && TERMINAL_STATES.has(previous)) {
      return { state: previous, detail: 'already handled; not acting twice' };
    }
    const admitted = await gates.admit(decision.id, [decision.node]);
    if (!admitted.ok) {
      const refused = await record(decision, 'refused', admitted.reason);
      await releaseRefusedClaim(deps, decision);
      await pageOncePerWindow(gates, audit, admitted, { ref: decision.id, what: `drain ${decision.node}`, node: decision.node }, deps.onPage);
      return refused;
    }
    try {
      const outcome = await drainNode(backend, gates, {
        node: decision.node,
        holder: `${decision.id}:${job.id ?? ''}`,
        reason: decision.reason,
        auditId: decision.id,
        onDraining: async () => {
          await record(decision, 'running', `draining through ${backend.name}`, job.attemptsMade);
        },
      });
      const { state } = outcome;
      if (outcome.already) return await record(decision, 'done', `already out of service (${state.raw}${state.reason ? `: ${state.reason}` : ''}); nothing to do`);
      return await record(decision, 'done', `${state.raw}: ${state.reason ?? decision.reason}`);
    } catch (error) {
      // Another actuator is on the node: not a failed drain, only a later try (BullMQ's backoff).
      if (error instanceof NodeLeasedError) throw error;
      const final = error instanceof DoNotRetryError || job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
      await record(decision, 'failed', `${errorMessage(error)}${final ? '' : '; will retry'}`, job.attemptsMade).catch((auditError: unknown) =>
        logger.error({ err: auditError }, 'could not record failed action'),
      );
      if (error instanceof DoNotRetryError) throw new UnrecoverableError(error.message);
      throw error;
    }
  };
}
