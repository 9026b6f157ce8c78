import { z } from 'zod';
import { optimalCheckpointInterval } from '../../actuators/checkpoint-interval.js';
import { standbyPoolSize } from '../../actuators/standby-sizing.js';
import { InputError } from '../../core/errors.js';
import { parseOrThrow } from '../../core/validate.js';
import { hotSwapOptionsSchema, hotSwapParams, type HotSwapParams } from './hot-swap.js';
import {
  FAILURE_SHARE,
  PAPER_INCIDENTS_PER_DAY,
  PAPER_JOB,
  RESCHEDULE_SECONDS,
  WARM_EVICTION_SECONDS,
  hotUpdateSeconds,
  machineFailuresPerDay,
  requeueSeconds,
} from './model.js';

/**
 * One simulated run's parameters: the job's size and length, its failure rate, the recovery
 * times at that scale and the options a user gives `steadfast simulate ettr`, from the paper's
 * figures in model.ts.
 */

export interface EttrTimings {
  /** Stop, drain and hand the node back: Table 6 "Ours" for GPU Unavailable / GPU Memory Error (10 s). */
  readonly evictSeconds: number;
  /** Wake a warm standby and relaunch (WARM_EVICTION_SECONDS less the eviction). */
  readonly warmRelaunchSeconds: number;
  /** Relaunch when a needed node comes cold (RESCHEDULE_SECONDS less the eviction; §6.2, §8.2.1). */
  readonly coldRelaunchSeconds: number;
  /** Restart in place (reattempt, rollback, hot update): Table 7 hot update at this scale. */
  readonly inPlaceRestartSeconds: number;
  /** Requeue the whole job: Table 7 requeue at this scale. */
  readonly requeueSeconds: number;
  /** Reschedule baseline: Fig. 12's reschedule, for every relaunch on its allocation. */
  readonly rescheduleSeconds: number;
  /** ASSUMPTION: reload from CPU memory / peer backups (§6.3); nothing in the paper measures it. */
  readonly localReloadSeconds: number;
  /** ASSUMPTION: reload terabytes from remote storage after a requeue (§2.3 "notably time-consuming"). */
  readonly remoteReloadSeconds: number;
  /** ASSUMPTION: EUD + NCCL tests, the middle of §2.2's 2-15 minute localisation. */
  readonly diagnosticsSeconds: number;
  /** ASSUMPTION: EUD + NCCL + bit-wise alignment for NaN (§4.3). */
  readonly nanDiagnosticsSeconds: number;
  /** ASSUMPTION: two replay phases of 15 minutes (Algorithm 1); Table 6 NaN max is 7,200 s. */
  readonly replaySeconds: number;
  /** ASSUMPTION: capture and aggregate the stacks of a hung job (§5.1). */
  readonly hangAggregationSeconds: number;
  /** §5.1: fail-slow aggregation every 10 s over 5 rounds. */
  readonly slowdownAggregationSeconds: number;
  /** Table 3: network inspection every 30 s; the second alert evicts (§4.1). */
  readonly networkAlertIntervalSeconds: number;
  /** ASSUMPTION: a relaunched job whose fault was not fixed fails again this long after it resumes. */
  readonly refailSeconds: number;
  /** ASSUMPTION: a person's response and fix (§2.2 reports 3 h and 8 h for hard cases). */
  readonly humanSeconds: number;
  /** ASSUMPTION: pod initialisation and self-checks of a new standby (§6.2). */
  readonly standbyReplenishSeconds: number;
}

export interface EttrParams {
  readonly nodes: number;
  readonly gpusPerNode: number;
  readonly days: number;
  readonly seed: number;
  readonly failuresPerDay: number;
  readonly manualRestartsPerDay: number;
  readonly checkpointIntervalSeconds: number;
  /** Table 8, 70B at 128×16: ByteRobust save blocks training 0.04 s per checkpoint. */
  readonly checkpointBlockingSeconds: number;
  readonly standby: number;
  /** The per-machine daily failure rate the pool was sized from (§6.2). */
  readonly dailyMachineFailureRate: number;
  readonly timings: EttrTimings;
  /** ASSUMPTION: stop-time diagnostics find a bad GPU this often; tuned so replay stays near §4.2's 1.23 %. */
  readonly diagnosticsCatchProbability: number;
  /** ASSUMPTION: bit-wise alignment (§4.3) catches a silent-data-corruption machine this often. */
  readonly bitwiseCatchProbability: number;
  /** ASSUMPTION: the aggregation analyzer over-evicts a whole pipeline group of this many machines (Fig. 7: 4; §5.2: 6). */
  readonly overEvictionGroupSize: number;
  /** ASSUMPTION: share of manual restarts that are urgent (applied at once); the rest wait for a failure or 24 h (§6.1). */
  readonly urgentUpdateShare: number;
  /** ASSUMPTION: training speed during an MFU decline, relative to normal. */
  readonly slowdownSpeed: number;
  /** The hot swap steadfast is also run with (hot-swap.ts); null: run without it only. */
  readonly hotSwap: HotSwapParams | null;
}

/** What a caller may set; everything else follows from it. */
export const ettrOptionsSchema = z
  .object({
    nodes: z.number().int().min(1).max(100_000).default(PAPER_JOB.nodes),
    gpus: z.number().int().min(1).optional(),
    days: z.number().positive().max(3650).default(PAPER_JOB.days),
    seed: z
      .number()
      .int()
      .min(0)
      .max(2 ** 32 - 1)
      .default(1),
    checkpointMinutes: z
      .number()
      .positive()
      .max(7 * 24 * 60)
      .optional(),
    standby: z.number().int().min(0).optional(),
    /** The hot swap's figures (hot-swap.ts); null leaves the run with hot swap out. */
    hotSwap: hotSwapOptionsSchema.nullable().prefault({}),
  })
  .strict();
export type EttrOptions = z.input<typeof ettrOptionsSchema>;

export const DEFAULT_CHECKPOINT_BLOCKING_SECONDS = 0.04;

/** The job's mean time between failures (manual restarts excluded), in hours. */
export function jobMtbfHours(params: Pick<EttrParams, 'failuresPerDay'>): number {
  return 24 / params.failuresPerDay;
}

export function ettrParams(options: EttrOptions = {}): EttrParams {
  const parsed = parseOrThrow(ettrOptionsSchema, options, 'simulation options');
  const nodes = parsed.nodes;
  const gpus = parsed.gpus ?? (nodes * PAPER_JOB.gpus) / PAPER_JOB.nodes;
  if (gpus % nodes !== 0) throw new InputError(`gpus (${gpus}) must be a whole multiple of nodes (${nodes}): every node holds the same number of GPUs`, 'gpus');
  const failuresPerDay = PAPER_INCIDENTS_PER_DAY * FAILURE_SHARE * (nodes / PAPER_JOB.nodes);
  const manualRestartsPerDay = PAPER_INCIDENTS_PER_DAY * (1 - FAILURE_SHARE);
  // §6.2: the pool is the P99 of Binomial(machines, daily per-machine failure rate).
  const dailyMachineFailureRate = Math.min(1, machineFailuresPerDay(failuresPerDay) / nodes);
  const standby = parsed.standby ?? standbyPoolSize(nodes, dailyMachineFailureRate, 0.99).standby;
  // Daly's interval for the job's MTBF and ByteRobust's checkpoint blocking time (Table 8);
  // §6.3 checkpoints every step, which this lands near (about a minute).
  const checkpointIntervalSeconds =
    parsed.checkpointMinutes !== undefined
      ? parsed.checkpointMinutes * 60
      : optimalCheckpointInterval(jobMtbfHours({ failuresPerDay }), DEFAULT_CHECKPOINT_BLOCKING_SECONDS).dalySeconds;
  const evictSeconds = 10;
  return {
    nodes,
    gpusPerNode: gpus / nodes,
    days: parsed.days,
    seed: parsed.seed,
    failuresPerDay,
    manualRestartsPerDay,
    checkpointIntervalSeconds,
    checkpointBlockingSeconds: DEFAULT_CHECKPOINT_BLOCKING_SECONDS,
    standby,
    dailyMachineFailureRate,
    timings: {
      evictSeconds,
      warmRelaunchSeconds: WARM_EVICTION_SECONDS - evictSeconds,
      coldRelaunchSeconds: RESCHEDULE_SECONDS - evictSeconds,
      inPlaceRestartSeconds: hotUpdateSeconds(nodes),
      requeueSeconds: requeueSeconds(nodes),
      rescheduleSeconds: RESCHEDULE_SECONDS,
      localReloadSeconds: 30,
      remoteReloadSeconds: 300,
      diagnosticsSeconds: 510,
      nanDiagnosticsSeconds: 900,
      replaySeconds: 1800,
      hangAggregationSeconds: 60,
      slowdownAggregationSeconds: 50,
      networkAlertIntervalSeconds: 30,
      refailSeconds: 300,
      humanSeconds: 3600,
      standbyReplenishSeconds: 1800,
    },
    diagnosticsCatchProbability: 0.95,
    bitwiseCatchProbability: 0.5,
    overEvictionGroupSize: 4,
    urgentUpdateShare: 0.5,
    slowdownSpeed: 0.7,
    hotSwap: parsed.hotSwap === null ? null : hotSwapParams(parsed.hotSwap, nodes, gpus),
  };
}

/** The simulated job starts here (any fixed instant: the ladder only needs epoch milliseconds). */
export const SIM_START_MS = Date.UTC(2025, 0, 1);
export const DAY_MS = 86_400_000;
