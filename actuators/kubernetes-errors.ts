import { ApiException } from '@kubernetes/client-node';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../core/errors.js';

/**
 * Where the rule is granted: the ClusterRole (rbac.yaml) for nodes, pod lists and evictions; the
 * Role of each training namespace (rbac-training.yaml) for deleting a workload's pods and reading
 * the workload.
 */
function rbacHint(permission: Permission): string {
  return permission === 'deletecollection pods' || (permission.startsWith('get ') && permission !== 'get nodes')
    ? "see deploy/kubernetes/rbac-training.yaml, applied in the workload's namespace"
    : 'see deploy/kubernetes/rbac.yaml';
}

/** The RBAC rule each call needs, named the way a ClusterRole spells it (`get <resource>.<group>` for workloads). */
export type Permission = 'get nodes' | 'list nodes' | 'patch nodes' | 'list pods' | 'create pods/eviction' | 'deletecollection pods' | `get ${string}`;

export function statusCode(error: unknown): number | undefined {
  return error instanceof ApiException ? error.code : undefined;
}

/** The API server's own sentence from a Status body, when the answer carried one. */
export function serverMessage(error: ApiException<unknown>): string {
  const body: unknown = error.body;
  if (typeof body === 'string') {
    try {
      const status: unknown = JSON.parse(body);
      if (typeof status === 'object' && status !== null && 'message' in status && typeof status.message === 'string') return status.message;
    } catch {
      return body.slice(0, 200);
    }
  }
  return error.message;
}

/** Maps a failed call onto the pipeline's retry classes, naming what was attempted and what was missing. */
export function apiError(error: unknown, action: string, permission: Permission): Error {
  if (!(error instanceof ApiException)) {
    return new RetryLaterError(`Kubernetes API unreachable while trying to ${action}: ${errorMessage(error)}`, error);
  }
  const detail = `${action}: HTTP ${error.code}: ${serverMessage(error)}`;
  if (error.code === 401) return new DoNotRetryError(`Kubernetes API rejected steadfast's credentials (expired or wrong token) trying to ${detail}`);
  if (error.code === 403) {
    return new DoNotRetryError(`steadfast lacks the RBAC permission "${permission}" (${rbacHint(permission)}); forbidden to ${detail}`);
  }
  if (error.code === 409) return new RetryLaterError(`node changed while steadfast was writing it; re-read and retry to ${detail}`, error);
  if (error.code === 408 || error.code === 429 || error.code >= 500) return new RetryLaterError(`Kubernetes API failed to ${detail}`, error);
  return new DoNotRetryError(`Kubernetes API refused to ${detail}`);
}
