import { record, type DomainRules, type RecordingRule } from '../spec.js';

/**
 * For fleets whose node metrics come from NVIDIA's dcgm-exporter and Prometheus' node_exporter
 * instead of the steadfast agent: recording rules that give their series the agent's metric
 * names, units and labels, so that multi-signal detection (analyzers/multisignal/features.ts)
 * scores such a fleet with its default queries. Each recorded series keeps the labels of its
 * source, the scrape job included, so the detector is pointed at those jobs with
 * analysis.labels.scrapeJob (or `detect suspects --scrape-job dcgm-exporter|node-exporter`), and
 * nothing here mixes with the agents' own series or trips the agent alerts of the other files.
 *
 * Where the source series have no `node` label, it is taken from dcgm-exporter's `Hostname` and
 * from the host part of node_exporter's `instance`. What the exporters cannot give is not faked:
 * Xid counts (dcgm-exporter keeps only the last Xid's code, not how many there were), training
 * iteration times and RDMA transport retries stay missing, and `detect suspects` lists them.
 * The recorded names break the `level:metric:operations` convention on purpose: they stand in for
 * the agent's series one for one.
 */

/** dcgm-exporter's clock-event bitmask (NVML's clocks_event_reasons): the bits the agent reports as hardware protection. */
const THROTTLE_BITS = [
  ['hw_slowdown', 8],
  ['sw_thermal_slowdown', 32],
  ['hw_thermal_slowdown', 64],
  ['hw_power_brake_slowdown', 128],
] as const;

/** `selector` with `node` set from `from` (its first group of `pattern`) on series that have none. */
function withNode(selector: string, from: string, pattern: string): string {
  const open = selector.includes('{') ? selector.replace('}', ', node=""}') : `${selector}{node=""}`;
  const labelled = selector.includes('{') ? selector.replace('}', ', node!=""}') : `${selector}{node!=""}`;
  return `label_replace(${open}, "node", "$1", "${from}", "${pattern}")\nor\n${labelled}`;
}

const dcgm = (metric: string) => withNode(metric, 'Hostname', '(.+)');
const nodeExporter = (metric: string) => withNode(metric, 'instance', '([^:]+)(:[0-9]+)?');
/** node_exporter's mountstats name the export (`server:/path`); the agent calls it `mount`. */
const mountstats = (metric: string) => `label_replace(\n${nodeExporter(metric)},\n"mount", "$1", "export", "(.+)")`;

function dcgmRules(): RecordingRule[] {
  const gauge = (recorded: string, source: string, scale = '', labels?: Record<string, string>) =>
    record({ record: recorded, expr: scale === '' ? dcgm(source) : `(${dcgm(source)})\n${scale}`, ...(labels ? { labels } : {}) });
  // Newer dcgm-exporters call the bitmask CLOCKS_EVENT_REASONS, older ones CLOCK_THROTTLE_REASONS.
  const reasons = `(${dcgm('DCGM_FI_DEV_CLOCKS_EVENT_REASONS')})\nor\n(${dcgm('DCGM_FI_DEV_CLOCK_THROTTLE_REASONS')})`;
  return [
    gauge('steadfast_gpu_temperature_celsius', 'DCGM_FI_DEV_GPU_TEMP'),
    gauge('steadfast_gpu_memory_temperature_celsius', 'DCGM_FI_DEV_MEMORY_TEMP'),
    gauge('steadfast_gpu_power_watts', 'DCGM_FI_DEV_POWER_USAGE'),
    // MHz to the agent's hertz.
    gauge('steadfast_gpu_clock_hertz', 'DCGM_FI_DEV_SM_CLOCK', '* 1e6', { clock: 'sm' }),
    // Percent to the agent's ratio.
    gauge('steadfast_gpu_utilization_ratio', 'DCGM_FI_DEV_GPU_UTIL', '/ 100'),
    // PromQL has no bitwise and: a bit of the mask is floor(mask / bit) mod 2.
    ...THROTTLE_BITS.map(([reason, bit]) =>
      record({ record: 'steadfast_gpu_throttle_reason', expr: `floor((\n${reasons}\n) / ${bit}) % 2`, labels: { reason } }),
    ),
    // Single-bit (correctable) volatile ECC errors since the driver loaded: a counter, as the agent's.
    gauge('steadfast_gpu_ecc_errors_total', 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', '', { scope: 'volatile', type: 'correctable' }),
    gauge('steadfast_gpu_remapped_rows_total', 'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', '', { type: 'correctable' }),
    gauge('steadfast_gpu_remapped_rows_total', 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', '', { type: 'uncorrectable' }),
    gauge('steadfast_gpu_remapped_rows_pending', 'DCGM_FI_DEV_ROW_REMAP_PENDING'),
    gauge('steadfast_gpu_pcie_replay_errors_total', 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER'),
  ];
}

function nodeExporterRules(): RecordingRule[] {
  // The infiniband collector's ports carry `device` and `port` as the agent's rdma collector does.
  const port = (recorded: string, source: string) => record({ record: recorded, expr: nodeExporter(source) });
  const nfs = (recorded: string, source: string) => record({ record: recorded, expr: mountstats(source) });
  return [
    port('steadfast_rdma_port_symbol_errors_total', 'node_infiniband_symbol_error_total'),
    port('steadfast_rdma_port_local_link_integrity_errors_total', 'node_infiniband_local_link_integrity_errors_total'),
    port('steadfast_rdma_port_receive_errors_total', 'node_infiniband_port_errors_received_total'),
    port('steadfast_rdma_port_data_transmitted_bytes_total', 'node_infiniband_port_data_transmitted_bytes_total'),
    // Requests, their transmissions and the time to a reply per NFS operation, as the agent's nfs collector counts them.
    nfs('steadfast_nfs_operations_total', 'node_mountstats_nfs_operations_requests_total'),
    nfs('steadfast_nfs_transmissions_total', 'node_mountstats_nfs_operations_transmissions_total'),
    nfs('steadfast_nfs_rtt_seconds_total', 'node_mountstats_nfs_operations_response_time_seconds_total'),
  ];
}

export const rules: DomainRules = {
  domain: 'compat',
  groups: () => [
    { name: 'steadfast-compat-dcgm-exporter', rules: dcgmRules() },
    { name: 'steadfast-compat-node-exporter', rules: nodeExporterRules() },
  ],
};
