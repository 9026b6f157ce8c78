import { DoNotRetryError, errorMessage } from '../../core/errors.js';
import type { GpuResetReport } from '../../core/remedy.js';
import { OWN_REASON_PREFIX } from '../drain-reason.js';
import { NodeLeasedError } from '../drain-node.js';
import { returnToService, type ReturnOutcome } from '../return-to-service.js';
import type { GpuResetter } from './gpu-resetter.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import { admitNodeStep, leaseHolder, recordStep, rememberRemedy, stepRef, type Halt, type StepAt } from './context.js';
import { evict, type EvictDeps } from './evict.js';
import type { NodeValidator } from '../node-validation.js';
import { keptOutByValidation } from './validation-gate.js';

/** What a GPU reset works with: what an eviction does (its fallback in a job), the agents' resets and the remedies' settings. */
export interface ResetGpuDeps extends EvictDeps {
  readonly resetter: GpuResetter;
  readonly remedies: RemediesConfig;
  /** Waits between busy-GPU retries. */
  readonly pause: (ms: number) => Promise<void>;
  /** Validates the node before the step returns it to service (config `validation:`); none: off. */
  readonly validator?: NodeValidator | undefined;
}

/**
 * The reset_gpu step, for a node of a job and for a node outside any job alike: a machine fault
 * whose cure is resetting one GPU (the Xid catalogue's remedy). The step passes the gates a drain
 * passes (pause, holds and maintenance windows, the budget: a reset counts as one), holds the
 * node's lease, and asks the node's agent to reset the GPU (POST /api/v1/gpu-reset) — again,
 * after a pause, while processes still hold it (they may be exiting after the Xid or the job's
 * stop). A redelivered step does not reset twice: the report is kept under the step's ref.
 *
 * - In a job, stopped by the ladder's stop step before this: a reset that holds leaves the node in
 *   the job and the restart that follows relaunches on the same nodes; a refused or failed one
 *   makes this step an eviction of the node instead (evict.ts), so the job still restarts.
 * - Outside a job: the node is taken out of service for the reset and returned after it — only
 *   when this step took it out and no one else has drained it since (return-to-service.ts); a
 *   refused or failed reset drains it, after any reason someone else gave (drain-reason.ts).
 * - In a job, on a node someone else has drained: the reset is done, then the node is evicted
 *   rather than relaunched upon (resetHeldInJob).
 *
 * Either way the node's remediation history records it. Dry-run asks no agent (the processor
 * gives this step a recording resetter).
 */

export async function resetGpu(deps: ResetGpuDeps, at: StepAt): Promise<Halt> {
  const { step } = at;
  const node = step.nodes?.[0];
  const gpu = step.gpu;
  const inJob = at.job !== undefined;
  if (node === undefined || gpu === undefined) return cannotReset(deps, at, 'no node or GPU named');
  const ref = stepRef(at);
  const admitted = await admitNodeStep(deps, at, node, 'reset_gpu', { node: inJob ? node : undefined });
  if (!admitted.ok) return admitted.halt;
  const holder = leaseHolder(at);
  const lease = await deps.gates.acquireLease(node, holder);
  if (!lease.ok) throw new NodeLeasedError(lease.reason);
  let report: GpuResetReport;
  let tookOut = false;
  let held = false;
  try {
    const progress = await deps.redis.hgetall(deps.keys.action(ref));
    if (!inJob) tookOut = await takeOut(deps, at, node, gpu, progress.tookOut === '1');
    report = progress.resetReport ? (JSON.parse(progress.resetReport) as GpuResetReport) : await resetWithRetries(deps, deps.resetter, node, gpu);
    await deps.redis.hset(deps.keys.action(ref), 'resetReport', JSON.stringify(report));
    if (report.outcome === 'reset') {
      // In a job, what follows may evict the node, which takes the node's lease itself: after the finally.
      if (inJob) held = true;
      else {
        // A node it took out first passes validation (validation-gate.ts), then goes back only if this
        // decision took it out and no one else's drain is on it (return-to-service.ts).
        if (tookOut && (await keptOutByValidation(deps, at, node, `GPU ${gpu} reset (${report.reason})`, 'reset_gpu'))) return undefined;
        const back = tookOut ? await returnToService(deps, node, { decisionId: at.transitionId }) : undefined;
        return await resetHeld(deps, at, node, gpu, report, back);
      }
    }
    if (!inJob) {
      // Refused or failed: the node needs more than a reset; take it out fully (Kubernetes: evict too).
      // On a node someone else drained, the backend keeps their reason first and appends this one.
      const reason = `${OWN_REASON_PREFIX} ${step.reason}; GPU reset ${report.outcome}: ${report.reason} audit=${at.transitionId}`;
      await deps.ownDrains?.record(node, at.transitionId, reason);
      const before = await deps.backend.nodeState(node);
      await deps.backend.drain(node, reason);
      const kept = before.foreign === undefined ? '' : `; someone else's drain ("${before.foreign}") kept first`;
      const detail = `GPU reset ${report.outcome} (${report.reason}); node drained instead${kept}`;
      await rememberRemedy(deps, at, node, 'reset_gpu', 'fell_back', detail, 'reset');
      await rememberRemedy(deps, at, node, 'drain', 'done', `after the GPU reset ${report.outcome}`, 'drain');
      await recordStep(deps, at, 'done', detail);
      return undefined;
    }
  } finally {
    await deps.gates.releaseLease(node, holder);
  }
  if (held) return resetHeldInJob(deps, at, node, gpu, report);
  // In a job, the eviction takes the node's lease itself: it runs once this step has let go of it.
  await rememberRemedy(deps, at, node, 'reset_gpu', 'fell_back', report.reason, 'reset');
  await recordStep(deps, at, report.outcome === 'refused' ? 'refused' : 'failed', `GPU reset ${report.outcome} (${report.reason}); evicting ${node} instead`, {
    node,
  });
  return asEviction(deps, at, node);
}

/** The reset_gpu step where no reset can be asked for (`why`): outside a job a failure, in a job an eviction of the node. */
export async function cannotReset(deps: EvictDeps, at: StepAt, why: string): Promise<Halt> {
  const node = at.step.nodes?.[0];
  if (at.job === undefined) throw new DoNotRetryError(`reset step ${stepRef(at)}: ${why}`);
  await recordStep(deps, at, 'done', `${why}; evicting the node instead`, { node });
  return asEviction(deps, at, node);
}

function asEviction(deps: EvictDeps, at: StepAt, node: string | undefined): Promise<Halt> {
  return evict(deps, { ...at, step: { ...at.step, verb: 'evict', nodes: node === undefined ? [] : [node] } });
}

/** Outside a job: the node out of service for the reset. Whether this step took it out (kept across a redelivery). */
async function takeOut(deps: ResetGpuDeps, at: StepAt, node: string, gpu: string, already: boolean): Promise<boolean> {
  const { backend } = deps;
  const before = await backend.nodeState(node);
  if (!before.exists) throw new DoNotRetryError(`node ${node} is unknown to the ${backend.name} backend`);
  if (before.drained) return already;
  await deps.redis.hset(deps.keys.action(stepRef(at)), 'tookOut', '1');
  await recordStep(deps, at, 'running', `out of service for the GPU reset through ${backend.name}${backend.cordon ? ' (cordon only)' : ''}`);
  const reason = `${OWN_REASON_PREFIX} GPU reset of ${gpu}: ${at.step.reason} audit=${at.transitionId}`;
  await deps.ownDrains?.record(node, at.transitionId, reason);
  await (backend.cordon ? backend.cordon(node, reason) : backend.drain(node, reason));
  return true;
}

/**
 * In a job: the job relaunches on the same nodes — unless someone else has drained this node
 * (an administrator, Slurm's health check): the reset stands as a remedy, but a relaunch there
 * would wait for ever, so the node is evicted instead (a standby takes its place) and their
 * drain is left exactly as it is.
 */
async function resetHeldInJob(deps: ResetGpuDeps, at: StepAt, node: string, gpu: string, report: GpuResetReport): Promise<Halt> {
  await rememberRemedy(deps, at, node, 'reset_gpu', 'done', report.reason, 'reset');
  const state = await deps.backend.nodeState(node);
  if (state.foreign !== undefined) {
    await recordStep(
      deps,
      at,
      'done',
      `GPU ${gpu} of ${node} reset through its agent (${report.reason}); ${node} is drained by someone else ("${state.foreign}"): evicting it, their drain kept`,
      { node },
    );
    return asEviction(deps, at, node);
  }
  await recordStep(deps, at, 'done', `GPU ${gpu} of ${node} reset through its agent (${report.reason}); the job relaunches on the same nodes`, { node });
  return undefined;
}

async function resetHeld(deps: ResetGpuDeps, at: StepAt, node: string, gpu: string, report: GpuResetReport, back: ReturnOutcome | undefined): Promise<Halt> {
  // The node is back: a new fault on it soon is a new decision (escalation counts it), not this one's.
  await deps.locks.shortenNodeClaim(node, at.transitionId, deps.remedies.gpuReset.rejoinSeconds);
  const after =
    back === undefined ? 'node left out of service, as it was before' : back.returned ? 'node returned to service' : `node left out of service: ${back.why}`;
  const detail = `GPU ${gpu}${report.index === null ? '' : ` (index ${report.index})`} reset and listed again in ${report.seconds.toFixed(1)} s; ${after}`;
  await rememberRemedy(deps, at, node, 'reset_gpu', 'done', detail, 'reset');
  await recordStep(deps, at, 'done', detail);
  return undefined;
}

/** Asks for the reset, again while processes still hold the GPU (they may be exiting after the Xid). */
async function resetWithRetries(deps: ResetGpuDeps, resetter: GpuResetter, node: string, gpu: string): Promise<GpuResetReport> {
  const config = deps.remedies.gpuReset;
  const { pause } = deps;
  let report: GpuResetReport | undefined;
  for (let attempt = 0; attempt <= config.busyRetries; attempt += 1) {
    if (attempt > 0) await pause(config.busyRetryDelaySeconds * 1000);
    try {
      report = await resetter.reset(node, gpu, config.timeoutSeconds);
    } catch (error) {
      return { node, gpu, index: null, outcome: 'failed', processes: [], stopped: [], reason: `agent not reached: ${errorMessage(error)}`, seconds: 0 };
    }
    if (report.outcome !== 'refused' || report.processes.length === 0) return report;
  }
  return report as GpuResetReport;
}
