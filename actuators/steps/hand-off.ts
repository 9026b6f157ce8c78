import { HANDED_OFF_REASON } from '../../core/remedy.js';
import { drainNode } from '../drain-node.js';
import { admitNodeStep, leaseHolder, recordStep, rememberRemedy, stepNode, type Halt, type StepAt, type StepDeps } from './context.js';

/**
 * The hand_off step, the node ladder's top rung: resets and reboots did not hold, so the node is
 * drained, held out of every pool for `remedies.handOff.holdSeconds`, and people are told — the
 * operator's webhook (remedies.handOff.webhookUrl) with the node's history, and the
 * steadfast_node_handed_off alert either way.
 */
export async function handOff(deps: StepDeps, at: StepAt): Promise<Halt> {
  const admitted = await admitNodeStep(deps, at, stepNode(at), 'hand_off');
  if (!admitted.ok) return admitted.halt;
  return handOffNode(deps, at);
}

/** The hand-off itself, past the gates (also the reboot step's answer where the backend cannot reboot). */
export async function handOffNode(deps: StepDeps, at: StepAt, why?: string): Promise<Halt> {
  const { gates, history } = deps;
  const node = stepNode(at);
  const reason = at.step.reason;
  const drained = await drainNode(deps.backend, gates, { node, holder: leaseHolder(at), reason, auditId: at.transitionId });
  const now = Date.now();
  const hold = await gates.hold(node, `${HANDED_OFF_REASON}: ${reason}`.slice(0, 500), now + deps.remedies.handOff.holdSeconds * 1000, now);
  let delivery = 'no webhook configured; the steadfast_node_handed_off alert tells people';
  if (deps.handOff) {
    const result = await deps.handOff.notify({
      version: 1,
      kind: 'steadfast.node.handoff',
      node,
      reason,
      decisionId: at.transitionId,
      time: new Date(now).toISOString(),
      heldUntil: hold.until,
      history: history ? await history.read(node, 20) : [],
    });
    delivery = result.delivered ? result.detail : `webhook failed (${result.detail}); the steadfast_node_handed_off alert still tells people`;
  }
  const detail = `${why ? `${why}; ` : ''}handed off to people: ${drained.already ? 'already out of service' : 'drained'}, held until ${hold.until}; ${delivery}`;
  await rememberRemedy(deps, at, node, 'hand_off', 'done', detail, 'hand_off');
  await recordStep(deps, at, 'done', detail);
  return undefined;
}
