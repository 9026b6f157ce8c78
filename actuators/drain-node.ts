import { DoNotRetryError, RetryLaterError } from '../core/errors.js';
import type { ClusterBackend, NodeState } from './backend.js';
import { OWN_REASON_PREFIX } from './drain-reason.js';
import type { OwnDrains } from './own-drains.js';
import type { SafetyGates } from './safety.js';

/**
 * Taking one node out of service, the one way every step that does it does it (drain, evict,
 * hand_off, a reset's fallback). A node already out (by steadfast or by someone else) is left
 * exactly as it is, its reason untouched. Reconcile, then act
 * (as Kubernetes controllers do): hold the node's lease, look at it, drain only if it still takes work,
 * and check afterwards that the backend really shows it out of service.
 */

/** Another actuator holds the node's lease: try again once it is done (not a failure of the drain). */
export class NodeLeasedError extends RetryLaterError {
  constructor(message: string) {
    super(message);
    this.name = 'NodeLeasedError';
  }
}

export interface DrainRequest {
  readonly node: string;
  /** Who holds the node's lease meanwhile (a decision or step id, unique per attempt). */
  readonly holder: string;
  readonly reason: string;
  /** The audit id the backend's drain reason carries, so a person can find why. */
  readonly auditId: string;
  /** Called once the node is known to need a drain, before the backend is asked. */
  readonly onDraining?: () => Promise<void>;
  /** Where steadfast remembers that it took the node out (under `auditId`), so that only it returns the node. */
  readonly ownDrains?: OwnDrains | undefined;
}

export interface DrainOutcome {
  /** True when the node was already out of service and the backend was not asked. */
  readonly already: boolean;
  /** The node's state after the routine: as found when `already`, else after the drain. */
  readonly state: NodeState;
}

/**
 * Drains `request.node` unless it is out of service already. A lease held by another actuator is
 * a NodeLeasedError, a drain the backend does not show afterwards a RetryLaterError, a node the
 * backend does not know a DoNotRetryError.
 */
export async function drainNode(backend: ClusterBackend, gates: SafetyGates, request: DrainRequest): Promise<DrainOutcome> {
  const { node, holder } = request;
  const lease = await gates.acquireLease(node, holder);
  if (!lease.ok) throw new NodeLeasedError(lease.reason);
  try {
    const before = await backend.nodeState(node);
    if (!before.exists) throw new DoNotRetryError(`node ${node} is unknown to the ${backend.name} backend`);
    if (before.drained) return { already: true, state: before };
    await request.onDraining?.();
    const reason = `${OWN_REASON_PREFIX} ${request.reason} audit=${request.auditId}`;
    // Recorded before the drain: a crash between the two leaves a record a later return ignores, never an unrecorded drain.
    await request.ownDrains?.record(node, request.auditId, reason);
    await backend.drain(node, reason, before);
    const after = await backend.nodeState(node);
    if (!after.drained) throw new RetryLaterError(`${backend.name} still shows ${node} as ${after.raw} after the drain`);
    return { already: false, state: after };
  } finally {
    await gates.releaseLease(node, holder);
  }
}
