import { Counter, Gauge } from 'prom-client';
import { RANK_LABEL, TRAINING_JOB_LABEL } from '../../../core/scrape.js';
import type { CollectorContext } from '../../collector.js';
import { TRAINING_ERROR_KINDS, type TrainingErrorKind } from '../../sources/training-log-failures.js';

/** The training collector's series, shared by the log followers and the push endpoint. */

/** One reading of a training step, from a log line or a push. */
export interface StepReading {
  readonly iteration: number;
  readonly iterationSeconds?: number | undefined;
  readonly losses: Readonly<Record<string, number>>;
  readonly gradNorm?: number | undefined;
  readonly lossScale?: number | undefined;
  readonly learningRate?: number | undefined;
  readonly skippedIterations?: number | undefined;
  readonly nanIterations?: number | undefined;
  readonly samplesPerSecond?: number | undefined;
  readonly tflopsPerGpu?: number | undefined;
}

export interface SeriesLabels {
  readonly job: string;
  readonly rank: string;
}

type Labels = typeof TRAINING_JOB_LABEL | typeof RANK_LABEL;
type LabelValues = Record<Labels, string>;

/** The exported labels of a series: the training job goes out as `training_job`, never `job`. */
function exported(labels: SeriesLabels): LabelValues {
  return { [TRAINING_JOB_LABEL]: labels.job, [RANK_LABEL]: labels.rank };
}

/** Every training series, made once per collector on the agent's registry. */
export class TrainingMetrics {
  private readonly iteration: Gauge<Labels>;
  private readonly iterationSeconds: Gauge<Labels>;
  private readonly iterations: Counter<Labels>;
  private readonly loss: Gauge<Labels | 'loss'>;
  private readonly gradNorm: Gauge<Labels>;
  private readonly lossScale: Gauge<Labels>;
  private readonly learningRate: Gauge<Labels>;
  private readonly skipped: Counter<Labels>;
  private readonly nan: Counter<Labels>;
  private readonly samplesPerSecond: Gauge<Labels>;
  private readonly tflops: Gauge<Labels>;
  private readonly lastIterationTime: Gauge<Labels>;
  private readonly errors: Counter<Labels | 'kind'>;

  constructor(context: CollectorContext) {
    const registers = [context.registry];
    const labelNames = [TRAINING_JOB_LABEL, RANK_LABEL] as const;
    const gauge = (name: string, help: string): Gauge<Labels> => new Gauge({ name, help, labelNames, registers });
    const counter = (name: string, help: string): Counter<Labels> => new Counter({ name, help, labelNames, registers });
    this.iteration = gauge('steadfast_training_iteration', 'Last training iteration reported.');
    this.iterationSeconds = gauge('steadfast_training_iteration_seconds', 'Elapsed time per iteration at the last report.');
    this.iterations = counter('steadfast_training_iterations_total', 'Iteration reports seen (one per Megatron logging interval or push).');
    this.loss = new Gauge({
      name: 'steadfast_training_loss',
      help: 'Last reported loss, by loss name (lm_loss, …); NaN when the loss was NaN.',
      labelNames: [...labelNames, 'loss'],
      registers,
    });
    this.gradNorm = gauge('steadfast_training_grad_norm', 'Last reported gradient norm.');
    this.lossScale = gauge('steadfast_training_loss_scale', 'Last reported mixed-precision loss scale.');
    this.learningRate = gauge('steadfast_training_learning_rate', 'Last reported learning rate.');
    this.skipped = counter('steadfast_training_skipped_iterations_total', 'Iterations skipped (fp16 overflow), summed over the reports.');
    this.nan = counter('steadfast_training_nan_iterations_total', 'Iterations with a NaN loss, summed over the reports.');
    this.samplesPerSecond = gauge('steadfast_training_samples_per_second', 'Last reported training throughput in samples per second.');
    this.tflops = gauge('steadfast_training_tflops_per_gpu', 'Last reported model TFLOP/s per GPU.');
    this.lastIterationTime = gauge(
      'steadfast_training_last_iteration_timestamp_seconds',
      "When the last iteration was reported (the log line's own time when it has one), Unix seconds.",
    );
    this.errors = new Counter({
      name: 'steadfast_training_errors_total',
      help: 'Failures found in a training log, by kind (nccl_timeout, nccl_error, cuda_error, child_failed), under the job and rank of the log.',
      labelNames: [...labelNames, 'kind'],
      registers,
    });
  }

  record(series: SeriesLabels, step: StepReading, time: Date): void {
    const labels = exported(series);
    this.iteration.set(labels, step.iteration);
    this.iterations.inc(labels);
    this.lastIterationTime.set(labels, time.getTime() / 1000);
    setIfGiven(this.iterationSeconds, labels, step.iterationSeconds);
    setIfGiven(this.gradNorm, labels, step.gradNorm);
    setIfGiven(this.lossScale, labels, step.lossScale);
    setIfGiven(this.learningRate, labels, step.learningRate);
    setIfGiven(this.samplesPerSecond, labels, step.samplesPerSecond);
    setIfGiven(this.tflops, labels, step.tflopsPerGpu);
    for (const [loss, value] of Object.entries(step.losses)) this.loss.set({ ...labels, loss }, value);
    // Megatron prints the count for its logging interval; the sum over lines is the run's total.
    if (step.skippedIterations !== undefined && step.skippedIterations >= 0) this.skipped.inc(labels, step.skippedIterations);
    if (step.nanIterations !== undefined && step.nanIterations >= 0) this.nan.inc(labels, step.nanIterations);
  }

  /**
   * A followed log has been read, so "no errors yet" is an observation, not a guess; the zero
   * also lets `increase()` see the first error.
   */
  initialiseErrors(series: SeriesLabels): void {
    const labels = exported(series);
    for (const kind of TRAINING_ERROR_KINDS) this.errors.inc({ ...labels, kind }, 0);
  }

  countError(series: SeriesLabels, kind: TrainingErrorKind): void {
    this.errors.inc({ ...exported(series), kind });
  }

  /** Removes a pushed series that went idle, so that its place can go to a new one. */
  remove(series: SeriesLabels, lossNames: Iterable<string>): void {
    const labels = exported(series);
    for (const metric of [
      this.iteration,
      this.iterationSeconds,
      this.iterations,
      this.gradNorm,
      this.lossScale,
      this.learningRate,
      this.skipped,
      this.nan,
      this.samplesPerSecond,
      this.tflops,
      this.lastIterationTime,
    ]) {
      metric.remove(labels);
    }
    for (const loss of lossNames) this.loss.remove({ ...labels, loss });
  }
}

function setIfGiven(gauge: Gauge<Labels>, labels: LabelValues, value: number | undefined): void {
  if (value !== undefined) gauge.set(labels, value);
}
