import { z } from 'zod';
import { seededUniform } from '../../core/random.js';
import { parseOrThrow } from '../../core/validate.js';

/**
 * The hot swap of a job that runs with spares (DeadPool §V-C, §VI; ByteRobust §6.3): a machine
 * fault is recovered inside the running job by moving the failed node's shards to an idle spare,
 * whose state comes from the in-memory replica of the last step, instead of stop → evict →
 * relaunch → reload from the last checkpoint. Whether to swap is the recovery ladder's decision
 * (controller/policy/ladder/hot-swap.ts); the figures, and the world's side of a swap (the spares,
 * how long it takes, whether it finishes), live here; run.ts calls in.
 */

/**
 * DeadPool §VII-B3 (Fig. 11, weak scaling of GPT-7B): end-to-end hot-swap recovery 17.1 s at 32
 * GPUs, 29.8 s at 512 GPUs, "under 40 s"; independent of model size (Fig. 10, 0.6B–50B), growing
 * only with communicator reconstruction. Restart from checkpoint in the same experiments: 150 s.
 */
export const DEADPOOL_SWAP = { smallGpus: 32, smallSeconds: 17.1, largeGpus: 512, largeSeconds: 29.8, restartSeconds: 150 } as const;

/**
 * The lab's target for a swap (two gloo ranks on one host, docs/lab.md), used until it is measured
 * there: 3 s. Not scaled: it has no second point to scale from.
 */
export const LAB_SWAP_TARGET_SECONDS = 3;

/**
 * DeadPool's recovery time at `gpus` GPUs. The paper states the two ends of its sweep; between
 * and beyond them we take it as growing by the same number of seconds per doubling of the GPU
 * count (3.175 s: 12.7 s over the four doublings from 32 to 512), the shape of communicator
 * reconstruction that DeadPool finds dominant (ASSUMPTION: a tree or ring bootstrap, log in the
 * ranks). Flat below 32 GPUs. At 9,600 GPUs: 43.2 s.
 */
export function deadpoolSwapSeconds(gpus: number): number {
  const { smallGpus, smallSeconds, largeGpus, largeSeconds } = DEADPOOL_SWAP;
  if (gpus <= smallGpus) return smallSeconds;
  const perDoubling = (largeSeconds - smallSeconds) / Math.log2(largeGpus / smallGpus);
  return smallSeconds + perDoubling * Math.log2(gpus / smallGpus);
}

export const SWAP_FIGURES = ['deadpool', 'lab'] as const;
export type SwapFigures = (typeof SWAP_FIGURES)[number];

/** What a caller may set about the hot swap; `ettrParams` fills in the rest. */
export const hotSwapOptionsSchema = z
  .object({
    /** Whose swap time: DeadPool's published one scaled to the job, or the lab's. */
    figures: z.enum(SWAP_FIGURES).default('deadpool'),
    /** The swap's time, set directly (overrides `figures`). */
    swapSeconds: z.number().positive().max(3600).optional(),
    /** Share of swaps that do not finish (a replica missing, a spare failing): they fall back after the bound. */
    fallbackShare: z.number().min(0).max(1).default(0.1),
    /** The job's `hotSwap.timeoutSeconds` (contract default 60, 5..3600). */
    timeoutSeconds: z.number().int().min(5).max(3600).default(60),
    /** One spare per this many nodes (at least one spare). */
    nodesPerSpare: z.number().int().min(1).max(100_000).default(300),
    /** ASSUMPTION: the training step of the dense job, 10 s (DeadPool §VII-C: 2.08 s at 64 nodes; FT-HSDP ~20 s at O(100K) GPUs). */
    stepSeconds: z.number().positive().max(3600).default(10),
  })
  .strict();
export type HotSwapOptions = z.input<typeof hotSwapOptionsSchema>;

export interface HotSwapParams {
  readonly figures: SwapFigures | 'set';
  /** How long a swap that finishes takes, from the ladder's decision to the first step. */
  readonly swapSeconds: number;
  readonly fallbackShare: number;
  /** The swap's bound: min(timeout, max(10, 40 × step)), as the controller computes it. */
  readonly boundSeconds: number;
  readonly timeoutSeconds: number;
  readonly spares: number;
  readonly stepSeconds: number;
}

export function hotSwapParams(options: HotSwapOptions, nodes: number, gpus: number): HotSwapParams {
  const parsed = parseOrThrow(hotSwapOptionsSchema, options, 'hot swap options');
  const swapSeconds = parsed.swapSeconds ?? (parsed.figures === 'lab' ? LAB_SWAP_TARGET_SECONDS : deadpoolSwapSeconds(gpus));
  return {
    figures: parsed.swapSeconds === undefined ? parsed.figures : 'set',
    swapSeconds,
    fallbackShare: parsed.fallbackShare,
    boundSeconds: Math.min(parsed.timeoutSeconds, Math.max(10, 40 * parsed.stepSeconds)),
    timeoutSeconds: parsed.timeoutSeconds,
    spares: Math.max(1, Math.ceil(nodes / parsed.nodesPerSpare)),
    stepSeconds: parsed.stepSeconds,
  };
}

export interface HotSwapUsage {
  /** Swaps the ladder opened: machine faults and over-evictions handed to spares. */
  swaps: number;
  /** Nodes replaced by spares (an over-eviction replaces its whole group in one swap). */
  nodesSwapped: number;
  /** Swaps that did not finish within the bound and went back to the relaunch. */
  fallbacks: number;
  /** Machine faults the ladder sent on today's road instead (too few spares, the job not training normally). */
  noSpare: number;
  /** GPU-hours the idle spares hold (spares × GPUs per node × wall time): a cost, outside ETTR like the warm standbys'. */
  reservedGpuHours: number;
}

/** How a swap ends: after `seconds`, either training again, or the bound passed and the job relaunches. */
export interface SwapOutcome {
  readonly finished: boolean;
  readonly seconds: number;
}

/**
 * The world's side of the hot swap: the job's idle spares, by name as the ladder sees them (one
 * used is replaced after the standby replenishment delay — ASSUMPTION: on Slurm a new spare joins
 * only at the job's next launch), and which swaps fall back, drawn from their own seeded stream so
 * that every fallback share meets the same draws (common random numbers).
 */
export class HotSwapWorld {
  private readonly ready: string[] = [];
  private minted = 0;
  private readonly draw: () => number;
  private swaps = 0;
  private nodesSwapped = 0;
  private fallbacks = 0;
  private noSpare = 0;

  constructor(
    readonly params: HotSwapParams,
    seed: number,
    private readonly replenishMs: number,
    private readonly schedule: (time: number, run: () => void) => void,
  ) {
    for (let i = 0; i < params.spares; i += 1) this.ready.push(this.mint());
    this.draw = seededUniform((seed ^ 0x5a17c0de) >>> 0);
  }

  private mint(): string {
    this.minted += 1;
    return `hot-spare-${String(this.minted).padStart(5, '0')}`;
  }

  /** The unused spares, as the controller hands them to the ladder with a fault (FaultEvent.hotSwap). */
  spares(): string[] {
    return [...this.ready];
  }

  /** The ladder's hot_swap step put these spares in the failed nodes' places. */
  take(spares: readonly string[], now: number): void {
    for (const spare of spares) {
      const at = this.ready.indexOf(spare);
      if (at < 0) continue;
      this.ready.splice(at, 1);
      this.nodesSwapped += 1;
      this.schedule(now + this.replenishMs, () => this.ready.push(this.mint()));
    }
  }

  /** A machine fault that the ladder sent on today's road although the job has hot swap. */
  relaunchedInstead(): void {
    this.noSpare += 1;
  }

  /** A swap that does not finish within its bound, or is drawn to fail, falls back after the bound. */
  outcome(): SwapOutcome {
    this.swaps += 1;
    const drawnToFail = this.draw() < this.params.fallbackShare;
    if (drawnToFail || this.params.swapSeconds > this.params.boundSeconds) {
      this.fallbacks += 1;
      return { finished: false, seconds: this.params.boundSeconds };
    }
    return { finished: true, seconds: this.params.swapSeconds };
  }

  usage(gpusPerNode: number, wallHours: number): HotSwapUsage {
    return {
      swaps: this.swaps,
      nodesSwapped: this.nodesSwapped,
      fallbacks: this.fallbacks,
      noSpare: this.noSpare,
      reservedGpuHours: this.params.spares * gpusPerNode * wallHours,
    };
  }
}
