import { setTimeout as sleep } from 'node:timers/promises';
import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { ActionState, Decision } from '../core/action.js';
import { DoNotRetryError, errorMessage } from '../core/errors.js';
import { HANDED_OFF_REASON, type GpuResetReport, type RemedyAction, type RemedyOutcome } from '../core/remedy.js';
import type { RemediesConfig } from '../core/remedy-config.js';
import { NodeLeasedError, TERMINAL_STATES, drainNode, pageOncePerWindow, recordAction, releaseRefusedClaim, type NodeActuatorDeps } from './drain-node.js';
import type { HandOffNotifier } from './hand-off.js';
import type { RemediationHistory } from './remediation-history.js';

/**
 * Carries out the remedies short of a drain (docs/remedies.md): a GPU reset through the node's
 * agent, a node reboot through the backend, and a hand-off to people. Same gates and the same
 * once-per-decision bookkeeping as the drain actuator: pause, hold, budget, then the node's lease.
 */

/** Resets one GPU on a node: the agent's POST /api/v1/gpu-reset, or a recorder under dry-run. */
export interface GpuResetter {
  reset(node: string, gpu: string, timeoutSeconds: number): Promise<GpuResetReport>;
}

/** Dry-run: reports the reset as done without asking any agent. */
export class DryRunGpuResetter implements GpuResetter {
  async reset(node: string, gpu: string): Promise<GpuResetReport> {
    return { node, gpu, index: null, outcome: 'reset', processes: [], stopped: [], reason: 'dry-run: no agent was asked', seconds: 0 };
  }
}

export interface RemedyActuatorDeps extends NodeActuatorDeps {
  readonly history: RemediationHistory;
  readonly resetter: GpuResetter;
  readonly handOff?: HandOffNotifier | undefined;
  readonly config: RemediesConfig;
  /** Counts each remediation by node, action and outcome (steadfast_remediations_total). */
  readonly onRemediation?: (node: string, action: RemedyAction, outcome: RemedyOutcome) => void;
  /** Waits between busy-GPU retries; tests pass a fast one. */
  readonly pause?: (ms: number) => Promise<void>;
}

export function createRemedyProcessor(deps: RemedyActuatorDeps): (job: Job, decision: Decision) => Promise<{ state: ActionState; detail: string }> {
  const { redis, keys, audit, backend, gates, history, config } = deps;
  const pause = deps.pause ?? ((ms: number) => sleep(ms));

  function record(decision: Decision, state: ActionState, detail: string, attempt = 0): Promise<{ state: ActionState; detail: string }> {
    const what = decision.gpu ? `${decision.verb} ${decision.node} GPU ${decision.gpu}` : `${decision.verb} ${decision.node}`;
    return recordAction(deps, decision, { state, detail, attempt }, { what, data: { gpu: decision.gpu } });
  }

  async function remember(decision: Decision, action: RemedyAction, outcome: RemedyOutcome, detail: string, step: string): Promise<void> {
    const entry = { time: new Date().toISOString(), action, outcome, detail: detail.slice(0, 1024), decisionId: decision.id, ...(decision.gpu ? { gpu: decision.gpu } : {}), ...(decision.origin ? { actor: decision.origin } : {}) };
    if (await history.record(decision.node, entry, `${decision.id}:${step}`)) deps.onRemediation?.(decision.node, action, outcome);
  }

  /** Asks for the reset, again while processes still hold the GPU (they may be exiting after the Xid). */
  async function resetWithRetries(decision: Decision, gpu: string): Promise<GpuResetReport> {
    let report: GpuResetReport | undefined;
    for (let attempt = 0; attempt <= config.gpuReset.busyRetries; attempt += 1) {
      if (attempt > 0) await pause(config.gpuReset.busyRetryDelaySeconds * 1000);
      try {
        report = await deps.resetter.reset(decision.node, gpu, config.gpuReset.timeoutSeconds);
      } catch (error) {
        return { node: decision.node, gpu, index: null, outcome: 'failed', processes: [], stopped: [], reason: `agent not reached: ${errorMessage(error)}`, seconds: 0 };
      }
      if (report.outcome !== 'refused' || report.processes.length === 0) return report;
    }
    return report as GpuResetReport;
  }

  async function resetGpu(job: Job, decision: Decision): Promise<{ state: ActionState; detail: string }> {
    const gpu = decision.gpu;
    if (gpu === undefined) throw new DoNotRetryError(`reset decision ${decision.id} names no GPU`);
    const holder = `${decision.id}:${job.id ?? ''}`;
    const lease = await gates.acquireLease(decision.node, holder);
    if (!lease.ok) throw new NodeLeasedError(lease.reason);
    try {
      const progress = await redis.hgetall(keys.action(decision.id));
      const before = await backend.nodeState(decision.node);
      if (!before.exists) throw new DoNotRetryError(`node ${decision.node} is unknown to the ${backend.name} backend`);
      // Whether this decision took the node out (kept across a redelivery): only then is it returned after the reset.
      const tookOut = progress.tookOut === '1' || !before.drained;
      if (!before.drained) {
        await redis.hset(keys.action(decision.id), 'tookOut', '1');
        await record(decision, 'running', `out of service for the GPU reset through ${backend.name}${backend.cordon ? ' (cordon only)' : ''}`, job.attemptsMade);
        const reason = `steadfast: GPU reset of ${gpu}: ${decision.reason} audit=${decision.id}`;
        await (backend.cordon ? backend.cordon(decision.node, reason) : backend.drain(decision.node, reason));
      }
      // A redelivered job that already reset the GPU does not reset it a second time.
      const report: GpuResetReport = progress.resetReport ? (JSON.parse(progress.resetReport) as GpuResetReport) : await resetWithRetries(decision, gpu);
      await redis.hset(keys.action(decision.id), 'resetReport', JSON.stringify(report));
      if (report.outcome === 'reset') {
        if (tookOut) await backend.resume(decision.node);
        // The node is back: a new fault on it soon is a new decision (escalation counts it), not this one's.
        const claim = keys.nodeDrainClaim(decision.node);
        if ((await redis.get(claim)) === decision.id) await redis.expire(claim, config.gpuReset.rejoinSeconds);
        const detail = `GPU ${gpu}${report.index === null ? '' : ` (index ${report.index})`} reset and listed again in ${report.seconds.toFixed(1)} s; ${tookOut ? 'node returned to service' : 'node left out of service, as it was before'}`;
        await remember(decision, 'reset_gpu', 'done', detail, 'reset');
        return await record(decision, 'done', detail);
      }
      // Refused or failed: the node needs more than a reset; take it out fully (Kubernetes: evict too).
      await backend.drain(decision.node, `steadfast: ${decision.reason}; GPU reset ${report.outcome}: ${report.reason} audit=${decision.id}`);
      const detail = `GPU reset ${report.outcome} (${report.reason}); node drained instead`;
      await remember(decision, 'reset_gpu', 'fell_back', detail, 'reset');
      await remember(decision, 'drain', 'done', `after the GPU reset ${report.outcome}`, 'drain');
      return await record(decision, 'done', detail);
    } finally {
      await gates.releaseLease(decision.node, holder);
    }
  }

  async function reboot(job: Job, decision: Decision): Promise<{ state: ActionState; detail: string }> {
    const rebootNode = backend.reboot?.bind(backend);
    if (rebootNode === undefined) return handOff(job, decision, `the ${backend.name} backend cannot reboot a node`);
    const holder = `${decision.id}:${job.id ?? ''}`;
    const lease = await gates.acquireLease(decision.node, holder);
    if (!lease.ok) throw new NodeLeasedError(lease.reason);
    try {
      const before = await backend.nodeState(decision.node);
      if (!before.exists) throw new DoNotRetryError(`node ${decision.node} is unknown to the ${backend.name} backend`);
      const reason = `steadfast: ${decision.reason} audit=${decision.id}`;
      await rebootNode(decision.node, reason, config.reboot.nextState);
      // An ASAP reboot drains the node at once; a scheduler that shows it still taking work did not
      // take the request (Slurm skips powered-down nodes): drain it, so the fault is not left running.
      const after = await backend.nodeState(decision.node);
      if (!after.drained) {
        await backend.drain(decision.node, `${reason}; the reboot request was not taken`);
        const detail = `${backend.name} showed ${after.raw} after the reboot request; node drained instead`;
        await remember(decision, 'reboot', 'fell_back', detail, 'reboot');
        await remember(decision, 'drain', 'done', 'after a reboot request that was not taken', 'drain');
        return await record(decision, 'done', detail);
      }
      const detail = `reboot requested through ${backend.name} (${after.raw}: once idle, then ${config.reboot.nextState})`;
      await remember(decision, 'reboot', 'done', detail, 'reboot');
      return await record(decision, 'done', detail);
    } finally {
      await gates.releaseLease(decision.node, holder);
    }
  }

  async function handOff(job: Job, decision: Decision, why?: string): Promise<{ state: ActionState; detail: string }> {
    const drained = await drainNode(backend, gates, { node: decision.node, holder: `${decision.id}:${job.id ?? ''}`, reason: decision.reason, auditId: decision.id });
    const now = Date.now();
    const hold = await gates.hold(decision.node, `${HANDED_OFF_REASON}: ${decision.reason}`.slice(0, 500), now + config.handOff.holdSeconds * 1000, now);
    let delivery = 'no webhook configured; the steadfast_node_handed_off alert tells people';
    if (deps.handOff) {
      const result = await deps.handOff.notify({
        version: 1,
        kind: 'steadfast.node.handoff',
        node: decision.node,
        reason: decision.reason,
        decisionId: decision.id,
        time: new Date(now).toISOString(),
        heldUntil: hold.until,
        history: await history.read(decision.node, 20),
      });
      delivery = result.delivered ? result.detail : `webhook failed (${result.detail}); the steadfast_node_handed_off alert still tells people`;
    }
    const detail = `${why ? `${why}; ` : ''}handed off to people: ${drained.already ? 'already out of service' : 'drained'}, held until ${hold.until}; ${delivery}`;
    await remember(decision, 'hand_off', 'done', detail, 'hand_off');
    return record(decision, 'done', detail);
  }

  return async (job, decision) => {
    const previous = (await redis.hget(keys.action(decision.id), 'state')) as ActionState | null;
    if (previous !== null && TERMINAL_STATES.has(previous)) return { state: previous, detail: 'already handled; not acting twice' };
    const admitted = await gates.admit(decision.id, [decision.node]);
    if (!admitted.ok) {
      const refused = await record(decision, 'refused', admitted.reason);
      await releaseRefusedClaim(deps, decision);
      await remember(decision, decision.verb, 'refused', admitted.reason, 'refused');
      await pageOncePerWindow(gates, audit, admitted, { ref: decision.id, what: `${decision.verb} ${decision.node}`, node: decision.node }, deps.onPage);
      return refused;
    }
    try {
      if (decision.verb === 'reset_gpu') return await resetGpu(job, decision);
      if (decision.verb === 'reboot') return await reboot(job, decision);
      return await handOff(job, decision);
    } catch (error) {
      if (error instanceof NodeLeasedError) throw error;
      const final = error instanceof DoNotRetryError || job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
      await record(decision, 'failed', `${errorMessage(error)}${final ? '' : '; will retry'}`, job.attemptsMade).catch((auditError: unknown) =>
        deps.logger.error({ err: auditError }, 'could not record failed action'),
      );
      if (final) {
        await remember(decision, decision.verb, 'failed', errorMessage(error), 'failed').catch((historyError: unknown) =>
          deps.logger.error({ err: historyError }, 'could not record the failed remediation in the node history'),
        );
      }
      if (error instanceof DoNotRetryError) throw new UnrecoverableError(error.message);
      throw error;
    }
  };
}
