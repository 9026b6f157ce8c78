import { agentSelector, aggregateBy, increase, newEvents, rate, sumBy, taggedRate, type LabelMatchers } from '../../core/promql.js';
import { DEFAULT_THRESHOLDS } from '../../rules/thresholds.js';
import type { FeatureSpec } from './settings.js';

/**
 * The multi-signal detector's features as PromQL over the agents' own metrics: one instant
 * query per feature, one series per node (or per node and device), with the labels a fleet may
 * name otherwise. analyzers/multisignal/source.ts runs them against Prometheus.
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
