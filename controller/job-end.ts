import type { AuditLog } from '../core/audit.js';
import type { Logger } from '../core/log.js';
import type { ClusterBackend } from '../actuators/backend.js';
import { launcherOf } from '../actuators/launcher.js';
import type { JobSpec } from '../core/job.js';
import type { Launchers } from '../core/launcher.js';
import type { JobStore } from './job-store.js';

/**
 * A job whose workload ended by itself or by a person (completed, cancelled; not failed, which
 * is recovery's) is finished: its nodes leave its ladder and it is recovered no more. Asked of
 * `running` jobs only, so a run the ladder itself stopped (the job `recovering`) never counts.
 * True when the job was marked finished now.
 */
export async function finishIfWorkloadEnded(
  deps: { jobs: JobStore; backend: ClusterBackend; launchers: Launchers; audit: AuditLog; logger: Logger },
  spec: JobSpec,
  now: number,
): Promise<boolean> {
  if (!deps.backend.workloadState) return false;
  const job = spec.name;
  const seenBefore = await deps.jobs.workloadSeen(job);
  const workload = await deps.backend.workloadState(job, launcherOf(deps.launchers, spec), seenBefore).catch((error: unknown) => {
    deps.logger.warn({ job, err: error }, "cannot read the state of the job's workload");
    return undefined;
  });
  // Read present once: from then on, not found means deleted, for this controller and the next.
  if (!seenBefore && (workload?.state === 'active' || workload?.state === 'failed' || workload?.state === 'completed'))
    await deps.jobs.markWorkloadSeen(job, now);
  if (workload?.state !== 'completed' && workload?.state !== 'cancelled') return false;
  await deps.jobs.finish(job, workload.detail, now);
  await deps.audit.append(
    {
      type: 'action',
      ref: `finished-${job}`,
      summary: `${job}: finished (${workload.detail}); its nodes leave its recovery ladder`,
      data: { job, verb: 'finish', state: 'done', detail: workload.detail },
    },
    `finished:${job}:${now}`,
  );
  return true;
}
