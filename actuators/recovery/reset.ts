import type { GpuResetReport } from '../../core/remedy.js';
import { DryRunGpuResetter } from '../remedy.js';
import { recordStep, stepRef, type Halt, type RecoveryActuatorDeps, type StepAt } from './context.js';
import { evict } from './evict.js';

/**
 * The reset_gpu step: a machine fault on a node of a registered job whose cure is resetting one
 * GPU (the Xid catalogue's remedy). The step passes the gates a drain passes (pause, holds and
 * maintenance windows, the cluster's budget: a reset counts as one) and, the job stopped by the
 * ladder's stop step before it (its processes let go of the GPU), asks the node's agent to reset it (POST /api/v1/gpu-reset). A
 * reset that holds leaves the node in the job and the restart that follows relaunches on the same
 * nodes; one that is refused (processes still on the GPU, persistence mode) or fails makes this
 * step an eviction of the node instead (evict.ts: drain, standby), so the job still restarts.
 * Either way the node's remediation history records it. Dry-run asks no agent.
 */
export async function resetInPlace(deps: RecoveryActuatorDeps, at: StepAt): Promise<Halt> {
  const { step } = at;
  const node = step.nodes?.[0];
  const gpu = step.gpu;
  const asEviction = (): Promise<Halt> => evict(deps, { ...at, step: { ...step, verb: 'evict', nodes: node === undefined ? [] : [node] } });
  if (node === undefined || gpu === undefined || deps.gpuReset === undefined) {
    await recordStep(deps, at, 'done', deps.gpuReset === undefined ? 'no GPU reset configured on this controller; evicting the node instead' : 'no node or GPU named; evicting instead', node);
    return asEviction();
  }
  const ref = stepRef(at);
  const admitted = await deps.gates.admit(ref, [node]);
  if (!admitted.ok) {
    await recordStep(deps, at, 'refused', admitted.reason, node);
    return admitted.reason;
  }
  const resetter = deps.dryRun ? new DryRunGpuResetter() : deps.gpuReset.resetter;
  const report: GpuResetReport = await resetter.reset(node, gpu, deps.gpuReset.timeoutSeconds);
  const held = report.outcome === 'reset';
  await deps.gpuReset.history?.record(
    node,
    { time: new Date().toISOString(), action: 'reset_gpu', outcome: held ? 'done' : 'fell_back', gpu, detail: `job ${step.job}: ${report.reason}`.slice(0, 1024), decisionId: at.transitionId },
    `${ref}:reset`,
  );
  if (held) {
    await recordStep(deps, at, 'done', `GPU ${gpu} of ${node} reset through its agent (${report.reason}); the job relaunches on the same nodes`, node);
    return undefined;
  }
  await recordStep(deps, at, report.outcome === 'refused' ? 'refused' : 'failed', `GPU reset ${report.outcome} (${report.reason}); evicting ${node} instead`, node);
  return asEviction();
}
