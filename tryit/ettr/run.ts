import type { FaultClass, FaultEvent, LadderEvent } from '../../core/ladder.js';
import type { Step } from '../../core/steps.js';
import { DEFAULT_LADDER_CONFIG, advance, type LadderConfig, type LadderState } from '../../controller/policy/ladder/index.js';
import { faultReports } from './detection.js';
import { EventQueue, percentReporter } from './events.js';
import { HotSwapWorld, type HotSwapParams } from './hot-swap.js';
import { IncidentClock } from './incident-clock.js';
import type { Incident, IncidentSource } from './incidents.js';
import { ladderHistory } from './ladder-history.js';
import { Ledger, type Cause } from './ledger.js';
import { JobMembers } from './members.js';
import { symptomById } from './model.js';
import { DAY_MS, SIM_START_MS, type EttrParams } from './params.js';
import { resolutionOf, type OpenIncident } from './open-incident.js';
import { StandbyPool } from './pool.js';
import { increment, schedulingSummary, type StrategyResult } from './result.js';

/**
 * steadfast on a simulated job: the world (faults, machines, the standby pool, how long each
 * action takes) is simulated; every recovery decision is taken by the real recovery ladder,
 * controller/policy/ladder/, fed the events the controller would feed it — classified faults,
 * diagnostics and replay results, restart outcomes, code updates and ticks — and its steps carried
 * out by the world. Nothing of the policy is re-implemented here.
 */

export interface SteadfastRunOptions {
  readonly ladderConfig?: LadderConfig;
  /** The job runs with spares and machine faults are hot-swapped (hot-swap.ts); today's relaunch without. */
  readonly hotSwap?: HotSwapParams;
  /** Called with the share of simulated time done, at most once per percent. */
  readonly onProgress?: (fraction: number) => void;
}

const S = 1000;
const JOB = 'dense-70b';

export function runSteadfast(params: EttrParams, source: IncidentSource, options: SteadfastRunOptions = {}): StrategyResult {
  return new SteadfastSimulation(params, source, options).run();
}

class SteadfastSimulation {
  private readonly queue = new EventQueue();
  private readonly ledger: Ledger;
  private readonly config: LadderConfig;
  private readonly end: number;
  private readonly t: EttrParams['timings'];
  private now = SIM_START_MS;
  private ladder: LadderState;

  private readonly members: JobMembers;
  /** When training (re)started, and when it began running slowly; null while the job is down. */
  private training: { since: number; slowSince: number | null } | null = null;
  private readonly hotSwap: HotSwapWorld | null;
  /** What the downtime is spent on right now. */
  private down: { cause: Cause; since: number } | null = null;
  private open: OpenIncident | null = null;
  /** Replacements evicted but not yet relaunched onto. */
  private evicted: { nodes: number; cold: number } | null = null;
  /** World activities under way (diagnostics, relaunches, …): with none and nothing held by the ladder, nothing would ever happen again. */
  private pending = 0;

  private readonly clock: IncidentClock;

  private readonly pool: StandbyPool;
  private readonly ladderSteps: Record<string, number> = {};
  private readonly resolvedBy: Record<string, number> = {};
  private readonly incidentsBySymptom: Record<string, number> = {};
  private readonly scheduling: number[] = [];
  private incidents = 0;
  private signals = 0;
  private versions = 1;
  private readonly ticks = new Set<number>();
  /** Reports the share of simulated time done to options.onProgress, at most once per percent. */
  private readonly progress: (now: number) => void;

  constructor(
    private readonly params: EttrParams,
    source: IncidentSource,
    private readonly options: SteadfastRunOptions,
  ) {
    this.config = options.ladderConfig ?? DEFAULT_LADDER_CONFIG;
    this.t = params.timings;
    this.end = SIM_START_MS + params.days * DAY_MS;
    this.progress = percentReporter(SIM_START_MS, this.end, options.onProgress);
    this.ledger = new Ledger(SIM_START_MS, this.end, params.checkpointIntervalSeconds * S, params.checkpointBlockingSeconds * S);
    this.members = new JobMembers(params.nodes);
    this.pool = new StandbyPool(params.standby, this.t.standbyReplenishSeconds * S, (time, run) => this.queue.schedule(time, run));
    this.hotSwap =
      options.hotSwap === undefined
        ? null
        : new HotSwapWorld(options.hotSwap, params.seed, this.t.standbyReplenishSeconds * S, (time, run) => this.queue.schedule(time, run));
    this.ladder = ladderHistory(JOB, this.config);
    this.clock = new IncidentClock(
      source,
      (time, run) => this.queue.schedule(time, run),
      (incident) => this.onIncident(incident),
    );
  }

  run(): StrategyResult {
    this.startTraining();
    for (;;) {
      if (!(this.queue.peekTime() < this.end)) break;
      const event = this.queue.pop();
      if (event === undefined) break;
      this.now = event.time;
      event.run();
      this.checkNotStalled();
      this.progress(this.now);
    }
    this.now = this.end;
    if (this.training !== null) this.ledger.segment(this.training.since, this.end, 'horizon', this.open?.symptom ?? 'none');
    else this.setDown(this.down?.cause ?? 'detection');
    this.ledger.settleInterrupted();
    this.options.onProgress?.(1);
    return {
      strategy: this.hotSwap === null ? 'steadfast' : 'hot_swap',
      ...this.ledger.summary(),
      incidents: this.incidents,
      incidentsBySymptom: this.incidentsBySymptom,
      replacementScheduling: schedulingSummary(this.scheduling),
      standby: {
        poolSize: this.params.standby,
        ...this.pool.usage,
        reservedGpuHours: this.params.standby * this.params.gpusPerNode * this.params.days * 24,
      },
      ladderSteps: this.ladderSteps,
      resolvedBy: this.resolvedBy,
      ...(this.hotSwap === null ? {} : { hotSwap: this.hotSwap.usage(this.params.gpusPerNode, this.params.days * 24) }),
    };
  }

  // -------------------------------------------------------------------------------------------
  // The job: training, downtime, the incident clock

  private startTraining(): void {
    this.endDowntime();
    this.ledger.settleInterrupted();
    this.training = { since: this.now, slowSince: null };
    if (this.open === null) this.clock.resume(this.now);
  }

  /** Ends the training stretch; a planned stop saves a checkpoint first and loses nothing. */
  private stopTraining(planned: boolean): void {
    const training = this.training;
    if (training === null) return;
    this.clock.pause(this.now);
    const slow = training.slowSince === null ? undefined : { fromMs: training.slowSince, speed: this.params.slowdownSpeed };
    const symptom = this.open?.symptom ?? 'none';
    if (planned) this.ledger.segment(training.since, this.now, 'planned', symptom, slow);
    else this.ledger.interrupt(training.since, this.now, symptom, slow);
    this.training = null;
    this.down = { cause: 'detection', since: this.now };
  }

  /** Books the downtime so far to its cause and incident; the job is about to train. */
  private endDowntime(): void {
    if (this.down !== null) this.ledger.spend(this.down.cause, this.down.since, this.now, this.open?.symptom ?? 'none');
    this.down = null;
  }

  /** Books the downtime so far to its cause and moves on to the next one. */
  private setDown(cause: Cause): void {
    if (this.training !== null) return;
    if (this.down !== null) this.ledger.spend(this.down.cause, this.down.since, this.now, this.open?.symptom ?? 'none');
    this.down = { cause, since: this.now };
  }

  /** Runs `then` after `seconds` of world time, as an activity the job is waiting on. */
  private after(seconds: number, then: () => void): void {
    this.pending += 1;
    this.queue.schedule(this.now + seconds * S, () => {
      this.pending -= 1;
      then();
    });
  }

  // -------------------------------------------------------------------------------------------
  // Incidents

  private onIncident(incident: Incident): void {
    this.incidents += 1;
    increment(this.incidentsBySymptom, incident.symptom.id);

    const reporter = this.members.pick(incident.nodePick);
    this.open = {
      incident,
      symptom: incident.symptom.id,
      detectionSeconds: incident.symptom.detectionSeconds,
      culprit: incident.root === 'node' ? reporter : null,
      reporter,
      bugActive: incident.root === 'user_code',
    };

    if (incident.signal === 'code_update') {
      this.versions += 1;
      this.feed({ type: 'code_update', time: this.now, version: `v${this.versions}`, urgent: incident.urgent });
      // A lazy update leaves the job training (§6.1): nothing is open any more.
      if (this.training !== null) {
        this.open = null;
        this.clock.resume(this.now);
      }
      return;
    }
    this.strike(incident, reporter);
  }

  /** The fault shows: the job stops (or slows), and the monitors report it (detection.ts). */
  private strike(incident: Incident, reporter: string): void {
    if (incident.signal === 'slowdown') {
      // The job trains on at reduced speed until the decline is seen (§5.1 fail-slow).
      if (this.training !== null) this.training.slowSince = this.now;
    } else {
      this.stopTraining(false);
    }
    for (const report of faultReports(incident, reporter, this.t))
      this.after(report.afterSeconds, () => this.fault(report.faultClass, report.nodes, report.detail, report.signature));
  }

  /**
   * A fault reaches the ladder; on the hot-swap run a machine fault carries the job's unused spares,
   * as the controller adds them (FaultEvent.hotSwap). Network faults do not: the communication
   * epoch of a flap is not modelled, they keep today's road.
   */
  private fault(faultClass: FaultClass, nodes: readonly string[], detail: string, signature?: string): void {
    this.signals += 1;
    const spares = faultClass === 'machine' ? this.hotSwap?.spares() : undefined;
    const event: FaultEvent = { type: 'fault', time: this.now, signalId: `sim-${this.signals}`, faultClass, nodes: [...nodes], detail };
    this.feed({ ...event, ...(signature === undefined ? {} : { signature }), ...(spares === undefined ? {} : { hotSwap: { spares } }) });
  }

  // -------------------------------------------------------------------------------------------
  // The ladder and its steps

  private feed(event: LadderEvent): void {
    const { state, steps } = advance(this.ladder, event, this.config);
    this.ladder = state;
    if (event.type === 'fault' && event.hotSwap !== undefined && steps.some((step) => step.verb === 'evict')) this.hotSwap?.relaunchedInstead();
    this.carryOut(steps);
    this.scheduleTicks();
  }

  private carryOut(steps: readonly Step[]): void {
    let started = false;
    const activated: { replaced: string; by: string }[] = [];
    for (const step of steps) {
      increment(this.ladderSteps, step.verb);
      switch (step.verb) {
        case 'stop':
          if (this.open === null) {
            // The ladder stopped the job with nothing open: a lazy update's window ran out (§6.1).
            const code = symptomById('code_adjustment');
            this.open = { incident: null, symptom: code.id, detectionSeconds: 0, culprit: null, reporter: '', bugActive: false };
          }
          this.stopTraining(this.open.incident === null || this.open.incident.signal === 'code_update');
          break;
        case 'evict':
          activated.push(...this.evict(step.nodes ?? []));
          break;
        case 'hot_swap':
          this.swap(step.nodes ?? [], step.spares ?? []);
          started = true;
          break;
        case 'rollback':
          // §4.2 Rollback: the code goes back; a bug in the new code is gone with it.
          if (this.open !== null) this.open.bugActive = false;
          break;
        case 'restart':
        case 'reattempt':
          this.relaunch();
          started = true;
          break;
        case 'run_diagnostics':
          this.diagnose();
          started = true;
          break;
        case 'run_replay':
          this.replay();
          started = true;
          break;
        case 'analyze_stacks':
          this.aggregate();
          started = true;
          break;
        case 'page_human':
          this.human();
          started = true;
          break;
        case 'apply_update':
        case 'quarantine':
        case 'notify':
        case 'tolerate':
          break;
      }
    }
    if (!started && this.ladder.scheduled !== null && this.training === null) this.setDown('backoff');
    // As the evict step does, once the transition's steps are out (actuators/steps/evict.ts).
    for (const { replaced, by } of activated) this.feed({ type: 'standby_activated', time: this.now, replaced, by });
  }

  /** Held-back restarts and lazy updates fire on a tick at (or after) their time. */
  private scheduleTicks(): void {
    const times: number[] = [];
    if (this.ladder.scheduled !== null) times.push(this.ladder.scheduled.notBefore);
    if (this.ladder.pendingUpdate !== null && this.ladder.phase === 'running') times.push(Math.max(this.now, this.ladder.pendingUpdate.deadline));
    for (const time of times) {
      if (this.ticks.has(time)) continue;
      this.ticks.add(time);
      this.queue.schedule(time, () => {
        this.ticks.delete(time);
        this.feed({ type: 'tick', time: this.now });
      });
    }
  }

  // -------------------------------------------------------------------------------------------
  // What the steps do in the world

  /** §6.2: the evicted machines leave the job; standbys (or cold nodes) take their slots. */
  private evict(nodes: readonly string[]): { replaced: string; by: string }[] {
    const replacements = this.members.replace(nodes);
    const { cold } = this.pool.replace(replacements.length, this.now);
    const before = this.evicted ?? { nodes: 0, cold: 0 };
    this.evicted = { nodes: before.nodes + replacements.length, cold: before.cold + cold };
    return replacements;
  }

  /**
   * DeadPool §V-C: the ladder's hot_swap puts the spares in the failed nodes' slots while the job
   * runs (its ranks stop at the step they are in). The swap finishes in its time and training
   * goes on from the last step, or it does not and, once its bound has passed, the ladder hears so
   * and falls back to its stop and relaunch, which reloads the last checkpoint.
   */
  private swap(nodes: readonly string[], spares: readonly string[]): void {
    const world = this.hotSwap;
    if (world === null) throw new Error('the ladder emitted hot_swap for a job without spares');
    this.stopTraining(false);
    this.members.replace(nodes, spares);
    world.take(spares, this.now);
    const outcome = world.outcome();
    this.setDown(outcome.finished ? 'hot_swap' : 'swap_fallback');
    if (outcome.finished) this.scheduling.push(outcome.seconds);
    this.after(outcome.seconds, () => {
      if (!outcome.finished) return this.feed({ type: 'hot_swap_failed', time: this.now, detail: `not done within its ${world.params.boundSeconds} s bound` });
      this.ledger.restoredFromMemory(world.params.stepSeconds * S);
      const open = this.open;
      const cured = open === null || ((open.culprit === null || !this.members.has(open.culprit)) && !open.bugActive);
      if (cured) increment(this.resolvedBy, resolutionOf(open, this.ladder.incident));
      if (cured) this.open = null;
      this.startTraining();
      this.feed({ type: 'hot_swap_done', time: this.now, epoch: 0, summary: `${spares.join(', ')} in place of ${nodes.join(', ')}` });
      // A fault the swap did not cure (a hang in the code, over-evicted) strikes again.
      const incident = open?.incident;
      if (!cured && incident != null) this.after(this.t.refailSeconds, () => this.strike(incident, open?.reporter ?? ''));
    });
  }

  private relaunch(): void {
    const evicted = this.evicted;
    this.evicted = null;
    let seconds: number;
    if (evicted !== null && evicted.nodes > 0) {
      // §8.2.1: the shortfall is rescheduled; training waits for the slowest replacement.
      const relaunch = evicted.cold > 0 ? this.t.coldRelaunchSeconds : this.t.warmRelaunchSeconds;
      seconds = this.t.evictSeconds + relaunch;
      this.scheduling.push(seconds);
      this.setDown(evicted.cold > 0 ? 'cold_provisioning' : 'standby_activation');
    } else {
      seconds = this.t.inPlaceRestartSeconds;
      this.setDown('restart');
    }
    this.after(seconds, () => {
      this.setDown('reload');
      this.after(this.t.localReloadSeconds, () => this.resumed());
    });
  }

  /** The relaunched job reloaded its checkpoint: it trains if its fault is gone, else fails again. */
  private resumed(): void {
    const open = this.open;
    const fixed = open === null || ((open.culprit === null || !this.members.has(open.culprit)) && !open.bugActive);
    if (fixed) {
      increment(this.resolvedBy, resolutionOf(open, this.ladder.incident));
      this.endDowntime();
      this.open = null;
      this.startTraining();
      this.feed({ type: 'restart_succeeded', time: this.now });
      return;
    }
    this.setDown('failed_restart');
    this.after(this.t.refailSeconds, () => {
      this.setDown('detection');
      this.after(open.detectionSeconds, () => this.feed({ type: 'restart_failed', time: this.now, detail: `${open.symptom} again` }));
    });
  }

  /** §4.2 Diagnose (and §4.3 bit-wise alignment for NaN): names the bad machine if the tests catch it. */
  private diagnose(): void {
    const open = this.open;
    this.setDown('diagnosis');
    const seconds = open?.incident?.signal === 'numerical' ? this.t.nanDiagnosticsSeconds : this.t.diagnosticsSeconds;
    const found = open !== null && open.culprit !== null && open.incident?.diagnosticsFind === true && this.members.has(open.culprit);
    this.after(seconds, () => this.feed({ type: 'diagnostics_result', time: this.now, suspects: found && open.culprit !== null ? [open.culprit] : [] }));
  }

  /** §4.2 Dual-phase replay: isolates the bad machine when there is one. */
  private replay(): void {
    const culprit = this.open?.culprit ?? null;
    this.setDown('replay');
    this.after(this.t.replaySeconds, () =>
      this.feed({ type: 'replay_result', time: this.now, culprits: culprit !== null && this.members.has(culprit) ? [culprit] : [] }),
    );
  }

  /**
   * §5.1 aggregation: the outlier stacks point at a parallel group, which comes back to the ladder
   * as a machine fault naming the whole group (over-eviction). A hang in the code still has ranks
   * that stalled first, so it names a group too; the crash after that eviction sends it to rollback (§4.2 step ⑦).
   */
  private aggregate(): void {
    const open = this.open;
    if (open === null) return;
    const slowdown = open.incident?.signal === 'slowdown';
    if (!slowdown) this.setDown('diagnosis');
    const group = this.members.groupAround(open.reporter, this.params.overEvictionGroupSize);
    const seconds = slowdown ? this.t.slowdownAggregationSeconds : this.t.hangAggregationSeconds;
    this.after(seconds, () => this.fault('machine', group, `stack aggregation isolated ${group.length} machines`));
  }

  /** A person takes over: finds and fixes whatever is wrong, then relaunches. */
  private human(): void {
    this.setDown('human');
    this.after(this.t.humanSeconds, () => {
      const open = this.open;
      if (open !== null) {
        open.bugActive = false;
        if (open.culprit !== null && this.members.has(open.culprit)) this.evict([open.culprit]);
      }
      this.relaunch();
    });
  }

  private checkNotStalled(): void {
    if (this.training !== null || this.pending > 0 || this.ladder.scheduled !== null) return;
    throw new Error(
      `ETTR simulation stalled at ${new Date(this.now).toISOString()}: the job is down, no action is under way and the ladder holds nothing (phase ${this.ladder.phase})`,
    );
  }
}
