import { z } from 'zod';
import { errorMessage } from '../core/errors.js';
import { instantQuery } from '../core/prometheus.js';
import { equals, series } from '../core/promql.js';
import type { Keys, Redis } from '../core/redis.js';
import { TRAINING_JOB_LABEL } from '../core/scrape.js';
import type { LadderEventJob } from '../core/queues.js';

/**
 * Whether a restarted job trains again: ByteRobust §4.2 judges a restart by whether training
 * resumes, so after a relaunch the controller watches the job's newest iteration in Prometheus
 * (`steadfast_training_iteration`, from the agents' training collector) and reports the restart
 * as succeeded once it grows, or as failed when it has not grown within the timeout.
 */

const awaitingSchema = z.object({ baseline: z.number().nullable(), since: z.number(), eventId: z.string() });

export class ProgressWatch {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly prometheusUrl: string,
    private readonly timeoutMs: number,
  ) {}

  /** The job's newest iteration over all its ranks, or null when Prometheus has none. */
  async iteration(job: string): Promise<number | null> {
    const [sample] = await instantQuery(this.prometheusUrl, `max(${series('steadfast_training_iteration', equals(TRAINING_JOB_LABEL, job))})`);
    return sample === undefined ? null : sample.value;
  }

  /** Starts watching a restart that was just launched. */
  async watch(job: string, eventId: string, now = Date.now()): Promise<void> {
    let baseline: number | null = null;
    try {
      baseline = await this.iteration(job);
    } catch {
      baseline = null; // Prometheus unreachable now: any iteration seen later counts as progress.
    }
    await this.redis.set(this.keys.jobAwaitingProgress(job), JSON.stringify({ baseline, since: now, eventId }));
  }

  /** Checks a watched restart; returns the ladder event to feed, if it is decided. */
  async check(job: string, now = Date.now()): Promise<LadderEventJob | undefined> {
    const raw = await this.redis.get(this.keys.jobAwaitingProgress(job));
    if (raw === null) return undefined;
    const awaiting = awaitingSchema.parse(JSON.parse(raw));
    let current: number | null = null;
    let detail = '';
    try {
      current = await this.iteration(job);
    } catch (error) {
      detail = `; Prometheus: ${errorMessage(error)}`;
    }
    const progressed = current !== null && (awaiting.baseline === null || current > awaiting.baseline);
    if (!progressed && now - awaiting.since < this.timeoutMs) return undefined;
    await this.redis.del(this.keys.jobAwaitingProgress(job));
    return progressed
      ? { job, event: { type: 'restart_succeeded', time: now }, eventId: `${awaiting.eventId}:progress` }
      : { job, event: { type: 'restart_failed', time: now, detail: `no new iteration within ${Math.round(this.timeoutMs / 1000)} s of the restart${detail}` }, eventId: `${awaiting.eventId}:no-progress` };
  }
}
