import { DoNotRetryError } from '../core/errors.js';
import type { ClusterBackend, NodeState } from './backend.js';
import type { OwnDrains } from './own-drains.js';

/**
 * The one way steadfast puts a node back into service — after a GPU reset it took the node out
 * for, after a reboot, on `steadfast resume` — so that every such path keeps others' drains
 * (NVIDIA/NVSentinel#1424, #1633): a node an administrator, another tool or Slurm's health check
 * drained or cordoned stays exactly as they left it. Only steadfast's own part is removed
 * (Slurm: their reason stays, the node stays drained; Kubernetes: steadfast's taint and
 * annotations go, their cordon stays). A return after steadfast's own remedy also needs Redis to
 * say that this very decision took the node out, since a reason string alone can be rewritten.
 */

export interface ReturnRequest {
  /**
   * The decision that took the node out. Given (a remedy returning what it took out), the node
   * goes back only when the own-drain record names this decision; left out (an operator's
   * `steadfast resume`), the record is not asked for.
   */
  readonly decisionId?: string | undefined;
  /** Lift someone else's drain too (`steadfast resume --force`, audited by the caller). */
  readonly force?: boolean | undefined;
}

export type ReturnOutcome =
  /** Back in service (`already`: it was in service before). `liftedForeign`: someone else's drain lifted with --force. */
  | { readonly returned: true; readonly already: boolean; readonly before: NodeState; readonly liftedForeign?: string | undefined }
  /** Left out of service: `why` names whose drain it is (`foreign`: their reason, kept). */
  | { readonly returned: false; readonly before: NodeState; readonly why: string; readonly foreign?: string | undefined };

export interface ReturnToServiceDeps {
  readonly backend: ClusterBackend;
  /** Where steadfast remembers the nodes it took out; without it (no Redis) only the scheduler's reason decides. */
  readonly ownDrains?: OwnDrains | undefined;
}

/**
 * Returns `node` to service when steadfast's drain is the only one (or `force`), else removes
 * only steadfast's part. Says what it did; a node the backend does not know is a DoNotRetryError.
 */
export async function returnToService(deps: ReturnToServiceDeps, node: string, request: ReturnRequest = {}): Promise<ReturnOutcome> {
  const { backend, ownDrains } = deps;
  const before = await backend.nodeState(node);
  if (!before.exists) throw new DoNotRetryError(`node ${node} is unknown to the ${backend.name} backend`);
  if (!before.drained) {
    await ownDrains?.forget(node);
    return { returned: true, already: true, before };
  }
  if (before.foreign !== undefined && request.force !== true) {
    // The backend's resume takes steadfast's part away and leaves theirs (ClusterBackend.resume).
    await backend.resume(node);
    await ownDrains?.forget(node);
    return { returned: false, before, foreign: before.foreign, why: `${node} is also out of service by someone else (${before.foreign}); their drain is kept` };
  }
  if (request.decisionId !== undefined && request.force !== true && ownDrains !== undefined) {
    const own = await ownDrains.get(node);
    if (own?.decisionId !== request.decisionId) {
      const why =
        own === undefined
          ? `steadfast has no record of taking ${node} out; it stays as it is`
          : `${node} was taken out by decision ${own.decisionId}, not ${request.decisionId}; it stays out`;
      return { returned: false, before, why };
    }
  }
  await backend.resume(node, { force: request.force === true });
  await ownDrains?.forget(node);
  return { returned: true, already: false, before, liftedForeign: before.foreign };
}
