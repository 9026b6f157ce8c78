import type { Redis } from 'ioredis';
import { z } from 'zod';
import { InputError } from '../core/errors.js';
import { dataParallelGroups, parseJobSpec } from '../core/job.js';
import type { Keys } from '../core/redis.js';
import { planMicrobatches } from '../analyzers/microbatch.js';
import type { JobStore } from './job-store.js';

/**
 * The per-DP-group micro-batch assignment a training loop polls before each iteration
 * (`GET /api/v1/jobs/:id/microbatches`). Until fail-slow mitigation rebalances (Greyhound §5.2,
 * S2) every group gets an even share; a rebalance stores the exact plan of
 * analyzers/microbatch.ts with a higher revision, so a loop applies each plan once.
 */

export interface MicrobatchAssignment {
  readonly job: string;
  /** Micro-batches per iteration over all DP groups. */
  readonly microbatches: number;
  readonly dpGroups: number;
  /** Micro-batches for DP group i (its `dp` coordinate), summing to `microbatches`. */
  readonly assignment: number[];
  /** `even` until a fail-slow rebalance; then `rebalanced`. */
  readonly strategy: 'even' | 'rebalanced';
  /** Grows by one with every stored plan. */
  readonly revision: number;
  /** The slowest group's predicted iteration time, when the plan was computed from measured times. */
  readonly iterationSeconds?: number | undefined;
  readonly reason: string;
  readonly updatedAt: string;
}

const storedSchema = z.object({
  assignment: z.array(z.number().int().min(0)),
  strategy: z.enum(['even', 'rebalanced']),
  revision: z.number().int().min(0),
  iterationSeconds: z.number().optional(),
  reason: z.string(),
  updatedAt: z.string(),
});

export class MicrobatchBoard {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly jobs: JobStore,
  ) {}

  private async shape(job: string): Promise<{ microbatches: number; multipleOf: number; dpGroups: number }> {
    const record = await this.jobs.get(job);
    if (!record.spec.microbatches)
      throw new InputError(`job ${job} was registered without microbatches.perIteration, so steadfast cannot assign micro-batches`, 'microbatches');
    const { topology } = parseJobSpec(record.spec);
    return {
      microbatches: record.spec.microbatches.perIteration,
      multipleOf: record.spec.microbatches.multipleOf ?? 1,
      dpGroups: dataParallelGroups(topology),
    };
  }

  async get(job: string): Promise<MicrobatchAssignment> {
    const { microbatches, multipleOf, dpGroups } = await this.shape(job);
    const text = await this.redis.get(this.keys.jobMicrobatches(job));
    const stored = text === null ? undefined : storedSchema.safeParse(JSON.parse(text));
    if (stored?.success && stored.data.assignment.length === dpGroups && stored.data.assignment.reduce((sum, m) => sum + m, 0) === microbatches) {
      return { job, microbatches, dpGroups, ...stored.data };
    }
    // Equal times give the even split that respects the 1F1B multiple.
    const even = planMicrobatches(new Array<number>(dpGroups).fill(1), microbatches, { multipleOf });
    return {
      job,
      microbatches,
      dpGroups,
      assignment: even.assignment,
      strategy: 'even',
      revision: stored?.success ? stored.data.revision : 0,
      reason: 'no rebalance in force',
      updatedAt: new Date(0).toISOString(),
    };
  }

  /** Rebalances from measured seconds per micro-batch of each DP group; returns the stored plan. */
  async rebalance(job: string, secondsPerMicrobatch: readonly number[], reason: string, now = Date.now()): Promise<MicrobatchAssignment> {
    const { microbatches, multipleOf, dpGroups } = await this.shape(job);
    if (secondsPerMicrobatch.length !== dpGroups)
      throw new InputError(`job ${job} has ${dpGroups} DP groups but ${secondsPerMicrobatch.length} times were given`, 'times');
    const plan = planMicrobatches(secondsPerMicrobatch, microbatches, { multipleOf });
    return this.store(job, { assignment: plan.assignment, strategy: 'rebalanced', iterationSeconds: plan.iterationSeconds, reason }, now);
  }

  /** Stores an assignment planned elsewhere (the fail-slow mitigation's S2), after checking it fits the job. */
  async apply(job: string, assignment: readonly number[], reason: string, iterationSeconds?: number, now = Date.now()): Promise<MicrobatchAssignment> {
    const { microbatches, multipleOf, dpGroups } = await this.shape(job);
    const total = assignment.reduce((sum, m) => sum + m, 0);
    if (assignment.length !== dpGroups || total !== microbatches || assignment.some((m) => !Number.isInteger(m) || m < multipleOf || m % multipleOf !== 0)) {
      throw new InputError(
        `assignment [${assignment.join(', ')}] does not give ${microbatches} micro-batches to ${dpGroups} DP groups in multiples of ${multipleOf}`,
        'assignment',
      );
    }
    return this.store(
      job,
      { assignment: [...assignment], strategy: 'rebalanced', ...(iterationSeconds === undefined ? {} : { iterationSeconds }), reason },
      now,
    );
  }

  /** Back to the even split (the slowdown is gone, or the job restarted on other machines). */
  async reset(job: string, reason: string, now = Date.now()): Promise<MicrobatchAssignment> {
    const { microbatches, multipleOf, dpGroups } = await this.shape(job);
    const even = planMicrobatches(new Array<number>(dpGroups).fill(1), microbatches, { multipleOf });
    return this.store(job, { assignment: even.assignment, strategy: 'even', reason }, now);
  }

  private async store(
    job: string,
    plan: { assignment: number[]; strategy: 'even' | 'rebalanced'; iterationSeconds?: number; reason: string },
    now: number,
  ): Promise<MicrobatchAssignment> {
    const current = await this.get(job);
    const next = { ...plan, revision: current.revision + 1, updatedAt: new Date(now).toISOString() };
    await this.redis.set(this.keys.jobMicrobatches(job), JSON.stringify(next));
    return { job, microbatches: current.microbatches, dpGroups: current.dpGroups, ...next };
  }
}
