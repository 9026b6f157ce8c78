import type { JobSpec } from '../../core/job.js';
import { faultFingerprint, newSignalId, type Signal } from '../../core/signal.js';
import { MultiSignalDetector } from '../multisignal/detector.js';
import type { Evidence, FeatureMatrix, Suspect } from '../multisignal/types.js';
import { type FeatureReading, type FeatureSource } from '../multisignal/source.js';
import { detectorFeatures } from '../multisignal/features.js';

/**
 * Multi-signal detection online (the 504-GPU report): every run reads all nodes' features from
 * Prometheus once, then scores each registered job's nodes against each other — peers doing the
 * same synchronous work, which is what makes "unlike its peers" mean something (an idle node is
 * unlike a busy one for no fault of its own). A node that stays unlike its peers becomes a
 * `suspect_node` signal for the policy: the job's recovery ladder hands it to stack aggregation,
 * which evicts only on evidence (ByteRobust §5). A node is raised at most once per hold-off.
 */

/** The feature that says a node is at training work (multisignal/source.ts). */
const TRAINING_FEATURE = 'training_iteration_seconds';

/** A node raised once is not raised again for this long while it stays suspect. */
const RAISE_HOLD_OFF_MS = 3600_000;

/** What a job's detector learns from before it judges: readings of the past, `everyMs` apart. */
export interface WatchWarmup {
  readonly readings: number;
  readonly everyMs: number;
}

/**
 * Two hours of history, a reading every 10 minutes: twelve samples of each node's own normal (the
 * detector needs six), read once when the controller starts watching a job.
 */
export const DEFAULT_WATCH_WARMUP: WatchWarmup = { readings: 12, everyMs: 600_000 };

export interface SuspectWatchDeps {
  readonly source: FeatureSource;
  readonly enqueue: (signals: readonly Signal[]) => Promise<void>;
  readonly warmup?: WatchWarmup;
}

export class SuspectWatch {
  private readonly detectors = new Map<string, MultiSignalDetector>();
  private readonly raised = new Map<string, number>();

  constructor(private readonly deps: SuspectWatchDeps) {}

  /**
   * A job's detector, made on the first run that sees the job. Nodes are judged against their
   * peers only once their own normal is learnt (ownNormalFirst): a node that simply runs warmer
   * than its peers would otherwise be raised by every controller start. So a new detector first
   * learns from the job's nodes' history in Prometheus (the warm-up readings); a node without
   * history there is learnt online, judged meanwhile on known-meaning levels and silence only.
   */
  private async detector(spec: JobSpec, now: number, past: (time: number) => Promise<FeatureReading | undefined>): Promise<MultiSignalDetector> {
    const known = this.detectors.get(spec.name);
    if (known) return known;
    const detector = new MultiSignalDetector({ features: detectorFeatures(), ownNormalFirst: true });
    this.detectors.set(spec.name, detector);
    const { readings, everyMs } = this.deps.warmup ?? DEFAULT_WATCH_WARMUP;
    for (let back = readings; back >= 1; back -= 1) {
      const time = now - back * everyMs;
      const reading = await past(time);
      if (reading) detector.learn(time, trainingRows(jobMatrix(spec, reading), reading.matrix), { groups: jobGroups(spec) });
    }
    return detector;
  }

  /** One run over the given jobs; returns the signals raised. */
  async run(jobs: readonly JobSpec[], now = Date.now()): Promise<Signal[]> {
    const reading: FeatureReading = await this.deps.source.read(now);
    // Readings of the past, for the warm-up of jobs seen for the first time, shared between them.
    const pastReadings = new Map<number, Promise<FeatureReading | undefined>>();
    const past = (time: number) => {
      let pending = pastReadings.get(time);
      // History that cannot be read leaves the node to be learnt online.
      if (!pending) pastReadings.set(time, (pending = this.deps.source.read(time).catch(() => undefined)));
      return pending;
    };
    const signals: Signal[] = [];
    for (const spec of jobs) {
      const detector = await this.detector(spec, now, past);
      // The job's nodes are its members: one of them that stops reporting while the others
      // report is raised for its silence.
      const evaluation = detector.evaluate(now, jobMatrix(spec, reading), { groups: jobGroups(spec) });
      for (const suspect of evaluation.suspects) {
        const last = this.raised.get(`${spec.name}/${suspect.node}`);
        if (last !== undefined && now - last < RAISE_HOLD_OFF_MS) continue;
        this.raised.set(`${spec.name}/${suspect.node}`, now);
        signals.push(suspectSignal(spec.name, suspect, now));
      }
    }
    // Jobs that are gone take their history with them.
    for (const job of this.detectors.keys()) if (!jobs.some((spec) => spec.name === job)) this.detectors.delete(job);
    if (signals.length > 0) await this.deps.enqueue(signals);
    return signals;
  }
}

function jobMatrix(spec: JobSpec, reading: FeatureReading): FeatureMatrix {
  const matrix: Record<string, FeatureMatrix[string]> = {};
  for (const node of spec.nodes) {
    const row = reading.matrix[node];
    if (row) matrix[node] = row;
  }
  return matrix;
}

/**
 * The rows of a past reading that show a node at training work: where the fleet reports iteration
 * times at all, only nodes that reported one then. A job's nodes that sat idle (or were not yet
 * in the job) before it started have another normal than the one the job gives them: learnt from
 * that history, a node on a lighter pipeline stage was judged as changed the moment the job began.
 * Nodes left out are learnt online, over their first half hour in the job.
 */
function trainingRows(matrix: FeatureMatrix, fleet: FeatureMatrix): FeatureMatrix {
  const reports = (row: FeatureMatrix[string] | undefined) => row?.[TRAINING_FEATURE] !== undefined;
  if (!Object.values(fleet).some(reports)) return matrix;
  return Object.fromEntries(Object.entries(matrix).filter(([, row]) => reports(row)));
}

function jobGroups(spec: JobSpec): Record<string, string> {
  return Object.fromEntries(spec.nodes.map((node) => [node, spec.name]));
}

function suspectSignal(job: string, suspect: Suspect, now: number): Signal {
  const time = new Date(now).toISOString();
  const evidence: Record<string, string | number> = {
    score: Number(suspect.score.toFixed(2)),
    anomalousIn: suspect.anomalousIn,
    since: new Date(suspect.since).toISOString(),
    reason: suspect.reason,
  };
  for (const item of suspect.evidence.slice(0, 8)) evidence[`feature.${item.feature}`] = describeEvidence(item);
  return {
    id: newSignalId(),
    kind: 'suspect_node',
    node: suspect.node,
    job,
    severity: 'warning',
    time,
    receivedAt: time,
    // One fault per node and hold-off window: repeats of the same suspicion collapse.
    fingerprint: faultFingerprint({ kind: 'suspect_node', node: suspect.node, detail: String(Math.floor(now / RAISE_HOLD_OFF_MS)) }),
    source: 'analyzer',
    evidence,
  };
}

/** One line of evidence for a signal: the value, and against what it stood out. */
export function describeEvidence(item: Evidence): string {
  const device = item.device === undefined ? '' : ` on device ${item.device}`;
  if (item.kind === 'silence') return `no readings for ${item.value} evaluation(s) while the job's other nodes reported`;
  if (item.kind === 'alarm' || item.kind === 'raise') return `${item.value}${device} (at its ${item.kind === 'raise' ? 'raise' : 'alarm'} level)`;
  return `${item.value}${device} (peers ${item.peerMedian}, z ${item.robustZ.toFixed(1)})`;
}
