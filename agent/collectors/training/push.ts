import { z } from 'zod';
import type { Logger } from '../../../core/log.js';
import { MAX_TRAINING_RANK, TRAINING_JOB_PATTERN, TRAINING_JOB_RULE } from '../../../core/names.js';
import { describeIssues } from '../../../core/validate.js';
import type { AgentRequest, AgentResponse, AgentRoute } from '../../collector.js';
import { normaliseLossKey } from '../../sources/megatron-log.js';
import type { StepReading, TrainingMetrics } from './metrics.js';
import type { TrainingProgressReporter } from './progress.js';

/**
 * `POST /api/v1/training`: a training loop pushes its own step metrics (one step or an array),
 * into the same series as the followed logs. Distinct (job, rank) pairs are bounded by
 * --training.max-jobs; a full table answers 429 unless a pair has been idle for an hour.
 */

export const TRAINING_ROUTE_PATH = '/api/v1/training';
export const TRAINING_MAX_JOBS_FLAG = 'training.max-jobs';
/** A pushed series idle this long is dropped when a new one needs its place under --training.max-jobs. */
const IDLE_PUSHED_SERIES_MS = 60 * 60 * 1000;
/** Largest number of steps in one POST. */
const MAX_STEPS_PER_PUSH = 1000;
/** Loss names one series may carry, so that a pushing loop cannot explode the `loss` label. */
const MAX_LOSS_NAMES = 16;

const NON_FINITE = /^[+-]?(nan|inf|infinity)$/i;
/** JSON has no NaN: a loop may send `"nan"` (Python's `str(float('nan'))`), `"inf"` or `"-inf"`. */
const floatSchema = z.union([z.number(), z.string().regex(NON_FINITE)], { error: 'must be a number, or "nan", "inf" or "-inf"' }).transform((value) => {
  if (typeof value === 'number') return value;
  if (/nan/i.test(value)) return Number.NaN;
  return value.startsWith('-') ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY;
});
const countSchema = z.number().int().min(0).max(Number.MAX_SAFE_INTEGER);
const nonNegativeSchema = z.number().min(0);
const lossNameSchema = z
  .string()
  .max(64)
  .refine((name) => normaliseLossKey(name) !== '', 'loss names need a letter or digit');

export const trainingStepSchema = z
  .object({
    job: z.string().regex(TRAINING_JOB_PATTERN, `must be ${TRAINING_JOB_RULE}`),
    rank: z.number().int().min(0).max(MAX_TRAINING_RANK),
    iteration: countSchema,
    iteration_seconds: nonNegativeSchema.optional(),
    loss: z
      .union([floatSchema, z.record(lossNameSchema, floatSchema)], { error: 'must be a number or an object of loss name → number' })
      .refine((loss) => typeof loss === 'number' || Object.keys(loss).length <= MAX_LOSS_NAMES, `at most ${MAX_LOSS_NAMES} loss names`)
      .optional(),
    grad_norm: floatSchema.optional(),
    loss_scale: nonNegativeSchema.optional(),
    learning_rate: nonNegativeSchema.optional(),
    samples_per_second: nonNegativeSchema.optional(),
    tflops_per_gpu: nonNegativeSchema.optional(),
    skipped: countSchema.optional(),
    nan: countSchema.optional(),
  })
  .strict();

export type TrainingStep = z.output<typeof trainingStepSchema>;

function stepReading(step: TrainingStep): StepReading {
  const losses: Record<string, number> = {};
  if (typeof step.loss === 'number') losses.loss = step.loss;
  else if (step.loss) for (const [name, value] of Object.entries(step.loss)) losses[normaliseLossKey(name)] = value;
  return {
    iteration: step.iteration,
    iterationSeconds: step.iteration_seconds,
    losses,
    gradNorm: step.grad_norm,
    lossScale: step.loss_scale,
    learningRate: step.learning_rate,
    skippedIterations: step.skipped,
    nanIterations: step.nan,
    samplesPerSecond: step.samples_per_second,
    tflopsPerGpu: step.tflops_per_gpu,
  };
}

interface PushedSeries {
  lastPush: number;
  readonly lossNames: Set<string>;
}

/** Series that training loops pushed, bounded by --training.max-jobs. */
export class PushedSteps {
  private readonly series = new Map<string, PushedSeries>();

  constructor(
    private readonly metrics: TrainingMetrics,
    private readonly progress: TrainingProgressReporter,
    private readonly maxSeries: number,
    private readonly clock: () => Date,
    private readonly logger: Logger,
  ) {}

  readonly route: AgentRoute = {
    method: 'POST',
    path: TRAINING_ROUTE_PATH,
    handle: (request) => Promise.resolve(this.handle(request)),
  };

  private handle(request: AgentRequest): AgentResponse {
    const batch = Array.isArray(request.body);
    const items: readonly unknown[] = Array.isArray(request.body) ? request.body : [request.body];
    if (batch && (items.length === 0 || items.length > MAX_STEPS_PER_PUSH)) {
      return { status: 400, body: { error: `invalid training steps: an array needs 1 to ${MAX_STEPS_PER_PUSH} steps, got ${items.length}` } };
    }
    const steps: TrainingStep[] = [];
    for (const [index, item] of items.entries()) {
      const parsed = trainingStepSchema.safeParse(item);
      if (!parsed.success) {
        return { status: 400, body: { error: `invalid training step: ${describeIssues(parsed.error.issues, batch ? `[${index}]` : '')}` } };
      }
      steps.push(parsed.data);
    }
    // All or nothing: a refused batch changes no series.
    const tooManyNames = this.lossNamesOverCap(steps);
    if (tooManyNames !== undefined) return { status: 400, body: { error: `invalid training step: loss: ${tooManyNames}` } };
    const now = this.clock();
    const fresh = [...new Set(steps.map((step) => seriesKey(step)).filter((key) => !this.series.has(key)))];
    const room = this.maxSeries - this.series.size;
    if (fresh.length > room) this.evictIdle(now.getTime(), fresh.length - room);
    if (fresh.length > this.maxSeries - this.series.size) {
      return {
        status: 429,
        body: {
          error: `too many training series: at most ${this.maxSeries} (job, rank) pairs may push (--${TRAINING_MAX_JOBS_FLAG}); ${this.series.size} are in use`,
        },
      };
    }
    for (const step of steps) {
      const labels = { job: step.job, rank: String(step.rank) };
      const reading = stepReading(step);
      const key = seriesKey(step);
      const entry = this.series.get(key) ?? { lastPush: 0, lossNames: new Set<string>() };
      entry.lastPush = now.getTime();
      for (const name of Object.keys(reading.losses)) entry.lossNames.add(name);
      this.series.set(key, entry);
      this.metrics.record(labels, reading, now);
      this.progress.observe(step.job, step.rank, step.iteration, now);
    }
    return { status: 202, body: { accepted: steps.length } };
  }

  /**
   * The cap on loss names holds per (job, rank) over its whole life, not per push: otherwise a loop
   * pushing a new name each step would grow the `loss` label without bound. Says why when a batch
   * would break it.
   */
  private lossNamesOverCap(steps: readonly TrainingStep[]): string | undefined {
    const after = new Map<string, Set<string>>();
    for (const step of steps) {
      const key = seriesKey(step);
      const names = after.get(key) ?? new Set(this.series.get(key)?.lossNames);
      for (const name of Object.keys(stepReading(step).losses)) names.add(name);
      if (names.size > MAX_LOSS_NAMES) {
        const known = this.series.get(key)?.lossNames.size ?? 0;
        return `at most ${MAX_LOSS_NAMES} loss names per (job, rank); ${step.job} rank ${step.rank} has ${known} already and this push would make ${names.size}`;
      }
      after.set(key, names);
    }
    return undefined;
  }

  /** Drops up to `wanted` series idle for over an hour, oldest first. */
  private evictIdle(now: number, wanted: number): void {
    const idle = [...this.series.entries()].filter(([, entry]) => now - entry.lastPush > IDLE_PUSHED_SERIES_MS).sort(([, a], [, b]) => a.lastPush - b.lastPush);
    for (const [key, entry] of idle.slice(0, wanted)) {
      this.series.delete(key);
      const [job = '', rank = ''] = key.split('\u0000');
      this.metrics.remove({ job, rank }, entry.lossNames);
      this.logger.info({ job, rank }, 'idle pushed training series dropped to make room');
    }
  }
}

function seriesKey(step: { job: string; rank: number }): string {
  return `${step.job}\u0000${step.rank}`;
}
