import { z } from 'zod';
import { nodeNameSchema } from '../../core/names.js';
import { agentSelector, aggregateBy, escapeRegex, increase, newEvents, rate, sumBy, taggedRate, type LabelMatchers } from '../../core/promql.js';
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
import { DEFAULT_THRESHOLDS } from '../../rules/thresholds.js';
import type { MultiSignalDetector } from './detector.js';
import { featureSpecSchema, type FeatureSpec } from './settings.js';
import type { Evaluation, EvaluationContext, FeatureMatrix } from './types.js';

/**
 * The multi-signal detector's input, read from Prometheus' HTTP API: one instant query per
 * feature (`GET /api/v1/query?query=…&time=…`), each answering one value per node (`by (node)`;
 * the scrape adds `node` to the agents' series), assembled into the node × feature matrix that
 * analyzers/multisignal/detector.ts scores. The 504-GPU report (002, first finding) detects over the
 * metrics the cluster already had in Prometheus; these features are the agents' own metrics.
 */

export interface FeatureQuery extends FeatureSpec {
  /** An instant-vector PromQL expression with one series per node (labelled with the node label), or per node and device. */
  readonly query: string;
  /** The label that tells a node's devices apart (gpu, port, mount); without it the query gives one series per node. */
  readonly deviceLabel?: string;
  /** The metric the feature is built on: named when the feature has no data, to say why. */
  readonly metric?: string;
}

/** The clock-event reasons that mean the hardware is protecting itself, as rules/domains/gpu.ts counts them. */
const HARDWARE_SLOWDOWN_REASONS = ['hw_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown', 'sw_thermal_slowdown'] as const;
/** Port counters that rise on a degrading cable, transceiver or port (as rules/domains/network.ts). */
const RDMA_LINK_ERROR_COUNTERS = ['symbol_errors', 'local_link_integrity_errors', 'receive_errors'] as const;
/** hw_counters that count the transport recovering lost packets (present on newer drivers only). */
const RDMA_RETRY_COUNTERS = ['retransmits', 'ack_timeouts'] as const;

/** The labels the feature queries rely on, configurable for fleets that name them otherwise. */
export interface FeatureLabels {
  /** The scrape job (or jobs, `a|b`) of the node metrics. */
  readonly agentJob: string;
  /** The label naming the node on every node series. */
  readonly nodeLabel: string;
}

export const DEFAULT_LABELS: FeatureLabels = { agentJob: DEFAULT_THRESHOLDS.selectors.agentJob, nodeLabel: 'node' };

/** The InfiniBand port of a series, as one device label (`mlx5_0/1`), so two ports of a node stay apart. */
const PORT = 'ib_port';

/**
 * The default features, each built from the metric names the agents export (README, Metrics)
 * and the rules' selectors, with the reason it moves before (or with) a GPU failure. GPU features
 * are per GPU, RDMA features per port, NFS latency per mount (the detector scores devices and
 * rolls them up to the node, so one GPU of eight is not diluted by the node's mean).
 */
export function defaultFeatureQueries(labels: FeatureLabels = DEFAULT_LABELS): FeatureQuery[] {
  const node = labels.nodeLabel;
  const agent = (matchers: LabelMatchers = {}) =>
    agentSelector(labels.agentJob.includes('|') ? { ...matchers, job: { oneOf: labels.agentJob.split('|') } } : matchers, labels.agentJob);
  const perGpu = [node, 'gpu'] as const;
  const byNode = [node] as const;
  const getattr = agent({ operation: 'GETATTR' });
  const nfsOperations = sumBy(byNode, rate(`steadfast_nfs_operations_total${agent()}`));
  const portOf = (expr: string) => `label_join(${expr}, "${PORT}", "/", "device", "port")`;
  const summedRates = (counters: readonly string[], window: string) =>
    `sum by (${node}, ${PORT}) (\n  ${counters.map((counter) => portOf(taggedRate(`steadfast_rdma_port_${counter}_total${agent()}`, window, 'counter', counter))).join('\n  or\n  ')}\n)`;
  return [
    // A failing fan, a blocked air path or a degrading GPU runs hotter than its peers under the
    // same load, hours before thermal protection or the GPU itself gives up.
    {
      name: 'gpu_temperature_celsius',
      direction: 'higher',
      minSpread: 1,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_temperature_celsius',
      query: aggregateBy('max', perGpu, `steadfast_gpu_temperature_celsius${agent()}`),
    },
    // HBM heat goes with rising correctable ECC rates (the 504-GPU report, Fig. 4: the row remapping before a failure).
    {
      name: 'gpu_memory_temperature_celsius',
      direction: 'higher',
      minSpread: 1,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_memory_temperature_celsius',
      query: aggregateBy('max', perGpu, `steadfast_gpu_memory_temperature_celsius${agent()}`),
    },
    // Under one synchronous load every GPU draws about the same; a GPU drawing less does less
    // work: throttled, stalled or degrading (and near idle once an Xid took it out).
    {
      name: 'gpu_power_watts',
      direction: 'lower',
      minSpread: 10,
      activity: true,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_power_watts',
      query: aggregateBy('min', perGpu, `steadfast_gpu_power_watts${agent()}`),
    },
    // SM clocks held down (thermal or power protection) precede and follow hardware trouble.
    {
      name: 'gpu_sm_clock_hertz',
      direction: 'lower',
      minSpread: 15e6,
      activity: true,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_clock_hertz',
      query: aggregateBy('min', perGpu, `steadfast_gpu_clock_hertz${agent({ clock: 'sm' })}`),
    },
    // Kernels stop running on a GPU the driver lost or the job left behind.
    {
      name: 'gpu_utilization',
      direction: 'lower',
      minSpread: 0.02,
      activity: true,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_utilization_ratio',
      query: aggregateBy('avg', perGpu, `steadfast_gpu_utilization_ratio${agent()}`),
    },
    // Share of the last 5 minutes a GPU was held down by hardware protection: a power brake a
    // minute at a time shows here for 5 minutes, and the detector's episode count adds them up.
    // A healthy GPU is not held down by its own hardware: any of it in the last five minutes (one
    // sample of ten) is the alarm level whatever the peers read (a power brake caps every GPU of
    // the board at once); one blip makes one short run of alarms, which persistence does not
    // raise, while brakes that keep coming back add up as episodes.
    {
      name: 'gpu_hw_slowdown_share',
      direction: 'higher',
      minSpread: 0.1,
      alarmAt: 0.05,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_throttle_reason',
      query: aggregateBy('max', perGpu, `avg_over_time(steadfast_gpu_throttle_reason${agent({ reason: { oneOf: HARDWARE_SLOWDOWN_REASONS } })}[5m])`),
    },
    // Correctable ECC errors pile up in failing HBM before an uncorrectable one (Xid 48) and row
    // remapping (Xid 63/64) (the 504-GPU report, Figs. 3-4). Hundreds an hour on one GPU is a
    // failing memory whatever its peers do: 20 in 10 minutes is the alarm level.
    {
      name: 'gpu_ecc_correctable_10m',
      direction: 'higher',
      minSpread: 2,
      alarmAt: 20,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_ecc_errors_total',
      query: sumBy(perGpu, increase(`steadfast_gpu_ecc_errors_total${agent({ scope: 'volatile', type: 'correctable' })}`, '10m')),
    },
    {
      name: 'gpu_row_remaps_1h',
      direction: 'higher',
      minSpread: 0.5,
      alarmAt: 1,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_remapped_rows_total',
      query: sumBy(perGpu, increase(`steadfast_gpu_remapped_rows_total${agent()}`, '1h')),
    },
    // A row remap waiting for the next reset: the memory already failed once.
    {
      name: 'gpu_row_remap_pending',
      direction: 'higher',
      minSpread: 0.5,
      alarmAt: 1,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_remapped_rows_pending',
      query: aggregateBy('max', perGpu, `steadfast_gpu_remapped_rows_pending${agent()}`),
    },
    // PCIe replays: the link to the GPU retransmitting, as before the 504-GPU report's NVLink +
    // bus fault (Fig. 2). About one a second is a failing link.
    {
      name: 'gpu_pcie_replays_per_second',
      direction: 'higher',
      minSpread: 0.05,
      alarmAt: 0.5,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_pcie_replay_errors_total',
      query: sumBy(perGpu, rate(`steadfast_gpu_pcie_replay_errors_total${agent()}`, '5m')),
    },
    // A link that degrades slowly replays a few times now and then long before it replays every
    // second: its rate stays far under the alarm level, but the replays keep coming. Of the last
    // hour's twelve 5-minute slots, how many saw a replay: a healthy link's counter stands still
    // for hours (one burst fills one slot); eight slots or more against peers at none is strong
    // (strongZ at minSpread 1). Judged against the GPU's own normal like every peer feature, so a
    // GPU that has always trickled replays is learnt, not raised again and again.
    {
      name: 'gpu_pcie_replay_slots_1h',
      direction: 'higher',
      minSpread: 1,
      deviceLabel: 'gpu',
      metric: 'steadfast_gpu_pcie_replay_errors_total',
      query: `count_over_time((${sumBy(perGpu, increase(`steadfast_gpu_pcie_replay_errors_total${agent()}`, '5m'))} > 0)[1h:5m])\nor\n0 * group by (${perGpu.join(', ')}) (steadfast_gpu_pcie_replay_errors_total${agent()})`,
    },
    // Fatal Xids in the last 5 minutes, the first of a GPU included (a labelled counter is born
    // at its first increment, so increase() alone would miss it): a suspect by itself.
    // Nodes whose xid collector works and saw none count 0, not "missing": they are peers.
    {
      name: 'xid_fatal_5m',
      direction: 'higher',
      minSpread: 0.25,
      raiseAt: 1,
      metric: 'steadfast_xid_errors_total',
      query: `sum by (${node}) (\n${newEvents(`steadfast_xid_errors_total${agent({ severity: 'fatal' })}`, '5m')}\n)\nor\n0 * group by (${node}) (steadfast_collector_success${agent({ collector: 'xid' })} == 1)`,
    },
    // Xids that keep coming back: of the last hour's twelve 5-minute slots, how many saw a new
    // Xid of any kind. Three is a repeated fault (the rules' xid.repeatCount in xid.repeatWindow).
    // Slots, not lines: one application crash logs a burst of Xid lines within a minute or two
    // (every rank's GPU, follow-up channel errors), which is one incident, not a repeat.
    {
      name: 'xid_errors_1h',
      direction: 'higher',
      minSpread: 0.25,
      raiseAt: DEFAULT_THRESHOLDS.xid.repeatCount,
      metric: 'steadfast_xid_errors_total',
      query: `sum by (${node}) (\n  count_over_time((sum by (${node}) (\n${newEvents(`steadfast_xid_errors_total${agent()}`, '5m')}\n  ) > 0)[1h:5m])\n)\nor\n0 * group by (${node}) (steadfast_collector_success${agent({ collector: 'xid' })} == 1)`,
    },
    // A degrading cable, transceiver or NIC (the NIC shares the PCIe switch with its GPUs); one
    // error a second on a port is the rules' alarm level too.
    {
      name: 'rdma_link_errors_per_second',
      direction: 'higher',
      minSpread: 0.05,
      alarmAt: DEFAULT_THRESHOLDS.network.errorRatePerSecond,
      deviceLabel: PORT,
      metric: 'steadfast_rdma_port_symbol_errors_total',
      query: summedRates(RDMA_LINK_ERROR_COUNTERS, '5m'),
    },
    {
      name: 'rdma_transport_retries_per_second',
      direction: 'higher',
      minSpread: 1,
      deviceLabel: PORT,
      metric: 'steadfast_rdma_port_retransmits_total',
      query: summedRates(RDMA_RETRY_COUNTERS, '5m'),
    },
    // A node moving less data than its peers in a synchronous job is slow, stuck or gone.
    {
      name: 'rdma_transmit_bytes_per_second',
      direction: 'lower',
      minSpread: 1e8,
      activity: true,
      metric: 'steadfast_rdma_port_data_transmitted_bytes_total',
      query: sumBy(byNode, rate(`steadfast_rdma_port_data_transmitted_bytes_total${agent()}`, '1m')),
    },
    // Metadata round trips: the 504-GPU report saw GETATTR response time misbehave on the node
    // whose GPU later logged an ECC error (Fig. 3). Mean seconds per GETATTR, per mount.
    {
      name: 'nfs_getattr_rtt_seconds',
      direction: 'higher',
      minSpread: 2e-4,
      activity: true,
      deviceLabel: 'mount',
      metric: 'steadfast_nfs_rtt_seconds_total',
      query: `${sumBy([node, 'mount'], rate(`steadfast_nfs_rtt_seconds_total${getattr}`))}\n/\n(${sumBy([node, 'mount'], rate(`steadfast_nfs_operations_total${getattr}`))} > 0)`,
    },
    // RPCs sent more than once (timeouts, reconnects) per completed RPC, over all operations.
    {
      name: 'nfs_retransmissions_per_operation',
      direction: 'higher',
      minSpread: 0.002,
      metric: 'steadfast_nfs_transmissions_total',
      query: `(${sumBy(byNode, rate(`steadfast_nfs_transmissions_total${agent()}`))} - ${nfsOperations})\n/\n(${nfsOperations} > 0)`,
    },
    // The node's slowest rank, over whichever training jobs the node runs.
    {
      name: 'training_iteration_seconds',
      direction: 'higher',
      minSpread: 0.02,
      activity: true,
      metric: 'steadfast_training_iteration_seconds',
      query: aggregateBy('max', byNode, `steadfast_training_iteration_seconds${agent()}`),
    },
  ];
}

export const DEFAULT_FEATURES: readonly FeatureQuery[] = defaultFeatureQueries();

/** The detector's view of feature queries: name, direction and levels, without the PromQL. */
export function detectorFeatures(features: readonly FeatureQuery[] = DEFAULT_FEATURES): FeatureSpec[] {
  return features.map(({ query: _query, deviceLabel: _device, metric: _metric, ...spec }) => spec);
}

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
