import { InputError } from '../../core/errors.js';
import { NodeBaselines, VerdictRing } from './memory.js';
import { activityOnly, peerAnomalous, peerOutlier, scoreGroup, type GroupMoment } from './scoring.js';
import { multiSignalSettings, type MultiSignalOptions, type MultiSignalSettings } from './settings.js';
import type { Evaluation, EvaluationContext, FeatureMatrix, GroupReport, NodeVerdict, RaiseReason, Suspect } from './types.js';

/**
 * Multi-signal "suspect node" detection, after the 504-GPU operations report ("From Detection to
 * Recovery: Operational Analysis on LLM Pre-training with 504 GPUs", first finding): its
 * statistical analysis over hundreds of Prometheus metrics found all 10 Xid-identified GPU
 * failures of a 63-node cluster, 2 of them before the Xid, at about 0.84 false positives a day,
 * and no single metric was dominant across failure types. So a node is judged on many signals at
 * once (GPU, Xid, RDMA, NFS, training), each against its peers at the same moment.
 *
 * Peers are the nodes doing the same work at the same time: one training job's nodes (the
 * controller's job registry, the `training_job` label in Prometheus). A synchronous job puts the
 * same load on each of them, so what moves the whole job at once (evaluation phases, checkpoint
 * stalls on NFS, job-wide slowdowns, diurnal inlet temperature) is common mode and says nothing
 * about one machine; an idle node, or one in another job, is unlike them for no fault of its own.
 * Nodes that cannot be grouped are not peer-scored (only the known-meaning levels below apply)
 * and the evaluation lists them. A moment where more than maxAnomalousShare of a group stands out
 * is the job's own phase: no peer evidence counts in it (scoring.ts scores a group).
 *
 * Per moment, feature and device (scoring): peer median m and MAD over every device of the
 * group, scale s = max(1.4826·MAD, relativeSpread·|m|, minSpread), peer z = (value − m)/s; minus
 * the node's own usual z on that device (memory.ts: a node that is simply different
 * is not flagged again and again); the residual rescaled by its spread across the group, and
 * counted only where the device is also on the bad side of its peers now (minPeerZ: a node that
 * usually runs cooler is no suspect for matching its peers while its job idles). A node's
 * feature is its worst device's. Combination: a feature is hot at badness ≥ hotZ; the node's
 * moment is anomalous when it has minHotFeatures hot features scoring ≥ minScore (each clipped at
 * clipZ, so one wild counter does not make a score), or one feature at ≥ strongZ, or a feature at
 * its known-meaning alarm level (alarmAt: correctable ECC climbing to hundreds an hour, PCIe
 * replays about one a second, a pending row remap, InfiniBand symbol errors) whatever the peers
 * read. A feature at its raiseAt level (a fatal Xid, repeated Xids) raises the node at once: the
 * detector never finds fewer failures than the Xid counter alone.
 *
 * Persistence: a node is raised when anomalous in k of the last n evaluations (7 of 9: benign
 * one-node blips last one to a few scrapes, precursors tens of minutes), or in episodes.count of
 * the last episodes.window evaluations spread over at least two episodes (power-brake throttling
 * a minute or two at a time is short each time but keeps coming back), or at once on a raiseAt
 * level. A member of a group that stops reporting while its peers report (silenceEvaluations in
 * a row) is raised too: silence in a running job is evidence, not absence.
 * bench/multisignal.ts reports the labelled replay these defaults were chosen on.
 */

/** The group of a matrix evaluated without a context: every node in it, as one job. */
export const ONE_GROUP = 'all';

/** Scores every node of one moment against the others as one group, with no memory (pure). */
export function scoreMoment(matrix: FeatureMatrix, settings: MultiSignalSettings): GroupMoment & { skipped?: string } {
  const nodes = Object.keys(matrix).sort();
  const moment = scoreGroup(nodes, matrix, settings, undefined, true);
  return moment.peerScored ? moment : { ...moment, skipped: tooFew(nodes.length, nodes.length, settings) };
}

function tooFew(present: number, members: number, settings: MultiSignalSettings): string {
  return `${present} of ${members} node(s) reported; at least ${settings.minPeers} are needed to judge a node against its peers`;
}

interface NodeHistory {
  readonly verdicts: VerdictRing;
  /** Moments the node stood out on activity features only. */
  readonly activity: VerdictRing;
  raisedSince: number | undefined;
  latest: NodeVerdict | undefined;
  silentSince: number | undefined;
  silentFor: number;
  /** Evaluations in a row the node was missing without being a silent member of a group. */
  absentFor: number;
  /** The last evaluation with raise-level evidence. */
  raiseTime: number | undefined;
}

/**
 * Holds what persistence and the nodes' own normals need; each moment is scoreGroup. Times must
 * not go backwards; an evaluation at the same time as the last one replaces it, so a retried job
 * does not count one moment twice.
 */
export class MultiSignalDetector {
  readonly settings: MultiSignalSettings;
  private readonly history = new Map<string, NodeHistory>();
  private readonly baselines: NodeBaselines;
  private lastTime: number | undefined;

  constructor(options: MultiSignalOptions) {
    this.settings = multiSignalSettings(options);
    const { everyMinutes, samples, minSamples } = this.settings.baseline;
    this.baselines = new NodeBaselines({ everyMs: everyMinutes * 60_000, samples, minSamples });
  }

  /** Learns the nodes' own normals from a past moment without judging it (a warm-up over history). */
  learn(time: number, matrix: FeatureMatrix, context: EvaluationContext = {}): void {
    this.checkTime(time);
    for (const { group, moment, phase } of this.scoreGroups(matrix, context).scored) {
      if (phase || !group.peerScored) continue;
      for (const node of moment.nodes) this.baselines.offer(node.node, time, node.peerZ);
    }
  }

  evaluate(time: number, matrix: FeatureMatrix, context: EvaluationContext = {}): Evaluation {
    this.checkTime(time);
    const { scored, ungrouped, silentMembers } = this.scoreGroups(matrix, context);
    const { k, n } = this.settings.persistence;
    const verdicts: NodeVerdict[] = [];
    const present = new Set<string>();
    const groups: GroupReport[] = [];
    const skippedFeatures = new Set<string>();

    for (const { group, moment, phase } of scored) {
      groups.push(group);
      moment.skippedFeatures.forEach((feature) => skippedFeatures.add(feature));
      for (const node of moment.nodes) {
        const judged = !phase && group.peerScored && (!this.settings.ownNormalFirst || this.baselines.learnt(node.node));
        const peerEvidence = judged && peerAnomalous(node, this.settings);
        const anomalous = node.alarm || peerEvidence;
        const activity = judged && !anomalous && activityOnly(node, this.settings);
        // Peer evidence that was not judged (a job-wide phase, a node whose normal is not learnt yet) is not shown either.
        const evidence = judged ? node.evidence : node.evidence.filter((item) => item.kind !== 'peer');
        const verdict: NodeVerdict = {
          node: node.node,
          group: group.group === '' ? undefined : group.group,
          score: judged ? node.score : 0,
          anomalous,
          evidence,
        };
        verdicts.push(verdict);
        present.add(node.node);
        const history = this.record(node.node, time, verdict, node.raise, activity);
        const raised = history.raisedSince !== undefined;
        // Until a node's normal is learnt it is sampled whatever it shows (a node that is simply
        // different is raised at first and would otherwise never be learnt); after that, only calm moments.
        if (!phase && group.peerScored && (!this.baselines.learnt(node.node) || (!raised && !anomalous && !activity)))
          this.baselines.offer(node.node, time, node.peerZ);
      }
    }

    // A member silent since before this detector first saw it (a window that starts after it went
    // quiet, a controller restarted meanwhile) is as silent as one it saw go.
    for (const node of silentMembers.keys()) if (!this.history.has(node)) this.history.set(node, emptyHistory(this.settings));
    const suspects: Suspect[] = [];
    for (const [node, history] of this.history) {
      const silent = silentMembers.get(node);
      if (!present.has(node)) {
        if (silent === undefined) {
          // Gone from the fleet (drained, out of every group): a short gap keeps its recent
          // verdicts, but one that outlasts the persistence window ends them, so a node back from
          // repair starts clean instead of being raised again on what it showed before it left.
          history.silentFor = 0;
          history.absentFor += 1;
          if (history.verdicts.count(history.verdicts.length) === 0 || history.absentFor > n) this.history.delete(node);
          continue;
        }
        if (history.silentSince !== time) {
          history.silentFor += 1;
          history.silentSince = time;
        }
      }
      const raiseNow = present.has(node) && history.raiseTime === time;
      const reason: RaiseReason | undefined = raiseNow
        ? 'raise'
        : history.silentFor >= this.settings.silenceEvaluations
          ? 'silence'
          : present.has(node) && history.verdicts.count(n) >= k
            ? 'persistent'
            : present.has(node) &&
                history.verdicts.count(this.settings.episodes.window) >= this.settings.episodes.count &&
                history.verdicts.episodes(this.settings.episodes.window) >= 2
              ? 'episodes'
              : present.has(node) && history.activity.count(this.settings.activityPersistence.n) >= this.settings.activityPersistence.k
                ? 'activity'
                : undefined;
      if (reason === undefined) {
        history.raisedSince = undefined;
        continue;
      }
      history.raisedSince ??= time;
      const latest = reason === 'silence' ? silenceVerdict(node, silent, history.silentFor) : (history.latest as NodeVerdict);
      suspects.push({
        node,
        group: latest.group,
        score: latest.score,
        evidence: latest.evidence,
        since: history.raisedSince,
        anomalousIn: history.verdicts.count(n),
        reason,
      });
    }
    this.baselines.prune(time, 2 * this.settings.baseline.samples * this.settings.baseline.everyMinutes * 60_000);

    suspects.sort((a, b) => b.score - a.score || (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
    verdicts.sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
    const peerScored = groups.some((group) => group.peerScored);
    return {
      time,
      suspects,
      anomalous: verdicts.filter((verdict) => verdict.anomalous).map((verdict) => verdict.node),
      verdicts,
      groups,
      ungrouped,
      silent: [...silentMembers.keys()].sort(),
      skippedFeatures: [...skippedFeatures],
      ...(peerScored
        ? {}
        : { skipped: groups.length === 0 ? 'no node could be grouped with peers' : groups.map((group) => `${group.group}: ${group.reason ?? ''}`).join('; ') }),
    };
  }

  private checkTime(time: number): void {
    if (!Number.isFinite(time)) throw new InputError(`evaluation time must be a finite number, got ${time}`, 'time');
    if (this.lastTime !== undefined && time < this.lastTime) {
      throw new InputError(`evaluation time ${time} is before the previous evaluation at ${this.lastTime}`, 'time');
    }
    this.lastTime = time;
  }

  private record(node: string, time: number, verdict: NodeVerdict, raise: boolean, activity: boolean): NodeHistory {
    let history = this.history.get(node);
    if (!history) {
      history = emptyHistory(this.settings);
      this.history.set(node, history);
    }
    if (history.raisedSince === time) history.raisedSince = undefined;
    history.verdicts.push(time, verdict.anomalous);
    history.activity.push(time, activity);
    history.silentFor = 0;
    history.absentFor = 0;
    if (verdict.anomalous || raise || activity) history.latest = verdict;
    if (raise) history.raiseTime = time;
    return history;
  }

  /** Splits the matrix into peer groups and scores each; nodes of no group are judged without peers. */
  private scoreGroups(matrix: FeatureMatrix, context: EvaluationContext) {
    const members = new Map<string, string[]>();
    const ungrouped: string[] = [];
    if (context.groups === undefined) {
      members.set(ONE_GROUP, Object.keys(matrix));
    } else {
      for (const [node, group] of Object.entries(context.groups)) members.set(group, [...(members.get(group) ?? []), node]);
      for (const node of Object.keys(matrix)) if (!Object.hasOwn(context.groups, node)) ungrouped.push(node);
    }
    const scored: { group: GroupReport; moment: GroupMoment; phase: boolean }[] = [];
    const silentMembers = new Map<string, string>();
    for (const [group, nodes] of [...members].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
      const present = nodes.filter((node) => matrix[node] !== undefined).sort();
      const moment = scoreGroup(present, matrix, this.settings, this.baselines, true);
      // A phase is whatever moves many of the group at once, activity included.
      const anomalousOnPeers = moment.peerScored ? moment.nodes.filter((node) => peerOutlier(node, this.settings)).length : 0;
      const phase = anomalousOnPeers >= 2 && anomalousOnPeers > this.settings.maxAnomalousShare * present.length;
      const report: GroupReport = {
        group,
        nodes: present.length,
        members: nodes.length,
        peerScored: moment.peerScored,
        phase,
        ...(moment.peerScored ? {} : { reason: tooFew(present.length, nodes.length, this.settings) }),
      };
      scored.push({ group: report, moment, phase });
      // Silence counts only where the group itself still reports: a whole job gone quiet is the job.
      if (moment.peerScored && context.groups !== undefined) for (const node of nodes) if (matrix[node] === undefined) silentMembers.set(node, group);
    }
    if (ungrouped.length > 0) {
      const moment = scoreGroup(ungrouped.sort(), matrix, this.settings, undefined, false);
      scored.push({
        group: {
          group: '',
          nodes: ungrouped.length,
          members: ungrouped.length,
          peerScored: false,
          phase: false,
          reason: 'no training job: not compared with peers',
        },
        moment,
        phase: false,
      });
    }
    return { scored, ungrouped, silentMembers };
  }
}

function emptyHistory(settings: MultiSignalSettings): NodeHistory {
  const length = Math.max(settings.persistence.n, settings.episodes.window, settings.activityPersistence.n);
  return {
    verdicts: new VerdictRing(length),
    activity: new VerdictRing(length),
    raisedSince: undefined,
    latest: undefined,
    silentSince: undefined,
    silentFor: 0,
    absentFor: 0,
    raiseTime: undefined,
  };
}

function silenceVerdict(node: string, group: string | undefined, evaluations: number): NodeVerdict {
  return {
    node,
    group,
    score: 0,
    anomalous: true,
    evidence: [{ feature: 'silence', value: evaluations, peerMedian: 0, robustZ: Number.NaN, kind: 'silence' }],
  };
}
