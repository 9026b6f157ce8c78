import type { ActionRecord, ActionState, Decision } from '../core/action.js';
import { CONTROLLER_IDENTITY } from '../core/credentials.js';
import type { AuditLog } from '../core/audit.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import { DoNotRetryError, RetryLaterError } from '../core/errors.js';
import type { ClusterBackend, NodeState } from './backend.js';
import type { GateVerdict, SafetyGates } from './safety.js';

/**
 * Taking one node out of service, the one way both the drain actuator (a node's fault outside a
 * job's ladder) and the recovery actuator (a ladder's evict step) do it. Reconcile, then act
 * (as Kubernetes controllers do): hold the node's lease, look at it, drain only if it still takes work,
 * and check afterwards that the backend really shows it out of service.
 */

/** What the drain and the remedy actuators (drain.ts, remedy.ts) both work with. */
export interface NodeActuatorDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly logger: Logger;
  /** Called once per finished action (metrics, annotations). */
  readonly onFinished?: (record: ActionRecord) => void;
  /**
   * Pages a person (steadfast_human_pages_total) about a refusal: the first refusal of each gate
   * in a budget window pages, later ones are only audited (SafetyGates.claimPage).
   */
  readonly onPage?: (reason: string) => void;
}

/** States after which a decision is not acted on again, whatever redelivers it. */
export const TERMINAL_STATES: ReadonlySet<ActionState> = new Set(['done', 'refused']);

/**
 * Keeps a decision's action state under its id (what a redelivered job reads first), audits it
 * once per state and attempt, and reports a finished one.
 */
export async function recordAction(
  deps: NodeActuatorDeps,
  decision: Decision,
  change: { readonly state: ActionState; readonly detail: string; readonly attempt?: number },
  described: { readonly what: string; readonly data?: Record<string, unknown> },
): Promise<{ state: ActionState; detail: string }> {
  const { state, detail, attempt = 0 } = change;
  const entry: ActionRecord = { decisionId: decision.id, verb: decision.verb, node: decision.node, state, detail, backend: deps.backend.name, time: new Date().toISOString() };
  await deps.redis.hset(deps.keys.action(decision.id), { ...entry });
  await deps.audit.append(
    { type: 'action', ref: decision.id, node: decision.node, summary: `${described.what}: ${state} (${detail})`, data: { ...entry, ...described.data }, actor: decision.origin ?? CONTROLLER_IDENTITY },
    `action:${decision.id}:${state}:${attempt}`,
  );
  if (TERMINAL_STATES.has(state) || state === 'failed') deps.onFinished?.(entry);
  return { state, detail };
}

const DELETE_IF_HELD_BY = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/**
 * A decision the safety gates refused (a hold, a pause, the budget) gives up the node's claim
 * it took in the policy worker, so that the next fault on the node, once the gate opens, is
 * decided and acted on at once instead of joining a decision that never acted. A claim since
 * taken by another decision is left alone.
 */
export async function releaseRefusedClaim(deps: Pick<NodeActuatorDeps, 'redis' | 'keys'>, decision: Decision): Promise<void> {
  await deps.redis.eval(DELETE_IF_HELD_BY, 1, deps.keys.nodeDrainClaim(decision.node), decision.id);
}

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
    await backend.drain(node, `steadfast: ${request.reason} audit=${request.auditId}`);
    const after = await backend.nodeState(node);
    if (!after.drained) throw new RetryLaterError(`${backend.name} still shows ${node} as ${after.raw} after the drain`);
    return { already: false, state: after };
  } finally {
    await gates.releaseLease(node, holder);
  }
}

/** The words a refused drain or eviction is paged and audited with. */
export interface RefusalPage {
  /** The audit ref of the refused decision or step. */
  readonly ref: string;
  /** What was refused, e.g. `drain node-3` or `eviction`. */
  readonly what: string;
  readonly node?: string | undefined;
  /** The training job, when the refusal belongs to one's ladder. */
  readonly job?: string | undefined;
  readonly backend?: string | undefined;
}

/**
 * Pages a person about a refusal, once per gate and budget window: many refusals at once are one
 * incident (a leaf switch down takes a rack's nodes), so later ones are only audited.
 */
export async function pageOncePerWindow(
  gates: SafetyGates,
  audit: AuditLog,
  refusal: Extract<GateVerdict, { ok: false }>,
  page: RefusalPage,
  onPage: ((reason: string) => void) | undefined,
): Promise<void> {
  if (onPage === undefined || !(await gates.claimPage(refusal.gate))) return;
  onPage(refusal.reason);
  await audit.append(
    {
      type: 'action',
      ref: page.ref,
      node: page.node,
      summary: `${page.job === undefined ? '' : `${page.job}: `}page_human: a person is needed: ${page.what} refused (${refusal.reason}); later refusals in this window are audited without paging`,
      data: { job: page.job, verb: 'page_human', state: 'done', detail: refusal.reason, gate: refusal.gate, node: page.node, backend: page.backend },
      actor: CONTROLLER_IDENTITY,
    },
    `action:${page.ref}:page`,
  );
}
