import { z } from 'zod';
import { nodeNameSchema } from '../../core/names.js';
import { escapeRegex } from '../../core/promql.js';
import {
  PrometheusQueryRejectedError,
  PrometheusUnavailableError,
  instantQuery,
  type InstantSample,
  type PrometheusQueryFailure,
} from '../../core/prometheus.js';
import { prometheusLabelNameSchema, scrapeJobSchema } from '../../core/detector-labels.js';
import { TRAINING_JOB_LABEL } from '../../core/scrape.js';
import { parseOrThrow } from '../../core/validate.js';
import type { MultiSignalDetector } from './detector.js';
import { DEFAULT_LABELS, defaultFeatureQueries, type FeatureLabels, type FeatureQuery } from './features.js';
import { featureSpecSchema } from './settings.js';
import type { Evaluation, EvaluationContext, FeatureMatrix } from './types.js';

/**
 * The multi-signal detector's input, read from Prometheus' HTTP API: one instant query per
 * feature (`GET /api/v1/query?query=…&time=…`), each answering one value per node (`by (node)`;
 * the scrape adds `node` to the agents' series), assembled into the node × feature matrix that
 * analyzers/multisignal/detector.ts scores. The 504-GPU report (002, first finding) detects over the
 * metrics the cluster already had in Prometheus; these features are the agents' own metrics.
 */

export interface FeatureReading {
  readonly matrix: FeatureMatrix;
  /** Features whose query answered (possibly with no series). */
  readonly answered: readonly string[];
  /** Features whose query answered with no series at all. */
  readonly empty: readonly string[];
  /** Feature queries that gave nothing; the matrix holds the others. */
  readonly failures: readonly PrometheusQueryFailure[];
  /** Series that were left out (a node label that is no node name). */
  readonly warnings: readonly string[];
  /**
   * Nodes left out of the matrix because they no longer report, though a feature over a long
   * window (an hour's increase) still carried their past values: their silence must count.
   */
  readonly stopped?: readonly string[];
}

/** Whatever supplies the matrix at a time (Prometheus here; a replay in the evaluation). */
export interface FeatureSource {
  read(time: number): Promise<FeatureReading>;
}

const sourceOptionsSchema = z
  .object({
    /** Prometheus' base URL, e.g. http://prometheus:9090 (a path prefix is kept). */
    url: z.url(),
    timeoutMs: z.int().positive().default(10_000),
    /** The scrape job of the node metrics (several as `a|b`), for the default features. */
    agentJob: scrapeJobSchema.default(DEFAULT_LABELS.agentJob),
    /** The label naming the node on every node series. */
    nodeLabel: prometheusLabelNameSchema.default(DEFAULT_LABELS.nodeLabel),
    /** The label naming the training job on the series of a job's nodes (peer groups). */
    trainingJobLabel: prometheusLabelNameSchema.default(TRAINING_JOB_LABEL),
    features: z
      .array(
        featureSpecSchema.extend({
          query: z.string().min(1),
          deviceLabel: prometheusLabelNameSchema.optional(),
          metric: z
            .string()
            .regex(/^[a-zA-Z_:][a-zA-Z0-9_:]*$/)
            .optional(),
        }),
      )
      .min(1)
      .refine((features) => new Set(features.map((feature) => feature.name)).size === features.length, 'feature names must be unique')
      .optional(),
  })
  .strict();

export type PrometheusSourceOptions = z.input<typeof sourceOptionsSchema>;

type QueryOutcome = { ok: true; values: Map<string, number[]>; warnings: string[] } | { ok: false; error: PrometheusQueryFailure };

export class PrometheusFeatureSource implements FeatureSource {
  readonly features: readonly FeatureQuery[];
  readonly labels: FeatureLabels & { readonly trainingJobLabel: string };
  private readonly url: string;
  private readonly timeoutMs: number;

  constructor(options: PrometheusSourceOptions) {
    const parsed = parseOrThrow(sourceOptionsSchema, options, 'Prometheus feature source options');
    this.url = parsed.url.replace(/\/+$/, '');
    this.timeoutMs = parsed.timeoutMs;
    this.labels = { agentJob: parsed.agentJob, nodeLabel: parsed.nodeLabel, trainingJobLabel: parsed.trainingJobLabel };
    this.features = parsed.features ?? defaultFeatureQueries(this.labels);
  }

  /** Every feature at `time` (ms since the epoch). Never throws: what failed is in `failures`. */
  async read(time: number): Promise<FeatureReading> {
    const [live, ...settled] = await Promise.all([this.readLive(time), ...this.features.map((feature) => this.queryFeature(feature, time))]);
    const rows = new Map<string, Record<string, number | number[]>>();
    const answered: string[] = [];
    const empty: string[] = [];
    const failures: PrometheusQueryFailure[] = [];
    const warnings: string[] = [];
    settled.forEach((outcome, index) => {
      const feature = this.features[index] as FeatureQuery;
      if (!outcome.ok) {
        failures.push(outcome.error);
        return;
      }
      answered.push(feature.name);
      if (outcome.values.size === 0) empty.push(feature.name);
      warnings.push(...outcome.warnings);
      for (const [node, values] of outcome.values) {
        let row = rows.get(node);
        if (!row) rows.set(node, (row = {}));
        row[feature.name] = feature.deviceLabel === undefined ? (values[0] as number) : values;
      }
    });
    const stopped: string[] = [];
    if (live === undefined) {
      warnings.push(
        `cannot tell which nodes stopped reporting (no steadfast_collector_success or up series of job ${this.labels.agentJob} with a ${this.labels.nodeLabel} label): a node that went quiet is judged on what its longer windows still hold`,
      );
    } else {
      for (const node of [...rows.keys()]) {
        if (live.has(node)) continue;
        rows.delete(node);
        stopped.push(node);
      }
    }
    return { matrix: Object.fromEntries(rows), answered, empty, failures, warnings, stopped: stopped.sort() };
  }

  /**
   * The nodes whose agent answered its last scrape: what `up` says, or the agent's own
   * steadfast_collector_success (backfilled data has no `up`). A feature over a long window (an
   * hour's increase, the Xid count over an hour) still holds values of a node that went quiet
   * long after it stopped; only these say it is there now. Undefined when neither series carries
   * the node label (then every node with any feature value counts as present).
   */
  async readLive(time: number): Promise<Set<string> | undefined> {
    const { nodeLabel, agentJob } = this.labels;
    const job = agentJob.includes('|') ? `job=~${JSON.stringify(agentJob)}` : `job=${JSON.stringify(agentJob)}`;
    const query = `group by (${nodeLabel}) (steadfast_collector_success{${job}}) or group by (${nodeLabel}) (up{${job}} == 1)`;
    let samples: InstantSample[];
    try {
      samples = await instantQuery(this.url, query, { time, timeoutMs: this.timeoutMs, subject: `the nodes that report (query: ${query})` });
    } catch {
      return undefined;
    }
    const live = new Set<string>();
    for (const sample of samples) {
      const node = sample.labels[nodeLabel];
      if (node !== undefined && node !== '') live.add(node);
    }
    return live.size === 0 ? undefined : live;
  }

  /**
   * Peer groups at `time`: node → training job, from every series of the node scrape job that
   * carried a training-job label in the 10 minutes before. A node that stopped reporting (`stopped`,
   * from read()) stays a member of the job it was in during the half hour before, so that its
   * silence counts for as long as it lasts. A node in two jobs at once is left ungrouped.
   */
  async readGroups(time: number, stopped: readonly string[] = []): Promise<{ groups: Record<string, string>; conflicts: string[] }> {
    const recent = await this.trainingJobs(time, '10m');
    const missing = stopped.filter((node) => recent.groups[node] === undefined && !recent.conflicts.includes(node));
    if (missing.length === 0) return recent;
    const earlier = await this.trainingJobs(time, '30m', missing);
    return { groups: { ...recent.groups, ...earlier.groups }, conflicts: [...new Set([...recent.conflicts, ...earlier.conflicts])].sort() };
  }

  private async trainingJobs(time: number, window: string, nodes?: readonly string[]): Promise<{ groups: Record<string, string>; conflicts: string[] }> {
    const { nodeLabel, trainingJobLabel, agentJob } = this.labels;
    const job = agentJob.includes('|') ? `job=~${JSON.stringify(agentJob)}` : `job=${JSON.stringify(agentJob)}`;
    const only = nodes === undefined ? '' : `, ${nodeLabel}=~${JSON.stringify(nodes.map(escapeRegex).join('|'))}`;
    const query = `group by (${nodeLabel}, ${trainingJobLabel}) (last_over_time({${trainingJobLabel}!="", ${job}${only}}[${window}]))`;
    const samples = await instantQuery(this.url, query, { time, timeoutMs: this.timeoutMs, subject: `training-job groups (query: ${query})` });
    const groups: Record<string, string> = {};
    const conflicts = new Set<string>();
    for (const sample of samples) {
      const node = sample.labels[nodeLabel];
      const training = sample.labels[trainingJobLabel];
      if (node === undefined || training === undefined || !nodeNameSchema.safeParse(node).success) continue;
      if (groups[node] !== undefined && groups[node] !== training) conflicts.add(node);
      groups[node] = training;
    }
    for (const node of conflicts) delete groups[node];
    return { groups, conflicts: [...conflicts].sort() };
  }

  /**
   * Why a feature had no series: no such metric at all, a metric under another scrape job, or
   * series without the node label. Asks Prometheus three small questions about the feature's metric.
   */
  async whyMissing(feature: FeatureQuery, time: number): Promise<string> {
    if (feature.metric === undefined) return 'no series';
    const { nodeLabel, agentJob } = this.labels;
    const ask = (query: string) =>
      instantQuery(this.url, query, { time, timeoutMs: this.timeoutMs, subject: `the data behind feature ${feature.name} (query: ${query})` });
    try {
      const byJob = await ask(`count by (job) (last_over_time(${feature.metric}[10m]))`);
      if (byJob.length === 0) return `no series of ${feature.metric} in the last 10 minutes`;
      const wanted = new Set(agentJob.split('|'));
      const jobs = byJob.map((sample) => sample.labels.job ?? '(none)');
      if (!jobs.some((name) => wanted.has(name))) return `${feature.metric} is scraped under job(s) ${jobs.join(', ')}, not ${agentJob} (set the scrape job)`;
      const unlabelled = await ask(`count(last_over_time(${feature.metric}{job=~${JSON.stringify(agentJob)}, ${nodeLabel}=""}[10m]))`);
      if ((unlabelled[0]?.value ?? 0) > 0) return `${feature.metric} series have no ${nodeLabel} label (set the node label, or add it when scraping)`;
      return `${feature.metric} is there, but the feature query answered nothing (a counter needs two samples in its window)`;
    } catch (error) {
      return `no series, and asking why failed: ${error instanceof Error ? error.message : String(error)}`;
    }
  }

  /** One feature: per node its values (one per device, in device order), or the failure naming the feature and its query. */
  async queryFeature(feature: FeatureQuery, time: number): Promise<QueryOutcome> {
    const what = `feature ${feature.name} (query: ${feature.query})`;
    const rejected = (reason: string) => ({ ok: false as const, error: new PrometheusQueryRejectedError(`${what}: ${reason}`, [feature.query]) });
    const nodeLabel = this.labels.nodeLabel;
    let samples: InstantSample[];
    try {
      samples = await instantQuery(this.url, feature.query, { time, timeoutMs: this.timeoutMs, subject: what });
    } catch (error) {
      if (error instanceof PrometheusUnavailableError || error instanceof PrometheusQueryRejectedError) return { ok: false, error };
      throw error;
    }

    const byNode = new Map<string, Map<string, number>>();
    const warnings: string[] = [];
    const by = feature.deviceLabel === undefined ? nodeLabel : `${nodeLabel}, ${feature.deviceLabel}`;
    for (const sample of samples) {
      const node = sample.labels[nodeLabel];
      if (node === undefined) return rejected(`a series has no \`${nodeLabel}\` label (${JSON.stringify(sample.labels)}); aggregate with \`by (${by})\``);
      if (!nodeNameSchema.safeParse(node).success) {
        warnings.push(`${what}: left out a series whose ${nodeLabel} label ${JSON.stringify(node)} is not a node name`);
        continue;
      }
      const device = feature.deviceLabel === undefined ? '' : (sample.labels[feature.deviceLabel] ?? '');
      let devices = byNode.get(node);
      if (!devices) byNode.set(node, (devices = new Map()));
      if (devices.has(device))
        return rejected(
          `more than one series for ${feature.deviceLabel === undefined ? `node ${node}` : `node ${node} ${feature.deviceLabel} ${JSON.stringify(device)}`}; aggregate with \`by (${by})\``,
        );
      // NaN (0/0) and ±Inf carry no comparison with the peers: the device simply lacks the feature.
      devices.set(device, sample.value);
    }
    const values = new Map<string, number[]>();
    for (const [node, devices] of byNode) {
      const ordered = [...devices]
        .sort(([a], [b]) => a.localeCompare(b, 'en', { numeric: true }))
        .map(([, value]) => value)
        .filter(Number.isFinite);
      if (ordered.length > 0) values.set(node, ordered);
    }
    return { ok: true, values, warnings };
  }
}

export interface DetectionRun extends Evaluation {
  readonly failures: readonly PrometheusQueryFailure[];
  readonly warnings: readonly string[];
}

/**
 * One evaluation end to end: read the matrix at `time`, score it, apply persistence. Feature
 * queries that fail leave their feature out of this evaluation (reported in `failures`); only
 * when every one failed does it throw, a PrometheusUnavailableError (retry later) if any failure
 * was one, else a PrometheusQueryRejectedError (do not retry), each message naming the queries.
 */
export async function detectSuspects(
  source: FeatureSource,
  detector: MultiSignalDetector,
  time: number = Date.now(),
  context: EvaluationContext = {},
): Promise<DetectionRun> {
  const reading = await source.read(time);
  if (reading.answered.length === 0 && reading.failures.length > 0) {
    const queries = reading.failures.flatMap((failure) => failure.queries);
    const message = `every feature query failed:\n${reading.failures.map((failure) => `- ${failure.message}`).join('\n')}`;
    if (reading.failures.some((failure) => failure instanceof PrometheusUnavailableError)) throw new PrometheusUnavailableError(message, queries);
    throw new PrometheusQueryRejectedError(message, queries);
  }
  return { ...detector.evaluate(time, reading.matrix, context), failures: reading.failures, warnings: reading.warnings };
}
