import { z } from 'zod';
import { nodeNameSchema } from '../core/names.js';
import { agentSelector, aggregateBy, increase, newEvents, rate, sumBy, taggedRate, type LabelMatchers } from '../core/promql.js';
import { PrometheusQueryRejectedError, PrometheusUnavailableError, instantQuery, type InstantSample, type PrometheusQueryFailure } from '../core/prometheus.js';
import { parseOrThrow } from '../core/validate.js';
import { DEFAULT_THRESHOLDS, type Thresholds } from '../rules/thresholds.js';
import { featureSpecSchema, type Evaluation, type FeatureMatrix, type FeatureSpec, type MultiSignalDetector } from './multisignal.js';

/**
 * The multi-signal detector's input, read from Prometheus' HTTP API: one instant query per
 * feature (`GET /api/v1/query?query=…&time=…`), each answering one value per node (`by (node)`;
 * the scrape adds `node` to the agents' series), assembled into the node × feature matrix that
 * analyzers/multisignal.ts scores. The 504-GPU report (002, first finding) detects over the
 * metrics the cluster already had in Prometheus; these features are the agents' own metrics.
 */

export interface FeatureQuery extends FeatureSpec {
  /** An instant-vector PromQL expression with one series per node, labelled `node`. */
  readonly query: string;
}

/** The clock-event reasons that mean the hardware is protecting itself, as rules/domains/gpu.ts counts them. */
const HARDWARE_SLOWDOWN_REASONS = ['hw_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown', 'sw_thermal_slowdown'] as const;
/** Port counters that rise on a degrading cable, transceiver or port (as rules/domains/network.ts). */
const RDMA_LINK_ERROR_COUNTERS = ['symbol_errors', 'local_link_integrity_errors', 'receive_errors'] as const;
/** hw_counters that count the transport recovering lost packets (present on newer drivers only). */
const RDMA_RETRY_COUNTERS = ['retransmits', 'ack_timeouts'] as const;

/** Per-node sum of the rates of several counters, tagged with their names to keep them apart until the sum. */
function summedRates(counters: readonly string[], matchers: string, window: string): string {
  const rates = counters.map((counter) => taggedRate(`steadfast_rdma_port_${counter}_total${matchers}`, window, 'counter', counter));
  return `sum by (node) (\n  ${rates.join('\n  or\n  ')}\n)`;
}

/** One value per node (the label the scrape adds to the agents' series). */
const NODE = ['node'] as const;

/**
 * The default features, each built from the metric names the agents export (README, Metrics)
 * and the rules' selectors, with the reason it moves before (or with) a GPU failure.
 */
export function defaultFeatureQueries(thresholds: Thresholds = DEFAULT_THRESHOLDS): FeatureQuery[] {
  const agent = (matchers: LabelMatchers = {}) => agentSelector(matchers, thresholds.selectors.agentJob);
  const getattr = agent({ operation: 'GETATTR' });
  const nfsOperations = sumBy(NODE, rate(`steadfast_nfs_operations_total${agent()}`));
  return [
    // A failing fan, a blocked air path or a degrading GPU runs hotter than its peers under the
    // same load, hours before thermal protection or the GPU itself gives up. Hottest GPU.
    { name: 'gpu_temperature_max_celsius', direction: 'higher', minSpread: 1, query: aggregateBy('max', NODE, `steadfast_gpu_temperature_celsius${agent()}`) },
    // HBM heat goes with rising correctable ECC rates (002, Fig. 4: the row remapping before a failure).
    { name: 'gpu_memory_temperature_max_celsius', direction: 'higher', minSpread: 1, query: aggregateBy('max', NODE, `steadfast_gpu_memory_temperature_celsius${agent()}`) },
    // Under one synchronous load every GPU draws about the same; a GPU drawing less does less
    // work: throttled, stalled or degrading (and near idle once an Xid took it out). Lowest GPU.
    { name: 'gpu_power_min_watts', direction: 'lower', minSpread: 10, query: aggregateBy('min', NODE, `steadfast_gpu_power_watts${agent()}`) },
    // SM clocks held down (thermal or power protection) precede and follow hardware trouble.
    { name: 'gpu_sm_clock_min_hertz', direction: 'lower', minSpread: 15e6, query: aggregateBy('min', NODE, `steadfast_gpu_clock_hertz${agent({ clock: 'sm' })}`) },
    // Kernels stop running on a GPU the driver lost or the job left behind.
    { name: 'gpu_utilization_mean', direction: 'lower', minSpread: 0.02, query: aggregateBy('avg', NODE, `steadfast_gpu_utilization_ratio${agent()}`) },
    // GPUs held down by hardware protection over the last 5 minutes (sum of shares of time).
    {
      name: 'gpu_hw_slowdown_gpus',
      direction: 'higher',
      minSpread: 0.25,
      query: sumBy(NODE, `avg_over_time(steadfast_gpu_throttle_reason${agent({ reason: { oneOf: HARDWARE_SLOWDOWN_REASONS } })}[5m])`),
    },
    // Correctable ECC errors pile up in failing HBM before an uncorrectable one (Xid 48) and row
    // remapping (Xid 63/64) (002, Figs. 3-4).
    {
      name: 'gpu_ecc_correctable_10m',
      direction: 'higher',
      minSpread: 2,
      query: sumBy(NODE, increase(`steadfast_gpu_ecc_errors_total${agent({ scope: 'volatile', type: 'correctable' })}`, '10m')),
    },
    { name: 'gpu_row_remaps_1h', direction: 'higher', minSpread: 0.5, query: sumBy(NODE, increase(`steadfast_gpu_remapped_rows_total${agent()}`, '1h')) },
    // PCIe replays: the link to the GPU retransmitting, as before the 002 report's NVLink + bus fault (Fig. 2).
    { name: 'gpu_pcie_replays_per_second', direction: 'higher', minSpread: 0.05, query: sumBy(NODE, rate(`steadfast_gpu_pcie_replay_errors_total${agent()}`, '5m')) },
    // The Xid itself: every Xid line in the last 5 minutes, the first of a GPU included (a
    // labelled counter is born at its first increment, so increase() alone would miss it).
    // Nodes whose xid collector works and saw none count 0, not "missing": they are peers.
    {
      name: 'xid_errors_5m',
      direction: 'higher',
      minSpread: 0.25,
      query: `sum by (node) (\n${newEvents(`steadfast_xid_errors_total${agent()}`, '5m')}\n)\nor\n0 * group by (node) (steadfast_collector_success${agent({ collector: 'xid' })} == 1)`,
    },
    // A degrading cable, transceiver or NIC (the NIC shares the PCIe switch with its GPUs).
    { name: 'rdma_link_errors_per_second', direction: 'higher', minSpread: 0.05, query: summedRates(RDMA_LINK_ERROR_COUNTERS, agent(), '5m') },
    { name: 'rdma_transport_retries_per_second', direction: 'higher', minSpread: 1, query: summedRates(RDMA_RETRY_COUNTERS, agent(), '5m') },
    // A node moving less data than its peers in a synchronous job is slow, stuck or gone.
    {
      name: 'rdma_transmit_bytes_per_second',
      direction: 'lower',
      minSpread: 1e8,
      query: sumBy(NODE, rate(`steadfast_rdma_port_data_transmitted_bytes_total${agent()}`, '1m')),
    },
    // Metadata round trips: the 002 report saw GETATTR response time misbehave on the node whose
    // GPU later logged an ECC error (Fig. 3). Mean seconds per GETATTR.
    {
      name: 'nfs_getattr_rtt_seconds',
      direction: 'higher',
      minSpread: 2e-4,
      query: `${sumBy(NODE, rate(`steadfast_nfs_rtt_seconds_total${getattr}`))}\n/\n(${sumBy(NODE, rate(`steadfast_nfs_operations_total${getattr}`))} > 0)`,
    },
    // RPCs sent more than once (timeouts, reconnects) per completed RPC, over all operations.
    {
      name: 'nfs_retransmissions_per_operation',
      direction: 'higher',
      minSpread: 0.002,
      query: `(${sumBy(NODE, rate(`steadfast_nfs_transmissions_total${agent()}`))} - ${nfsOperations})\n/\n(${nfsOperations} > 0)`,
    },
    // The node's slowest rank, over whichever training jobs the node runs.
    { name: 'training_iteration_seconds', direction: 'higher', minSpread: 0.02, query: aggregateBy('max', NODE, `steadfast_training_iteration_seconds${agent()}`) },
  ];
}

export const DEFAULT_FEATURES: readonly FeatureQuery[] = defaultFeatureQueries();

/** The detector's view of feature queries: name, direction and spread floors, without the PromQL. */
export function detectorFeatures(features: readonly FeatureQuery[] = DEFAULT_FEATURES): FeatureSpec[] {
  return features.map(({ query: _query, ...spec }) => spec);
}

export interface FeatureReading {
  readonly matrix: FeatureMatrix;
  /** Features whose query answered (possibly with no series). */
  readonly answered: readonly string[];
  /** Feature queries that gave nothing; the matrix holds the others. */
  readonly failures: readonly PrometheusQueryFailure[];
  /** Series that were left out (a `node` label that is no node name). */
  readonly warnings: readonly string[];
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
    features: z
      .array(featureSpecSchema.extend({ query: z.string().min(1) }))
      .min(1)
      .refine((features) => new Set(features.map((feature) => feature.name)).size === features.length, 'feature names must be unique')
      .optional(),
  })
  .strict();

export type PrometheusSourceOptions = z.input<typeof sourceOptionsSchema>;

export class PrometheusFeatureSource implements FeatureSource {
  readonly features: readonly FeatureQuery[];
  private readonly url: string;
  private readonly timeoutMs: number;

  constructor(options: PrometheusSourceOptions) {
    const parsed = parseOrThrow(sourceOptionsSchema, options, 'Prometheus feature source options');
    this.url = parsed.url.replace(/\/+$/, '');
    this.timeoutMs = parsed.timeoutMs;
    this.features = parsed.features ?? DEFAULT_FEATURES;
  }

  /** Every feature at `time` (ms since the epoch). Never throws: what failed is in `failures`. */
  async read(time: number): Promise<FeatureReading> {
    const settled = await Promise.all(this.features.map((feature) => this.queryFeature(feature, time)));
    const rows = new Map<string, Record<string, number>>();
    const answered: string[] = [];
    const failures: PrometheusQueryFailure[] = [];
    const warnings: string[] = [];
    settled.forEach((outcome, index) => {
      const feature = this.features[index] as FeatureQuery;
      if (!outcome.ok) {
        failures.push(outcome.error);
        return;
      }
      answered.push(feature.name);
      warnings.push(...outcome.warnings);
      for (const [node, value] of outcome.values) {
        let row = rows.get(node);
        if (!row) rows.set(node, (row = {}));
        row[feature.name] = value;
      }
    });
    return { matrix: Object.fromEntries(rows), answered, failures, warnings };
  }

  /** One feature: a per-node value map, or the failure naming the feature and its query. */
  async queryFeature(
    feature: FeatureQuery,
    time: number,
  ): Promise<{ ok: true; values: Map<string, number>; warnings: string[] } | { ok: false; error: PrometheusQueryFailure }> {
    const what = `feature ${feature.name} (query: ${feature.query})`;
    const rejected = (reason: string) => ({ ok: false as const, error: new PrometheusQueryRejectedError(`${what}: ${reason}`, [feature.query]) });
    let samples: InstantSample[];
    try {
      samples = await instantQuery(this.url, feature.query, { time, timeoutMs: this.timeoutMs, subject: what });
    } catch (error) {
      if (error instanceof PrometheusUnavailableError || error instanceof PrometheusQueryRejectedError) return { ok: false, error };
      throw error;
    }

    const values = new Map<string, number>();
    const warnings: string[] = [];
    for (const sample of samples) {
      const node = sample.labels.node;
      if (node === undefined) return rejected(`a series has no \`node\` label (${JSON.stringify(sample.labels)}); aggregate with \`by (node)\``);
      if (!nodeNameSchema.safeParse(node).success) {
        warnings.push(`${what}: left out a series whose node label ${JSON.stringify(node)} is not a node name`);
        continue;
      }
      if (values.has(node)) return rejected(`more than one series for node ${node}; aggregate with \`by (node)\``);
      // NaN (0/0) and ±Inf carry no comparison with the peers: the node simply lacks the feature.
      if (Number.isFinite(sample.value)) values.set(node, sample.value);
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
export async function detectSuspects(source: FeatureSource, detector: MultiSignalDetector, time: number = Date.now()): Promise<DetectionRun> {
  const reading = await source.read(time);
  if (reading.answered.length === 0 && reading.failures.length > 0) {
    const queries = reading.failures.flatMap((failure) => failure.queries);
    const message = `every feature query failed:\n${reading.failures.map((failure) => `- ${failure.message}`).join('\n')}`;
    if (reading.failures.some((failure) => failure instanceof PrometheusUnavailableError)) throw new PrometheusUnavailableError(message, queries);
    throw new PrometheusQueryRejectedError(message, queries);
  }
  return { ...detector.evaluate(time, reading.matrix), failures: reading.failures, warnings: reading.warnings };
}
