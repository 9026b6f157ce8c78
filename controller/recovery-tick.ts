import type { ClusterBackend } from '../actuators/backend.js';
import type { AuditLog } from '../core/audit.js';
import type { Config } from '../core/config.js';
import type { Logger } from '../core/log.js';
import { finishIfWorkloadEnded } from './job-end.js';
import { jobMembers, type JobRecord, type JobStore } from './job-store.js';
import type { RecoveryDispatcher } from './policy/recovery-dispatcher.js';
import type { ProgressWatch } from './progress.js';
import { swapEndEvent } from './world-store.js';

/**
 * The recovery tick's part for each registered job, every few seconds: whether its workload
 * ended, whether a restart made progress, whether a hot swap ran past its bound, and time for
 * its ladder. Each part of each job runs on its own: a failure is logged and leaves the rest to
 * run, so held restarts and lazy updates, which wait on the tick, are never starved by one job.
 */
export interface RecoveryTickDeps {
  readonly jobs: JobStore;
  readonly backend: ClusterBackend;
  readonly config: Pick<Config, 'launchers'>;
  readonly audit: AuditLog;
  readonly logger: Logger;
  readonly progress: ProgressWatch | undefined;
  readonly dispatcher: RecoveryDispatcher;
}

/** Ticks every job not finished; the records it read. */
export async function tickJobLadders(deps: RecoveryTickDeps, now: number): Promise<JobRecord[]> {
  const { jobs, backend, config, audit, logger, progress, dispatcher } = deps;
  const part = async <T>(job: string, name: string, work: () => Promise<T>): Promise<T | undefined> => {
    try {
      return await work();
    } catch (error) {
      logger.warn({ job, part: name, err: error }, 'recovery tick of a job failed');
      return undefined;
    }
  };
  const records = (await jobs.list()).filter((record) => record.state !== 'finished');
  for (const record of records) {
    const job = record.spec.name;
    const ended = await part(
      job,
      'finish check',
      async () => record.state === 'running' && (await finishIfWorkloadEnded({ jobs, backend, launchers: config.launchers, audit, logger }, record.spec, now)),
    );
    if (ended === true) continue;
    await part(job, 'progress check', async () => {
      const decided = await progress?.check(job, jobMembers(record), now);
      if (decided === undefined) return;
      const { seen, ...verdict } = decided;
      logger.info({ job, verdict: verdict.event.type, seen }, 'restart judged by training progress');
      await dispatcher.apply(verdict);
    });
    // A hot swap past its bound falls back to stop and relaunch (DeadPool §VI): the ladder hears it.
    await part(job, 'hot swap bound', async () => {
      const late = record.spec.hotSwap ? await jobs.world.overdue(record, now) : undefined;
      if (late) await dispatcher.apply(swapEndEvent(job, 'failed', late, now));
    });
    await part(job, 'tick', () => dispatcher.apply({ job, event: { type: 'tick', time: now }, eventId: `tick:${now}` }));
  }
  return records;
}
