import { HANDED_OFF_REASON, type HandOffPayload } from '../../core/remedy.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import { drainNode } from '../drain-node.js';
import { admitNodeStep, leaseHolder, recordStep, rememberRemedy, stepNode, type Halt, type StepAt, type StepBase } from './context.js';

/** What a hand-off works with. */
export interface HandOffDeps extends StepBase {
  readonly remedies: RemediesConfig;
  /**
   * Tells the operator's process (remedies.handOff.webhookUrl, with the node's history) and says
   * how that went; without a webhook, says the alert tells people.
   */
  readonly tellHandOff: (notice: Omit<HandOffPayload, 'history'>) => Promise<string>;
  /** With validation on: a rebooted node waits, DOWN, to be validated before it returns (actuators/validation-upkeep.ts). */
  readonly awaitValidation?: ((node: string, decision: string) => Promise<void>) | undefined;
}

/**
 * The hand_off step, the node ladder's top rung: resets and reboots did not hold, so the node is
 * drained, held out of every pool for `remedies.handOff.holdSeconds`, and people are told — the
 * operator's webhook (remedies.handOff.webhookUrl) with the node's history, and the
 * steadfast_node_handed_off alert either way.
 */
export async function handOff(deps: HandOffDeps, at: StepAt): Promise<Halt> {
  const admitted = await admitNodeStep(deps, at, stepNode(at), 'hand_off');
  if (!admitted.ok) return admitted.halt;
  return handOffNode(deps, at);
}

/** The hand-off itself, past the gates (also the reboot step's answer where the backend cannot reboot). */
export async function handOffNode(deps: HandOffDeps, at: StepAt, why?: string): Promise<Halt> {
  const { gates } = deps;
  const node = stepNode(at);
  const reason = at.step.reason;
  const drained = await drainNode(deps.backend, gates, { node, holder: leaseHolder(at), reason, auditId: at.transitionId, ownDrains: deps.ownDrains });
  const now = Date.now();
  const hold = await gates.hold(node, `${HANDED_OFF_REASON}: ${reason}`.slice(0, 500), now + deps.remedies.handOff.holdSeconds * 1000, now);
  const delivery = await deps.tellHandOff({
    version: 1,
    kind: 'steadfast.node.handoff',
    node,
    reason,
    decisionId: at.transitionId,
    time: new Date(now).toISOString(),
    heldUntil: hold.until,
  });
  const detail = `${why ? `${why}; ` : ''}handed off to people: ${drained.already ? 'already out of service' : 'drained'}, held until ${hold.until}; ${delivery}`;
  await rememberRemedy(deps, at, node, 'hand_off', 'done', detail, 'hand_off');
  await recordStep(deps, at, 'done', detail);
  return undefined;
}
