import { stat } from 'node:fs/promises';
import { InputError, errorMessage } from '../../../core/errors.js';
import type { Logger } from '../../../core/log.js';
import { MAX_TRAINING_RANK, TRAINING_JOB_PATTERN, TRAINING_JOB_RULE } from '../../../core/names.js';
import type { AgentRoute, Collector, CollectorContext, CollectorFactory } from '../../collector.js';
import { readFlag, readFlagList, type CollectorSettings } from '../../flags.js';
import { errnoCode, LogFollower } from '../../log-follower.js';
import { parseIterationLine } from '../../sources/megatron-log.js';
import { TrainingErrorParser, type TrainingErrorReport } from '../../sources/training-log-failures.js';
import { TrainingMetrics, type SeriesLabels } from './metrics.js';
import { TrainingProgressReporter } from './progress.js';
import { PushedSteps, TRAINING_MAX_JOBS_FLAG, TRAINING_ROUTE_PATH } from './push.js';

export { TRAINING_MAX_JOBS_FLAG, TRAINING_ROUTE_PATH, trainingStepSchema, type TrainingStep } from './push.js';

/**
 * The `training` collector: training progress per job and rank, from Megatron logs the agent
 * follows (`--training.log`) and from step metrics a training loop pushes itself
 * (`POST /api/v1/training`). NCCL watchdog timeouts and torchrun worker failures found in a log
 * also go to the controller on the fast path. With neither configured it exports nothing.
 */

export const TRAINING_LOG_FLAG = 'training.log';
const DEFAULT_MAX_JOBS = 64;

export interface TrainingCollectorOptions {
  /** How often a followed log is checked for new data (inotify wakes it sooner). */
  readonly followIntervalMs?: number;
  /**
   * How long a log must stay quiet before a multi-line report still open (a torchrun summary
   * cut short, an agent failure line with no summary after it) is reported as it stands.
   */
  readonly reportQuietMs?: number;
  /** Wall clock; tests pass a fixed one. */
  readonly clock?: () => Date;
}

// Megatron prints one line per logging interval (seconds to minutes); a second's delay costs nothing.
const DEFAULT_FOLLOW_INTERVAL_MS = 1000;
// torchrun prints its summary in one go, right after the agent's `failed (exitcode …)` line.
const DEFAULT_REPORT_QUIET_MS = 2000;

export interface TrainingLogSource {
  readonly job: string;
  readonly rank: string;
  readonly path: string;
}

/** Reads `--training.log <job>[:<rank>]=<file>` values. Throws InputError naming the flag. */
export function parseTrainingLogFlags(values: readonly string[]): TrainingLogSource[] {
  const flag = `--${TRAINING_LOG_FLAG}`;
  const seen = new Set<string>();
  return values.map((entry) => {
    const match = /^([^=:]+)(?::([^=]*))?=(.+)$/.exec(entry);
    if (!match) throw new InputError(`${flag}: expected <job>=<file> or <job>:<rank>=<file>, got "${entry}"`, flag);
    const [, job = '', rank = '0', path = ''] = match;
    if (!TRAINING_JOB_PATTERN.test(job)) throw new InputError(`${flag}: job "${job}" must be ${TRAINING_JOB_RULE}`, flag);
    if (!/^\d{1,8}$/.test(rank) || Number(rank) > MAX_TRAINING_RANK)
      throw new InputError(`${flag}: rank "${rank}" must be a whole number from 0 to ${MAX_TRAINING_RANK}`, flag);
    const normalisedRank = String(Number(rank));
    const key = `${job}:${normalisedRank}`;
    if (seen.has(key)) throw new InputError(`${flag}: job ${job} rank ${normalisedRank} is given twice`, flag);
    seen.add(key);
    return { job, rank: normalisedRank, path };
  });
}

/** Reads `--training.max-jobs <n>`. Throws InputError naming the flag. */
function readMaxJobsFlag(settings: CollectorSettings): number {
  return readFlag(settings, TRAINING_MAX_JOBS_FLAG, { type: 'number', whole: true, min: 1, max: 999_999 }, DEFAULT_MAX_JOBS);
}

/** One followed Megatron log: its parser, its follower and the reports it owes the fast path. */
class FollowedLog {
  private readonly follower: LogFollower;
  private readonly errors = new TrainingErrorParser();
  private readonly labels: SeriesLabels;
  private readonly logger: Logger;
  /**
   * True while the content present at start is read. Its metrics are taken (so that they show
   * the last line and counters match the file), but its failures are not sent on the fast path:
   * the file may hold a failure from hours ago that the controller has handled already, and the
   * controller would take a resend for a new fault (its signal id includes the event time).
   */
  private replaying = true;
  /**
   * When a line read at start, without a timestamp of its own, was written: the file's last
   * change is the closest bound we have. The read time would make a run that stalled hours ago
   * look fresh after every agent restart.
   */
  private replayTime: Date | undefined;
  private quietTimer: NodeJS.Timeout | undefined;
  private errorsInitialised = false;

  constructor(
    readonly source: TrainingLogSource,
    private readonly context: CollectorContext,
    private readonly metrics: TrainingMetrics,
    private readonly progress: TrainingProgressReporter,
    private readonly options: Required<TrainingCollectorOptions>,
  ) {
    this.labels = { job: source.job, rank: source.rank };
    this.logger = context.logger.child({ collector: 'training', job: source.job, rank: source.rank });
    this.follower = new LogFollower(source.path, options.followIntervalMs, (line) => this.handleLine(line), this.logger, 'training log');
  }

  get lastError(): Error | undefined {
    return this.follower.lastError;
  }

  async start(): Promise<void> {
    this.replayTime = await stat(this.source.path).then(
      (info) => info.mtime,
      // The follower reports an unreadable log; nothing is replayed then.
      () => undefined,
    );
    await this.follower.start();
    // Everything present at start is complete: a report still open there will not grow.
    for (const report of this.errors.flush()) this.handleReport(report);
    this.replaying = false;
    if (this.follower.lastError === undefined) this.initialiseErrors();
  }

  async close(): Promise<void> {
    if (this.quietTimer) clearTimeout(this.quietTimer);
    this.quietTimer = undefined;
    await this.follower.close();
  }

  private initialiseErrors(): void {
    if (this.errorsInitialised) return;
    this.errorsInitialised = true;
    this.metrics.initialiseErrors(this.labels);
  }

  private handleLine(line: string): void {
    this.initialiseErrors();
    const step = parseIterationLine(line);
    if (step) this.metrics.record(this.labels, step, step.timestamp ?? (this.replaying ? this.replayTime : undefined) ?? this.options.clock());
    // Lines read at start are history: only a line written since says the job trains now.
    if (step && !this.replaying) this.progress.observe(this.source.job, Number(this.source.rank), step.iteration, this.options.clock());
    for (const report of this.errors.push(line)) this.handleReport(report);
    if (!this.replaying) this.armQuietTimer();
  }

  private armQuietTimer(): void {
    if (this.quietTimer) clearTimeout(this.quietTimer);
    this.quietTimer = undefined;
    if (!this.errors.pending) return;
    this.quietTimer = setTimeout(() => {
      this.quietTimer = undefined;
      for (const report of this.errors.flush()) this.handleReport(report);
    }, this.options.reportQuietMs);
    this.quietTimer.unref();
  }

  private handleReport(report: TrainingErrorReport): void {
    this.metrics.countError(this.labels, report.kind);
    const rank = 'rank' in report && report.rank !== undefined ? report.rank : Number(this.source.rank);
    this.logger.warn({ kind: report.kind, failedRank: rank, message: report.message, replay: this.replaying }, 'training failure in log');
    if (this.replaying) return;
    if (report.kind !== 'nccl_timeout' && report.kind !== 'child_failed') return;
    this.context.fastPath({
      kind: report.kind === 'nccl_timeout' ? 'nccl_timeout' : 'worker_failed',
      node: this.context.node,
      job: this.source.job,
      rank,
      message: report.message,
      time: this.options.clock().toISOString(),
    });
  }
}

// ---------------------------------------------------------------------------------------------

class TrainingCollector implements Collector {
  readonly name = 'training';
  readonly routes: readonly AgentRoute[];
  private readonly logs: readonly FollowedLog[];
  private started: Promise<void> | undefined;

  constructor(context: CollectorContext, options: Required<TrainingCollectorOptions>) {
    const sources = parseTrainingLogFlags(readFlagList(context.settings, TRAINING_LOG_FLAG));
    const maxJobs = readMaxJobsFlag(context.settings);
    const metrics = new TrainingMetrics(context);
    const progress = new TrainingProgressReporter({ node: context.node, send: (event) => context.fastPath(event) });
    this.logs = sources.map((source) => new FollowedLog(source, context, metrics, progress, options));
    const pushed = new PushedSteps(metrics, progress, maxJobs, options.clock, context.logger.child({ collector: this.name }));
    this.routes = [pushed.route];
  }

  start(): Promise<void> {
    this.started ??= Promise.all(this.logs.map((log) => log.start())).then(() => undefined);
    return this.started;
  }

  async update(): Promise<void> {
    if (!this.started) throw new Error('training collector was not started');
    // A log that does not exist yet belongs to a job that has not started: waiting, not failing.
    const broken = this.logs.filter((log) => log.lastError !== undefined && errnoCode(log.lastError) !== 'ENOENT');
    if (broken.length > 0) {
      throw new Error(broken.map((log) => `cannot read training log ${log.source.path} (job ${log.source.job}): ${errorMessage(log.lastError)}`).join('; '));
    }
  }

  async close(): Promise<void> {
    await Promise.all(this.logs.map((log) => log.close()));
  }
}

/** Throws InputError naming the flag when a --training.* value is malformed. */
export function createTrainingCollector(context: CollectorContext, options: TrainingCollectorOptions = {}): Collector {
  return new TrainingCollector(context, {
    followIntervalMs: options.followIntervalMs ?? DEFAULT_FOLLOW_INTERVAL_MS,
    reportQuietMs: options.reportQuietMs ?? DEFAULT_REPORT_QUIET_MS,
    clock: options.clock ?? (() => new Date()),
  });
}

export const trainingCollectorFactory: CollectorFactory = {
  name: 'training',
  defaultEnabled: true,
  help: `Training progress per job and rank from Megatron logs (--${TRAINING_LOG_FLAG}) and from steps POSTed to ${TRAINING_ROUTE_PATH}; NCCL timeouts and worker failures go on the fast path.`,
  flags: [
    {
      name: TRAINING_LOG_FLAG,
      value: '<job>[:<rank>]=<file>',
      description: 'follow this Megatron-LM / Megatron-DeepSpeed log for the job; <rank> is the rank that writes it (default 0)',
      repeatable: true,
    },
    {
      name: TRAINING_MAX_JOBS_FLAG,
      value: '<n>',
      description: `most distinct (job, rank) series that may push to ${TRAINING_ROUTE_PATH}; more are answered 429`,
      default: String(DEFAULT_MAX_JOBS),
    },
  ],
  create: (context) => createTrainingCollector(context),
};
