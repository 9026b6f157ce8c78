import { DoNotRetryError } from '../../core/errors.js';
import { NodeLeasedError } from '../drain-node.js';
import { OWN_REASON_PREFIX, appendOwnReason } from '../drain-reason.js';
import { admitNodeStep, leaseHolder, recordStep, rememberRemedy, stepNode, type Halt, type StepAt } from './context.js';
import { handOffNode, type HandOffDeps } from './hand-off.js';

/**
 * The reboot step, the node ladder's rung above GPU resets: after the gates, ask the backend to
 * reboot the node once it is idle (Slurm: `scontrol reboot ASAP`), holding the node's lease. A
 * backend that cannot reboot hands the node off to people instead; one that still shows the node
 * taking work afterwards did not take the request, and the node is drained so the fault is not
 * left running.
 */
export async function reboot(deps: HandOffDeps, at: StepAt): Promise<Halt> {
  const { backend, gates } = deps;
  const node = stepNode(at);
  const admitted = await admitNodeStep(deps, at, node, 'reboot');
  if (!admitted.ok) return admitted.halt;
  const rebootNode = backend.reboot?.bind(backend);
  if (rebootNode === undefined) return handOffNode(deps, at, `the ${backend.name} backend cannot reboot a node`);
  const holder = leaseHolder(at);
  const lease = await gates.acquireLease(node, holder);
  if (!lease.ok) throw new NodeLeasedError(lease.reason);
  try {
    const before = await backend.nodeState(node);
    if (!before.exists) throw new DoNotRetryError(`node ${node} is unknown to the ${backend.name} backend`);
    // Someone else's drain on the node: the reboot (a remedy) still happens, but the node comes
    // back DOWN, with their reason first, never RESUMEd into service (NVIDIA/NVSentinel#1633).
    const foreign = before.drained ? before.foreign : undefined;
    const validating = foreign === undefined && deps.awaitValidation !== undefined;
    const nextState = foreign !== undefined || validating ? 'down' : deps.remedies.reboot.nextState;
    const reason = appendOwnReason(foreign, `${OWN_REASON_PREFIX} ${at.step.reason} audit=${at.transitionId}`);
    await deps.ownDrains?.record(node, at.transitionId, reason);
    await rebootNode(node, reason, nextState);
    const after = await backend.nodeState(node);
    if (!after.drained) {
      await backend.drain(node, `${reason}; the reboot request was not taken`);
      const detail = `${backend.name} showed ${after.raw} after the reboot request; node drained instead`;
      await rememberRemedy(deps, at, node, 'reboot', 'fell_back', detail, 'reboot');
      await rememberRemedy(deps, at, node, 'drain', 'done', 'after a reboot request that was not taken', 'drain');
      await recordStep(deps, at, 'done', detail);
      return undefined;
    }
    const kept = foreign === undefined ? '' : `; drained by someone else ("${foreign}"): it comes back down, their reason first`;
    // With validation on, a node steadfast alone took out comes back DOWN and returns once validated (actuators/validation-upkeep.ts).
    if (validating) await deps.awaitValidation?.(node, at.transitionId);
    const detail = `reboot requested through ${backend.name} (${after.raw}: once idle, then ${nextState}${validating ? ', validated before it returns' : ''})${kept}`;
    await rememberRemedy(deps, at, node, 'reboot', 'done', detail, 'reboot');
    await recordStep(deps, at, 'done', detail);
    return undefined;
  } finally {
    await gates.releaseLease(node, holder);
  }
}
