import { performance } from 'node:perf_hooks';
import type { EvaluationContext, FeatureMatrix, FeatureValue } from '../../analyzers/multisignal/types.js';
import type { ClusterReplay } from './cluster-replay.js';
import { ANY_XID_5M, type FaultLabel } from './labels.js';

/**
 * The multi-signal detector scored on the labelled replay (cluster-replay.ts) the
 * way the 504-GPU report (002, first finding) scores its detection: faults found (10/10 there),
 * found before their Xid (2/10), and false positives a day (about 0.84 on its 63 nodes). Here a
 * false positive is an episode, not a minute: an operator sees one incident however long it lasts.
 * Baselines run on the same frames: the Xid counter alone, and one metric against a threshold.
 */

const MINUTE = 60_000;

/** Anything that raises suspects from matrices given in time order: the detector, or a baseline. */
export interface SuspectDetector {
  evaluate(time: number, matrix: FeatureMatrix, context?: EvaluationContext): { readonly suspects: readonly { readonly node: string }[] };
}

export interface FaultOutcome extends FaultLabel {
  /** First evaluation that raised the node within [onset, drained). */
  readonly firstRaised?: number;
  /** Minutes from that raise to the Xid: positive before the Xid, negative after. */
  readonly leadMinutes?: number;
}

export interface ReplayReport {
  readonly seed: number;
  readonly nodes: number;
  readonly days: number;
  readonly faults: readonly FaultOutcome[];
  readonly found: number;
  readonly detectionRate: number;
  readonly foundBeforeXid: number;
  /** Faults found before their Xid, as a share of all faults. */
  readonly beforeXidShare: number;
  /** Over the faults found; undefined when none was. */
  readonly leadMinutes: { readonly median: number; readonly mean: number } | undefined;
  /** Distinct raised episodes on nodes without a fault at the time (see runReplay). */
  readonly falseEpisodes: number;
  /** Of those, the ones that overlap a labelled benign transient. */
  readonly falseEpisodesOnBenignTransients: number;
  /** Node time present and outside every fault window. */
  readonly nodeDays: number;
  readonly falsePositivesPerNodeDay: number;
  /** falsePositivesPerNodeDay × 63, the report's cluster (002). */
  readonly falsePositivesPerDayAt63: number;
  readonly evaluations: number;
  /** Time spent inside the detector's evaluate(), ms. */
  readonly evaluateMs: number;
}

/** Raises of one node less than this far apart are one episode: one incident to an operator. */
export const EPISODE_GAP_MINUTES = 15;

function medianOf(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/** Per-detector bookkeeping of runReplay. */
class Scorer {
  readonly firstRaised = new Map<FaultLabel, number>();
  private readonly episodes = new Map<string, { start: number; last: number; attributed: boolean }>();
  falseEpisodes = 0;
  falseOnBenign = 0;
  evaluateMs = 0;

  constructor(
    private readonly replay: ClusterReplay,
    private readonly faultAt: (node: string, time: number) => FaultLabel | undefined,
    private readonly gapMs: number,
  ) {}

  raised(node: string, time: number): void {
    let episode = this.episodes.get(node);
    if (episode && time - episode.last > this.gapMs) {
      this.close(node, episode);
      episode = undefined;
    }
    if (!episode) {
      episode = { start: time, last: time, attributed: false };
      this.episodes.set(node, episode);
    }
    episode.last = time;
    const fault = this.faultAt(node, time);
    if (fault) {
      episode.attributed = true;
      if (!this.firstRaised.has(fault)) this.firstRaised.set(fault, time);
    }
  }

  finish(): void {
    for (const [node, episode] of this.episodes) this.close(node, episode);
    this.episodes.clear();
  }

  private close(node: string, episode: { start: number; last: number; attributed: boolean }): void {
    if (episode.attributed) return;
    this.falseEpisodes += 1;
    if (this.replay.benign.some((label) => label.node === node && label.start <= episode.last && label.end >= episode.start)) this.falseOnBenign += 1;
  }
}

/**
 * Runs each detector over the whole replay (one pass, the same frames for all) and scores it. A
 * fault is found when its node is raised at any evaluation in [onset, drained); its lead is Xid
 * time − first such raise. Every other raise is false: raises of one node closer than `gapMinutes`
 * form one episode, and an episode with no raise inside a fault window counts once, however many
 * minutes it lasts.
 */
export function runReplay(replay: ClusterReplay, detectors: readonly SuspectDetector[], gapMinutes = EPISODE_GAP_MINUTES): ReplayReport[] {
  const faultsByNode = new Map<string, FaultLabel[]>();
  for (const fault of replay.faults) faultsByNode.set(fault.node, [...(faultsByNode.get(fault.node) ?? []), fault]);
  const faultAt = (node: string, time: number) => faultsByNode.get(node)?.find((fault) => time >= fault.onset && time < fault.drained);
  const scorers = detectors.map(() => new Scorer(replay, faultAt, gapMinutes * MINUTE));
  const stepDays = replay.config.stepSeconds / 86_400;
  let nodeDays = 0;
  let evaluations = 0;

  for (const { time, matrix, groups } of replay.frames()) {
    evaluations += 1;
    for (const node of Object.keys(matrix)) if (!faultAt(node, time)) nodeDays += stepDays;
    detectors.forEach((detector, index) => {
      const scorer = scorers[index] as Scorer;
      const started = performance.now();
      const { suspects } = detector.evaluate(time, matrix, { groups });
      scorer.evaluateMs += performance.now() - started;
      for (const { node } of suspects) scorer.raised(node, time);
    });
  }

  return scorers.map((scorer) => {
    scorer.finish();
    const faults: FaultOutcome[] = replay.faults.map((fault) => {
      const raised = scorer.firstRaised.get(fault);
      return raised === undefined ? fault : { ...fault, firstRaised: raised, leadMinutes: (fault.xid - raised) / MINUTE };
    });
    const leads = faults.flatMap((fault) => (fault.leadMinutes === undefined ? [] : [fault.leadMinutes]));
    const foundBeforeXid = leads.filter((lead) => lead > 0).length;
    const perNodeDay = nodeDays > 0 ? scorer.falseEpisodes / nodeDays : 0;
    return {
      seed: replay.config.seed,
      nodes: replay.config.nodes,
      days: replay.config.days,
      faults,
      found: leads.length,
      detectionRate: faults.length > 0 ? leads.length / faults.length : 1,
      foundBeforeXid,
      beforeXidShare: faults.length > 0 ? foundBeforeXid / faults.length : 0,
      leadMinutes: leads.length > 0 ? { median: medianOf(leads), mean: leads.reduce((sum, lead) => sum + lead, 0) / leads.length } : undefined,
      falseEpisodes: scorer.falseEpisodes,
      falseEpisodesOnBenignTransients: scorer.falseOnBenign,
      nodeDays,
      falsePositivesPerNodeDay: perNodeDay,
      falsePositivesPerDayAt63: perNodeDay * 63,
      evaluations,
      evaluateMs: scorer.evaluateMs,
    };
  });
}

/**
 * Baseline: the Xid counter alone, a node raised while it logged any Xid line in the last 5 minutes,
 * application Xids included (the feature counts every severity; the fast path acts on fatal ones).
 */
export class XidCounterBaseline implements SuspectDetector {
  evaluate(_time: number, matrix: FeatureMatrix): { suspects: { node: string }[] } {
    return {
      suspects: Object.entries(matrix)
        .filter(([, row]) => highest(row[ANY_XID_5M]) > 0)
        .map(([node]) => ({ node })),
    };
  }
}

/** Baseline: one threshold on one metric held for a while, like the SteadfastGpuTemperatureHigh alert. */
export class ThresholdBaseline implements SuspectDetector {
  private readonly runs = new Map<string, number>();
  constructor(
    private readonly feature: string,
    private readonly above: number,
    private readonly forSteps: number,
  ) {}

  evaluate(_time: number, matrix: FeatureMatrix): { suspects: { node: string }[] } {
    const suspects: { node: string }[] = [];
    for (const [node, row] of Object.entries(matrix)) {
      const value = row[this.feature];
      const run = value !== undefined && highest(value) > this.above ? (this.runs.get(node) ?? 0) + 1 : 0;
      this.runs.set(node, run);
      if (run > this.forSteps) suspects.push({ node });
    }
    return { suspects };
  }
}

/** A node's highest reading of a feature (one per device, or node-wide). */
function highest(value: FeatureValue | undefined): number {
  if (value === undefined) return Number.NEGATIVE_INFINITY;
  return typeof value === 'number' ? value : Math.max(...value);
}
