import type { FastPathEvent } from '../../../core/fast-path-event.js';

/**
 * Tells the controller, on the fast path, that a job trains on this node: a `training_progress`
 * event when a rank of the job records an iteration as its run starts or resumes — the first
 * iteration this agent sees of the rank, an iteration lower than the last (a relaunch resumed
 * from a checkpoint), or one after a pause — and otherwise at most once a minute per job
 * while iterations grow. The controller judges a relaunch by it (controller/progress.ts) without
 * waiting for a Prometheus scrape; between relaunches it costs one small event a minute per job
 * and node.
 */

/** An iteration after this long without one starts a report at once: the run resumed. */
const PAUSE_MS = 10_000;
/** While a job trains on, one report a minute. */
const INTERVAL_MS = 60_000;
/** The ranks of one relaunch start within moments of each other: one report speaks for them. */
const START_BURST_MS = 1000;
/** Ranks not heard from this long are forgotten, so that the table cannot grow without bound. */
const FORGET_AFTER_MS = 3600 * 1000;

interface RankSeen {
  iteration: number;
  at: number;
}

interface JobSeen {
  readonly ranks: Map<number, RankSeen>;
  lastReport: number;
}

export interface ProgressReporterOptions {
  readonly node: string;
  readonly send: (event: FastPathEvent) => void;
}

export class TrainingProgressReporter {
  private readonly jobs = new Map<string, JobSeen>();
  private lastSweep = 0;

  constructor(private readonly options: ProgressReporterOptions) {}

  /** A rank of `job` recorded `iteration` now (not a line replayed from before the agent started). */
  observe(job: string, rank: number, iteration: number, now: Date): void {
    const at = now.getTime();
    this.sweep(at);
    let seen = this.jobs.get(job);
    if (seen === undefined) {
      seen = { ranks: new Map(), lastReport: Number.NEGATIVE_INFINITY };
      this.jobs.set(job, seen);
    }
    const before = seen.ranks.get(rank);
    seen.ranks.set(rank, { iteration, at });
    const started = before === undefined || iteration < before.iteration || at - before.at >= PAUSE_MS;
    const grew = before !== undefined && iteration > before.iteration;
    const due = started ? at - seen.lastReport >= START_BURST_MS : grew && at - seen.lastReport >= INTERVAL_MS;
    if (!due) return;
    seen.lastReport = at;
    this.options.send({
      kind: 'training_progress',
      node: this.options.node,
      job,
      rank,
      iteration,
      message: started ? `rank ${rank} ${before === undefined ? 'trains' : 'resumed'} at iteration ${iteration}` : `rank ${rank} at iteration ${iteration}`,
      time: now.toISOString(),
    });
  }

  private sweep(now: number): void {
    if (now - this.lastSweep < FORGET_AFTER_MS / 4) return;
    this.lastSweep = now;
    for (const [job, seen] of this.jobs) {
      for (const [rank, entry] of seen.ranks) if (now - entry.at > FORGET_AFTER_MS) seen.ranks.delete(rank);
      if (seen.ranks.size === 0) this.jobs.delete(job);
    }
  }
}
