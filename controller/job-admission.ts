import { RetryLaterError, InputError, errorMessage } from '../core/errors.js';
import { parseJobSpec, type JobSpec } from '../core/job.js';
import { resolveLauncher, type Launchers } from '../core/launcher.js';
import type { ClusterBackend } from '../actuators/backend.js';

/**
 * What a job registration must pass beyond its own shape: it names one of the operator's
 * launchers, and only nodes the cluster backend knows (Slurm's node list, Kubernetes nodes; the
 * dry-run backend's `backend.dryRun.nodes` when set). A registration is the only way a node name
 * reaches the controller's agent calls, so an unknown one stops here.
 */

/** The backend could not be asked (slurmctld or the API server down): the client may retry. */
export class BackendUnavailableError extends RetryLaterError {
  constructor(message: string, cause?: unknown) {
    super(message, cause);
    this.name = 'BackendUnavailableError';
  }
}

/** Node states asked of the backend at once (each is an sinfo or a GET). */
const NODE_CHECKS_AT_ONCE = 16;

export async function admitJob(body: unknown, deps: { readonly launchers: Launchers; readonly backend: ClusterBackend }): Promise<JobSpec> {
  const { spec } = parseJobSpec(body);
  resolveLauncher(deps.launchers, spec.launcher);
  for (const [field, nodes] of [
    ['nodes', spec.nodes],
    ['hotSwap.spares', spec.hotSwap?.spares ?? []],
  ] as const) {
    const unknown = await unknownNodes(deps.backend, nodes);
    if (unknown.length > 0) {
      const shown = unknown.slice(0, 20).join(', ');
      throw new InputError(
        `job.${field}: not known to the ${deps.backend.name} backend: ${shown}${unknown.length > 20 ? ` and ${unknown.length - 20} more` : ''}`,
        field,
      );
    }
  }
  return spec;
}

/** Those of `nodes` the backend does not know, in their order. */
export async function unknownNodes(backend: ClusterBackend, nodes: readonly string[]): Promise<string[]> {
  const unknown = new Set<string>();
  const queue = [...new Set(nodes)];
  const worker = async (): Promise<void> => {
    for (let node = queue.shift(); node !== undefined; node = queue.shift()) {
      let exists: boolean;
      try {
        exists = (await backend.nodeState(node)).exists;
      } catch (error) {
        throw new BackendUnavailableError(`cannot ask the ${backend.name} backend whether it knows node ${node}: ${errorMessage(error)}`, error);
      }
      if (!exists) unknown.add(node);
    }
  };
  await Promise.all(Array.from({ length: Math.min(NODE_CHECKS_AT_ONCE, queue.length) }, worker));
  return nodes.filter((node) => unknown.has(node));
}
