import type { Redis } from 'ioredis';
import { z } from 'zod';
import type { AuditLog } from '../../core/audit.js';
import { dataParallelGroups, parseJobSpec, type JobSpec } from '../../core/job.js';
import { instantQuery } from '../../core/prometheus.js';
import { selector } from '../../core/promql.js';
import type { Keys } from '../../core/redis.js';
import { TRAINING_JOB_LABEL } from '../../core/scrape.js';
import type { Topology } from '../../core/topology.js';
import { RankSlowdownTracker, median, type ChangePoint } from '../slowdown-tracker.js';
import { initialMitigationState, stepMitigation, type MitigationConfig, type MitigationState, type MitigationStep } from '../failslow/mitigation.js';
import type { LadderEventJob } from '../../core/queues.js';

/**
 * Online fail-slow detection and mitigation for every registered job (Greyhound §4–5).
 *
 * Each check reads every rank's last iteration time and iteration number from Prometheus
 * (`steadfast_training_iteration_seconds` / `steadfast_training_iteration`, the training
 * collector's series) and feeds each new iteration to that rank's BOCD tracker with the 10 %
 * verification. While a verified slow-down persists, the S1–S4 mitigation is stepped once per new
 * iteration batch; its actions are carried out here:
 * - S2: the micro-batch assignment it plans is stored for the training loop
 *   (GET /api/v1/jobs/:id/microbatches);
 * - S3: its topology plan (straggler consolidation, DP↔PP link swap) is put on record for the
 *   launcher, which applies rank placement at the next restart;
 * - S4: the slow ranks' machines go to the recovery ladder as a machine fault: checkpoint, evict,
 *   restart on warm standbys (ByteRobust §4.1 / §6.2 do the rest);
 * - recovery: everything back to even.
 *
 * Localising a straggler needs per-rank times that differ: ranks should report their own
 * compute time per iteration (Greyhound §4.3), not the synchronous wall time every rank shares.
 *
 * Trackers live in memory (a restarted controller re-learns in a few dozen iterations); the
 * mitigation state lives in Redis. One controller replica runs this (see controller/service.ts, the leader).
 */

interface JobWatch {
  readonly trackers: Map<number, RankSlowdownTracker>;
  readonly lastIteration: Map<number, number>;
  readonly currentSeconds: Map<number, number>;
  /** Each rank's last iteration time divided by its DP group's micro-batches: what the trackers see. */
  readonly perMicrobatch: Map<number, number>;
  /** The slowest rank's iteration number at the last mitigation step. */
  steppedAt: number | undefined;
}

/**
 * Where the job's micro-batch assignment is served to its training loop (S2), as the watch uses
 * it (controller/microbatches.ts's MicrobatchBoard is one).
 */
export interface FailSlowBoard {
  /** The assignment in force: micro-batches per DP group, and whether a rebalance made it. */
  get(job: string): Promise<{ readonly assignment: readonly number[]; readonly strategy: 'even' | 'rebalanced' }>;
  /** Serves an S2 plan. */
  apply(job: string, assignment: readonly number[], reason: string, iterationSeconds: number | undefined, now: number): Promise<unknown>;
  /** Back to the even split. */
  reset(job: string, reason: string, now: number): Promise<unknown>;
}

export interface FailSlowDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly board: FailSlowBoard;
  readonly prometheusUrl: string;
  readonly costSeconds: { readonly S2: number; readonly S3: number; readonly S4: number };
  /** The relative change a rank's time must show to be verified (analysis.failSlowThreshold; Greyhound §4.2: 0.1). */
  readonly threshold?: number;
  /** Hands S4 to the recovery ladder. */
  readonly dispatch: (event: LadderEventJob) => Promise<unknown>;
}

/** A new S2 plan replaces the one in force only when it is this much faster. */
const REBALANCE_MIN_GAIN = 1.02;

const storedStateSchema = z.object({ strategy: z.enum(['S1', 'S2', 'S3', 'S4']) }).loose();

export class FailSlowWatch {
  private readonly watches = new Map<string, JobWatch>();

  constructor(private readonly deps: FailSlowDeps) {}

  private mitigationConfig(spec: JobSpec, topology: Topology): MitigationConfig | undefined {
    if (!spec.microbatches) return undefined;
    return {
      costSeconds: this.deps.costSeconds,
      microbatches: spec.microbatches.perIteration,
      dpGroups: dataParallelGroups(topology),
      pipelineStages: spec.microbatches.multipleOf ?? 1,
      topology,
    };
  }

  /** One check of one job; returns the mitigation step taken, if any. */
  async check(spec: JobSpec, now = Date.now()): Promise<MitigationStep | undefined> {
    const job = spec.name;
    const { topology } = parseJobSpec(spec);
    const ofJob = selector({ [TRAINING_JOB_LABEL]: job });
    const [iterations, seconds] = await Promise.all([
      instantQuery(this.deps.prometheusUrl, `steadfast_training_iteration${ofJob}`),
      instantQuery(this.deps.prometheusUrl, `steadfast_training_iteration_seconds${ofJob}`),
    ]);
    const watch = this.watch(job);
    const secondsByRank = new Map(seconds.map((sample) => [Number(sample.labels.rank), sample.value] as const));
    // Rebalancing changes how long each group's iteration takes; per micro-batch it does not.
    const served = spec.microbatches ? (await this.deps.board.get(job)).assignment : undefined;
    for (const sample of iterations) {
      const rank = Number(sample.labels.rank);
      const value = secondsByRank.get(rank);
      if (!Number.isInteger(rank) || rank < 0 || rank >= topology.ranks.length || value === undefined || !(value > 0)) continue;
      if (sample.value <= (watch.lastIteration.get(rank) ?? -1)) continue;
      watch.lastIteration.set(rank, sample.value);
      watch.currentSeconds.set(rank, value);
      const perMicrobatch = value / (served?.[topology.placement(rank).coords.dp] ?? 1);
      watch.perMicrobatch.set(rank, perMicrobatch);
      let tracker = watch.trackers.get(rank);
      if (!tracker)
        watch.trackers.set(rank, (tracker = new RankSlowdownTracker(rank, this.deps.threshold === undefined ? {} : { threshold: this.deps.threshold })));
      const change = tracker.update(now / 1000, perMicrobatch);
      if (change) await this.recordChange(job, change, now, served === undefined ? 'iteration' : 'micro-batch');
    }
    return this.mitigate(spec, topology, watch, now);
  }

  private watch(job: string): JobWatch {
    let watch = this.watches.get(job);
    if (!watch) {
      watch = { trackers: new Map(), lastIteration: new Map(), currentSeconds: new Map(), perMicrobatch: new Map(), steppedAt: undefined };
      this.watches.set(job, watch);
    }
    return watch;
  }

  /** Forgets a job's trackers (it restarted on other machines, or was removed). */
  forget(job: string): void {
    this.watches.delete(job);
  }

  private async recordChange(job: string, change: ChangePoint, now: number, unit: 'iteration' | 'micro-batch'): Promise<void> {
    const summary = `${job}: rank ${change.rank} ${change.direction === 'slowdown' ? 'slowed' : 'recovered'}: ${change.beforeSeconds.toFixed(3)} s → ${change.afterSeconds.toFixed(3)} s per ${unit} (×${change.ratio.toFixed(2)})`;
    await this.deps.audit.append(
      {
        type: 'signal',
        ref: `failslow:${job}:${change.rank}:${change.iteration}`,
        summary,
        data: { job, verb: 'failslow_change', citation: 'Greyhound §4.2 (BOCD, ≥10 % verification)', ...change, at: new Date(now).toISOString() },
      },
      `failslow:${job}:${change.rank}:${change.iteration}:${change.direction}`,
    );
  }

  private async loadState(job: string, config: MitigationConfig): Promise<MitigationState> {
    const text = await this.deps.redis.get(this.deps.keys.jobFailSlow(job));
    if (text !== null && storedStateSchema.safeParse(JSON.parse(text)).success) return JSON.parse(text) as MitigationState;
    return initialMitigationState(config);
  }

  private async mitigate(spec: JobSpec, topology: Topology, watch: JobWatch, now: number): Promise<MitigationStep | undefined> {
    const config = this.mitigationConfig(spec, topology);
    if (!config || watch.currentSeconds.size === 0) return undefined;
    const job = spec.name;
    const progress = Math.min(...watch.lastIteration.values());
    const previous = watch.steppedAt;
    watch.steppedAt = progress;
    if (previous === undefined || progress <= previous) return undefined;
    const state = await this.loadState(job, config);
    const slowRanks = [...watch.trackers.values()].filter((tracker) => tracker.slow).map((tracker) => tracker.rank);
    if (slowRanks.length === 0 && state.strategy === 'S1' && !state.microbatches.rebalanced) return undefined;
    // Per micro-batch: a group runs at its slowest rank's pace (what S2 balances, Greyhound §5.2).
    const groups = new Map<number, number>();
    for (const [rank, perMicrobatch] of watch.perMicrobatch) {
      const dp = topology.placement(rank).coords.dp;
      groups.set(dp, Math.max(groups.get(dp) ?? 0, perMicrobatch));
    }
    const dpGroupSeconds = [...groups.keys()].sort((a, b) => a - b).map((dp) => groups.get(dp) as number);
    // The healthy iteration: the level before the slow-down, per micro-batch, at the even share.
    const evenShare = config.microbatches / config.dpGroups;
    const healthyPerMicrobatch = slowRanks
      .map((rank) => watch.trackers.get(rank)?.healthySeconds)
      .filter((value): value is number => typeof value === 'number');
    const current = [...watch.currentSeconds.values()];
    const healthySeconds = (healthyPerMicrobatch.length > 0 ? median(healthyPerMicrobatch) : median([...watch.perMicrobatch.values()])) * evenShare;
    const step = stepMitigation(
      state,
      {
        iterations: progress - previous,
        iterationSeconds: Math.max(...current),
        healthySeconds,
        persists: slowRanks.length > 0,
        ...(dpGroupSeconds.length === config.dpGroups && dpGroupSeconds.every((value) => value > 0) ? { dpGroupSeconds } : {}),
        slowRanks,
      },
      config,
    );
    await this.deps.redis.set(this.deps.keys.jobFailSlow(job), JSON.stringify(step.state));
    if (step.action !== 'none') await this.carryOut(job, topology, step, slowRanks, dpGroupSeconds, now);
    return step;
  }

  private async carryOut(
    job: string,
    topology: Topology,
    step: MitigationStep,
    slowRanks: number[],
    dpGroupSeconds: readonly number[],
    now: number,
  ): Promise<void> {
    const ref = `failslow:${job}:${now}`;
    const why = `${step.strategy}: ${step.reason}`;
    const served = await this.deps.board.get(job);
    const unchanged =
      served.assignment.length === step.microbatches.assignment.length && served.assignment.every((m, group) => m === step.microbatches.assignment[group]);
    // S2 re-solves on every step. A plan that is the one in force, or no more than 2 % faster
    // than it on today's times (jitter moving among equally good plans), is left alone: every
    // change costs the training loop a reshuffle.
    const servedSeconds =
      served.strategy === 'rebalanced' ? Math.max(...served.assignment.map((m, group) => m * (dpGroupSeconds[group] ?? 0))) : Number.POSITIVE_INFINITY;
    const gain = servedSeconds / (step.microbatches.predictedSeconds ?? servedSeconds);
    if (step.action === 'rebalance' && (unchanged || gain < REBALANCE_MIN_GAIN)) return;
    // S4 restarts the job without the slow machines: the plan that spared them goes with them,
    // or the relaunched run would start on an assignment made for a straggler it no longer has.
    if (step.action === 'reset' || step.restart) await this.deps.board.reset(job, why, now);
    else if (step.microbatches.rebalanced && !unchanged)
      await this.deps.board.apply(job, step.microbatches.assignment, why, step.microbatches.predictedSeconds ?? undefined, now);
    await this.deps.audit.append(
      {
        type: 'decision',
        ref,
        summary: `${job}: fail-slow ${step.action} → ${why}`,
        data: {
          job,
          verb: 'failslow_mitigation',
          strategy: step.strategy,
          action: step.action,
          citation: step.citation,
          lostSeconds: step.lostSeconds,
          next: step.next,
          microbatches: step.microbatches,
          topologyPlan: step.topologyPlan,
          slowRanks,
        },
      },
      ref,
    );
    if (step.restart) {
      const nodes = topology.nodesOf(slowRanks);
      this.forget(job);
      await this.deps.dispatch({
        job,
        event: {
          type: 'fault',
          time: now,
          signalId: ref,
          faultClass: 'machine',
          nodes,
          detail: `fail-slow persists after S2 and S3 (${step.reason}): checkpoint and restart without ${nodes.join(', ')}`,
        },
        eventId: ref,
      });
    }
  }
}
