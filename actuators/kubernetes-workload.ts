import { CustomObjectsApi } from '@kubernetes/client-node';
import { z } from 'zod';
import type { Launcher } from '../core/launcher.js';
import type { WorkloadState } from './backend.js';
import { apiError, statusCode } from './kubernetes-errors.js';

/**
 * How a workload kind says that it ended: the condition types (status "True") of a completed and
 * of a failed run. Anything else (Created, Running, Restarting, Suspended, no condition yet) is
 * still `active`: a suspended or restarting workload has not ended.
 */
interface WorkloadKind {
  readonly group: string;
  readonly version: string;
  readonly plural: string;
  readonly completed: string;
  readonly failed: readonly string[];
}

/** The kinds steadfast reads, keyed by the `<resource>` of a launcher's `workload`; the RBAC rules name the same. */
export const WORKLOAD_KINDS: Readonly<Record<string, WorkloadKind>> = {
  // batch/v1 Job: FailureTarget comes before Failed while the last pods are terminated.
  'jobs.batch': { group: 'batch', version: 'v1', plural: 'jobs', completed: 'Complete', failed: ['Failed', 'FailureTarget'] },
  // Kubeflow training-operator v1 (PyTorchJob): Created, Running, Restarting, Succeeded, Suspended, Failed.
  'pytorchjobs.kubeflow.org': { group: 'kubeflow.org', version: 'v1', plural: 'pytorchjobs', completed: 'Succeeded', failed: ['Failed'] },
  // Kubeflow Trainer (TrainJob): Created, Suspended, Complete, Failed.
  'trainjobs.trainer.kubeflow.org': { group: 'trainer.kubeflow.org', version: 'v1alpha1', plural: 'trainjobs', completed: 'Complete', failed: ['Failed'] },
};

/** Only what is read of a workload; the rest of the object is not steadfast's business. */
const workloadSchema = z.object({
  status: z
    .object({
      conditions: z.array(z.object({ type: z.string(), status: z.string(), reason: z.string().optional(), message: z.string().optional() })).optional(),
    })
    .optional(),
});

/**
 * Reads whether the workload a Kubernetes launcher names has ended. A workload that is not found
 * counts as ended (deleted by a person, or by its ttlSecondsAfterFinished) only when it was seen
 * present before (`seenBefore`, which the caller keeps where a controller restart does not lose
 * it): one not found from the start may not have been created yet.
 */
export class KubernetesWorkloads {
  constructor(private readonly api: CustomObjectsApi) {}

  async state(job: string, launcher: Launcher | undefined, seenBefore = false): Promise<WorkloadState> {
    if (launcher?.kind !== 'kubernetes') return { state: 'unknown', detail: `job ${job} has no Kubernetes launcher naming its workload` };
    const [resource = '', name = ''] = launcher.workload.split('/');
    const kind = Object.hasOwn(WORKLOAD_KINDS, resource) ? WORKLOAD_KINDS[resource] : undefined;
    if (kind === undefined) {
      return { state: 'unknown', detail: `steadfast cannot read the end of ${resource} workloads (it reads ${Object.keys(WORKLOAD_KINDS).join(', ')})` };
    }
    const where = `${resource} ${launcher.namespace}/${name}`;
    let body: unknown;
    try {
      // One untyped read for every kind: the CRDs have no typed client, and only conditions are read.
      body = await this.api.getNamespacedCustomObject({ group: kind.group, version: kind.version, namespace: launcher.namespace, plural: kind.plural, name });
    } catch (error) {
      if (statusCode(error) !== 404) throw apiError(error, `get ${where}`, `get ${resource}`);
      if (!seenBefore) return { state: 'unknown', detail: `${where} not found (not created yet, or deleted before steadfast saw it)` };
      return { state: 'cancelled', detail: `${where} was deleted` };
    }
    const parsed = workloadSchema.safeParse(body);
    if (!parsed.success) return { state: 'unknown', detail: `${where}: unreadable status (${parsed.error.issues[0]?.message ?? 'invalid'})` };
    const holding = (parsed.data.status?.conditions ?? []).filter((condition) => condition.status === 'True');
    const failed = kind.failed.map((type) => holding.find((condition) => condition.type === type)).find((condition) => condition !== undefined);
    if (failed) return { state: 'failed', detail: `${where} is ${failed.type}${failed.reason ? ` (${failed.reason})` : ''}` };
    const completed = holding.find((condition) => condition.type === kind.completed);
    if (completed) return { state: 'completed', detail: `${where} is ${completed.type}` };
    const now = holding.map((condition) => condition.type);
    return { state: 'active', detail: `${where} is ${now.length > 0 ? now.join(', ') : 'without conditions yet'}` };
  }
}
