import { PrometheusQueryRejectedError, PrometheusUnavailableError } from '../../core/prometheus.js';
import { MultiSignalDetector } from './detector.js';
import type { Evidence, EvaluationContext, GroupReport, Suspect } from './types.js';
import { detectorFeatures, type FeatureQuery } from './features.js';
import { PrometheusFeatureSource, type FeatureReading } from './source.js';

/**
 * The detector replayed over a past window of Prometheus data, as `steadfast detect suspects`
 * does and as the benches measure it: the nodes' own normals learnt over the readings before the
 * window, then one evaluation per step.
 */

export const PEER_MODES = ['training-job', 'all'] as const;
export type PeerMode = (typeof PEER_MODES)[number];

export interface SuspectsWindow {
  readonly end: number;
  readonly steps: number;
  readonly stepMs: number;
  readonly only?: ReadonlySet<string> | undefined;
  readonly peers?: PeerMode;
  readonly warmupSteps?: number;
  readonly warmupStepMs?: number;
}

export interface SuspectsReport {
  from: string;
  to: string;
  evaluations: number;
  suspects: Suspect[];
  nodes: { node: string; group: string | undefined; anomalousIn: number; worstScore: number; evidence: readonly Evidence[] }[];
  peers: {
    mode: PeerMode;
    groups: Pick<GroupReport, 'group' | 'members' | 'peerScored' | 'reason'>[];
    ungrouped: string[];
    conflicts: string[];
    phases: number;
  };
  silent: string[];
  missing: { feature: string; reason: string }[];
  failures: string[];
  notes: string[];
  baseline: { readings: number; from?: string };
}

/**
 * Replays the detector over `steps` evaluations ending at `end`, after learning the nodes' own
 * normals over `warmupSteps` readings before: what it would have raised, and for every node how
 * often it stood out, worst first. Features Prometheus could not answer are listed, not fatal;
 * when no query answered at all it throws (exit 1), never reports an empty window as healthy.
 */
export async function suspectsOverWindow(source: PrometheusFeatureSource, window: SuspectsWindow): Promise<SuspectsReport> {
  const peers = window.peers ?? 'training-job';
  const detector = new MultiSignalDetector({ features: detectorFeatures(source.features) });
  const tally = new Map<string, { group: string | undefined; anomalousIn: number; worstScore: number; evidence: readonly Evidence[] }>();
  const failures = new Map<string, PrometheusUnavailableError | PrometheusQueryRejectedError>();
  const raised = new Map<string, Suspect>();
  const everAnswered = new Set<string>();
  const everFilled = new Set<string>();
  const groupReports = new Map<string, Pick<GroupReport, 'group' | 'members' | 'peerScored' | 'reason'>>();
  const ungrouped = new Set<string>();
  const conflicts = new Set<string>();
  const silent = new Set<string>();
  const readWarnings = new Set<string>();
  let phases = 0;

  const readAt = async (time: number): Promise<{ reading: FeatureReading; context: EvaluationContext }> => {
    const reading = await source.read(time);
    for (const failure of reading.failures) failures.set(failure.message, failure);
    reading.answered.forEach((feature) => everAnswered.add(feature));
    reading.answered.filter((feature) => !reading.empty.includes(feature)).forEach((feature) => everFilled.add(feature));
    reading.warnings.forEach((warning) => readWarnings.add(warning));
    const matrix = window.only ? Object.fromEntries(Object.entries(reading.matrix).filter(([node]) => window.only?.has(node))) : reading.matrix;
    let context: EvaluationContext = {};
    if (window.only) context = { groups: Object.fromEntries([...window.only].map((node) => [node, 'nodes'])) };
    else if (peers === 'training-job') {
      try {
        const grouping = await source.readGroups(time, reading.stopped);
        grouping.conflicts.forEach((node) => conflicts.add(node));
        context = { groups: grouping.groups };
      } catch (error) {
        if (!(error instanceof PrometheusUnavailableError || error instanceof PrometheusQueryRejectedError)) throw error;
        failures.set(error.message, error);
        context = { groups: {} };
      }
    }
    return { reading: { ...reading, matrix }, context };
  };

  const warmupStepMs = window.warmupStepMs ?? 600_000;
  const start = window.end - (window.steps - 1) * window.stepMs;
  let learnt = 0;
  for (let step = window.warmupSteps ?? 0; step >= 1; step -= 1) {
    const time = start - step * warmupStepMs;
    const { reading, context } = await readAt(time);
    if (Object.keys(reading.matrix).length === 0) continue;
    detector.learn(time, reading.matrix, context);
    learnt += 1;
  }

  for (let step = 0; step < window.steps; step += 1) {
    const time = start + step * window.stepMs;
    const { reading, context } = await readAt(time);
    const evaluation = detector.evaluate(time, reading.matrix, context);
    for (const group of evaluation.groups) {
      if (group.group !== '')
        groupReports.set(group.group, {
          group: group.group,
          members: group.members,
          peerScored: group.peerScored,
          ...(group.reason ? { reason: group.reason } : {}),
        });
      if (group.phase) phases += 1;
    }
    evaluation.ungrouped.forEach((node) => ungrouped.add(node));
    evaluation.silent.forEach((node) => silent.add(node));
    for (const verdict of evaluation.verdicts) {
      if (!verdict.anomalous) continue;
      const entry = tally.get(verdict.node) ?? { group: verdict.group, anomalousIn: 0, worstScore: 0, evidence: [] };
      entry.anomalousIn += 1;
      if (verdict.score >= entry.worstScore) Object.assign(entry, { worstScore: verdict.score, evidence: verdict.evidence });
      tally.set(verdict.node, entry);
    }
    for (const suspect of evaluation.suspects) if (!raised.has(suspect.node)) raised.set(suspect.node, suspect);
  }

  if (everAnswered.size === 0 && failures.size > 0) {
    const all = [...failures.values()];
    const message = `every query failed:\n${all.map((failure) => `- ${failure.message}`).join('\n')}`;
    const queries = all.flatMap((failure) => failure.queries);
    throw all.some((failure) => failure instanceof PrometheusUnavailableError)
      ? new PrometheusUnavailableError(message, queries)
      : new PrometheusQueryRejectedError(message, queries);
  }

  const missing: { feature: string; reason: string }[] = [];
  for (const feature of source.features as readonly FeatureQuery[]) {
    if (everAnswered.has(feature.name) && !everFilled.has(feature.name))
      missing.push({ feature: feature.name, reason: await source.whyMissing(feature, window.end) });
  }
  const notes: string[] = [];
  const groups = [...groupReports.values()];
  if (!groups.some((group) => group.peerScored)) {
    notes.push(
      peers === 'training-job' && groups.length === 0
        ? `no node carried the ${source.labels.trainingJobLabel} label, so none was compared with peers (only fatal or repeated Xids and known-meaning levels were judged); give --nodes or --peers all if the nodes do the same work`
        : 'no group had enough nodes reporting to compare them with each other; only fatal or repeated Xids and known-meaning levels were judged',
    );
  }
  if (missing.length === source.features.length) notes.push('no feature had any data in the window: a healthy-looking answer here means nothing');
  const shownWarnings = [...readWarnings];
  notes.push(...shownWarnings.slice(0, 10), ...(shownWarnings.length > 10 ? [`… and ${shownWarnings.length - 10} more warnings about the data`] : []));
  const nodes = [...tally.entries()].map(([node, entry]) => ({ node, ...entry })).sort((a, b) => b.anomalousIn - a.anomalousIn || b.worstScore - a.worstScore);
  return {
    from: new Date(start).toISOString(),
    to: new Date(window.end).toISOString(),
    evaluations: window.steps,
    suspects: [...raised.values()],
    nodes,
    peers: { mode: window.only ? 'all' : peers, groups, ungrouped: [...ungrouped].sort(), conflicts: [...conflicts], phases },
    silent: [...silent].sort(),
    missing,
    failures: [...failures.keys()],
    notes,
    baseline: { readings: learnt, ...(learnt > 0 ? { from: new Date(start - (window.warmupSteps ?? 0) * warmupStepMs).toISOString() } : {}) },
  };
}
