import { drainNode } from '../drain-node.js';
import { admitNodeStep, leaseHolder, recordStep, stepNode, type Halt, type StepAt, type StepBase } from './context.js';

/**
 * The drain step, the node ladder's first rung (a node outside any job with a fault it cannot
 * carry work through): pass the gates — pause, the node's hold, the budget — then take the node
 * out through the backend (drain-node.ts: the node's lease, only if it still takes work, checked after).
 */
export async function drain(deps: StepBase, at: StepAt): Promise<Halt> {
  const { backend, gates } = deps;
  const node = stepNode(at);
  const admitted = await admitNodeStep(deps, at, node, 'drain');
  if (!admitted.ok) return admitted.halt;
  const outcome = await drainNode(backend, gates, {
    node,
    holder: leaseHolder(at),
    reason: at.step.reason,
    auditId: at.transitionId,
    ownDrains: deps.ownDrains,
    onDraining: () => recordStep(deps, at, 'running', `draining through ${backend.name}`),
  });
  const { state } = outcome;
  const detail = outcome.already
    ? `already out of service (${state.raw}${state.reason ? `: ${state.reason}` : ''}); nothing to do`
    : `${state.raw}: ${state.reason ?? at.step.reason}`;
  await recordStep(deps, at, 'done', detail);
  return undefined;
}
