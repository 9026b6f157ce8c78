/**
 * Where the wall-clock time of a simulated job went. ETTR is ByteRobust's (§8.1.3, cumulative
 * ETTR): accumulated productive training time over accumulated wall-clock time. Every millisecond
 * of the run is either productive or booked to exactly one cause, so the causes add up to
 * wall − productive.
 *
 * Checkpoint stalls are counted but kept out of ETTR: ByteRobust reports them as an MFU cost
 * (Table 8), not as lost training time.
 */

export const CAUSES = [
  /** From the fault to the signal steadfast (or the operator) acts on. */
  'detection',
  /** Stop-time diagnostics, stack aggregation, prior practice's stress tests. */
  'diagnosis',
  /** Dual-phase replay (§4.2, Algorithm 1). */
  'replay',
  /** Evict and relaunch on warm standbys (§6.2). */
  'standby_activation',
  /** Evict and wait for a cold node when the pool is short (§6.2 "prompt replenishment"). */
  'cold_provisioning',
  /** Kill and requeue the whole job (§8.2.1 requeue). */
  'requeue',
  /** Relaunch on the job's allocation with pods reinstalled (§8.2.1 reschedule). */
  'reschedule',
  /** Relaunch in place: reattempt, rollback, hot update (§6.1). */
  'restart',
  /** The retry chain holding a restart back. */
  'backoff',
  /** A relaunch that ran and failed again because its fault was not fixed. */
  'failed_restart',
  /** Loading the last checkpoint. */
  'reload',
  /** Training since the last checkpoint, lost at the failure and computed again. */
  'lost_work',
  /** The share of training lost while the job ran slowly (MFU decline). */
  'degraded',
  /** A hot swap onto a spare, from the decision to the first step (DeadPool §V-C, §VII-B3). */
  'hot_swap',
  /** A hot swap that did not finish: its bound, waited out before today's relaunch. */
  'swap_fallback',
  /** A person handling what automation could not. */
  'human',
] as const;
export type Cause = (typeof CAUSES)[number];

export type SegmentEnd = 'failure' | 'planned' | 'horizon';

const HOUR_MS = 3_600_000;

export class Ledger {
  private readonly unproductiveMs = new Map<Cause, number>(CAUSES.map((cause) => [cause, 0]));
  private readonly bySymptomMs = new Map<string, number>();
  private productiveMs = 0;
  private checkpointStallMs = 0;
  /** The stretch a failure ended, booked once the recovery says what it restores from. */
  private interrupted: { from: number; to: number; symptom: string; degraded?: { fromMs: number; speed: number }; stepMs?: number } | null = null;

  constructor(
    readonly startMs: number,
    readonly endMs: number,
    private readonly checkpointIntervalMs: number,
    private readonly checkpointBlockingMs: number,
  ) {}

  /** Books [from, to) — clipped to the run — to a cause and the incident's symptom. */
  spend(cause: Cause, fromMs: number, toMs: number, symptom: string): void {
    const from = Math.max(fromMs, this.startMs);
    const to = Math.min(toMs, this.endMs);
    if (to <= from) return;
    this.add(cause, to - from, symptom);
  }

  /**
   * One stretch of training [from, to). Ended by a failure it loses the training since the last
   * checkpoint (checkpoints every interval of training since the resume, which restarted from
   * one); ended on purpose it loses nothing (a planned stop saves first: §2.2, manual restarts
   * cost only failover time); the run's end loses nothing either. From `degradedFromMs` on it runs
   * at `speed` (MFU decline).
   */
  segment(fromMs: number, toMs: number, ending: SegmentEnd, symptom: string, degraded?: { fromMs: number; speed: number }, stepMs?: number): void {
    const from = Math.max(fromMs, this.startMs);
    let to = toMs;
    let end = ending;
    if (to >= this.endMs) {
      to = this.endMs;
      end = 'horizon';
    }
    if (to <= from) return;
    const length = to - from;
    // With `stepMs` the last step was restored from memory: only the interrupted step is lost.
    const lost =
      end === 'failure' ? (stepMs === undefined ? length % this.checkpointIntervalMs : Math.min(length % this.checkpointIntervalMs, length % stepMs)) : 0;
    let degradedLoss = 0;
    if (degraded !== undefined) {
      const slow = Math.max(0, to - Math.max(from, degraded.fromMs));
      // The lost tail is lost whatever its speed; only the slow time before it counts as degraded.
      degradedLoss = (1 - degraded.speed) * Math.max(0, slow - lost);
    }
    this.productiveMs += length - lost - degradedLoss;
    this.checkpointStallMs += Math.floor(length / this.checkpointIntervalMs) * this.checkpointBlockingMs;
    if (lost > 0) this.add('lost_work', lost, symptom);
    if (degradedLoss > 0) this.add('degraded', degradedLoss, symptom);
  }

  /** A failure ended the stretch [from, to); what it loses depends on the recovery (settleInterrupted books it). */
  interrupt(fromMs: number, toMs: number, symptom: string, degraded?: { fromMs: number; speed: number }): void {
    this.settleInterrupted();
    this.interrupted = { from: fromMs, to: toMs, symptom, ...(degraded === undefined ? {} : { degraded }) };
  }

  /**
   * The recovery restored the last completed step from memory (a hot swap): the interrupted
   * stretch loses only the interrupted step, its fraction of `stepMs` (DeadPool §VII-C, t_step·φ).
   */
  restoredFromMemory(stepMs: number): void {
    if (this.interrupted !== null) this.interrupted.stepMs = stepMs;
  }

  /** Books the interrupted stretch: back to the last checkpoint, or to the last step restored from memory. */
  settleInterrupted(): void {
    const stretch = this.interrupted;
    if (stretch === null) return;
    this.interrupted = null;
    this.segment(stretch.from, stretch.to, 'failure', stretch.symptom, stretch.degraded, stretch.stepMs);
  }

  private add(cause: Cause, ms: number, symptom: string): void {
    this.unproductiveMs.set(cause, (this.unproductiveMs.get(cause) ?? 0) + ms);
    this.bySymptomMs.set(symptom, (this.bySymptomMs.get(symptom) ?? 0) + ms);
  }

  summary(): LedgerSummary {
    const wallMs = this.endMs - this.startMs;
    const unproductiveHours = Object.fromEntries(CAUSES.map((cause) => [cause, (this.unproductiveMs.get(cause) ?? 0) / HOUR_MS])) as Record<Cause, number>;
    const bySymptom: Record<string, number> = {};
    for (const [symptom, ms] of [...this.bySymptomMs.entries()].sort((a, b) => b[1] - a[1])) bySymptom[symptom] = ms / HOUR_MS;
    return {
      wallHours: wallMs / HOUR_MS,
      productiveHours: this.productiveMs / HOUR_MS,
      ettr: wallMs > 0 ? this.productiveMs / wallMs : 1,
      unproductiveHours,
      unproductiveHoursBySymptom: bySymptom,
      checkpointStallHours: this.checkpointStallMs / HOUR_MS,
    };
  }
}

export interface LedgerSummary {
  readonly wallHours: number;
  readonly productiveHours: number;
  /** Productive training time over wall-clock time (ByteRobust §8.1.3). */
  readonly ettr: number;
  readonly unproductiveHours: Record<Cause, number>;
  /** The same hours by Table 1 symptom of the incident they belong to. */
  readonly unproductiveHoursBySymptom: Record<string, number>;
  /** Time training blocked on checkpoint saves: an MFU cost, outside ETTR (Table 8). */
  readonly checkpointStallHours: number;
}
