import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { afterAll, describe, expect, it } from 'vitest';
import { defaultFeatureQueries } from '../analyzers/multisignal/features.js';
import { ruleFile } from '../rules/build.js';

const PROMTOOL = process.env.PROMTOOL ?? 'promtool';
const dir = await mkdtemp(join(tmpdir(), 'steadfast-compat-'));
afterAll(() => rm(dir, { recursive: true, force: true }));

/** Two nodes seen only through dcgm-exporter and node_exporter: gpu-node-2's GPU 0 is power-braked the whole time. */
function inputSeries(): { series: string; values: string }[] {
  const series: { series: string; values: string }[] = [];
  for (const [index, node] of ['gpu-node-1', 'gpu-node-2'].entries()) {
    const dcgm = `job="dcgm-exporter", instance="10.0.0.${index + 1}:9400", gpu="0", UUID="GPU-${index}", Hostname="${node}"`;
    const host = `job="node-exporter", instance="${node}:9100"`;
    series.push(
      { series: `DCGM_FI_DEV_GPU_TEMP{${dcgm}}`, values: '61x12' },
      { series: `DCGM_FI_DEV_MEMORY_TEMP{${dcgm}}`, values: '70x12' },
      { series: `DCGM_FI_DEV_POWER_USAGE{${dcgm}}`, values: '650x12' },
      { series: `DCGM_FI_DEV_SM_CLOCK{${dcgm}}`, values: '1980x12' },
      { series: `DCGM_FI_DEV_GPU_UTIL{${dcgm}}`, values: '97x12' },
      { series: `DCGM_FI_DEV_CLOCKS_EVENT_REASONS{${dcgm}}`, values: index === 1 ? '128x12' : '4x12' },
      { series: `DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{${dcgm}}`, values: '0+3x12' },
      { series: `DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{${dcgm}}`, values: '0x12' },
      { series: `DCGM_FI_DEV_ROW_REMAP_PENDING{${dcgm}}`, values: '0x12' },
      { series: `DCGM_FI_DEV_PCIE_REPLAY_COUNTER{${dcgm}}`, values: '0+60x12' },
      { series: `node_infiniband_symbol_error_total{${host}, device="mlx5_0", port="1"}`, values: '0+120x12' },
      { series: `node_infiniband_local_link_integrity_errors_total{${host}, device="mlx5_0", port="1"}`, values: '0x12' },
      { series: `node_infiniband_port_errors_received_total{${host}, device="mlx5_0", port="1"}`, values: '0x12' },
      { series: `node_infiniband_port_data_transmitted_bytes_total{${host}, device="mlx5_0", port="1"}`, values: '0+2.4e12x12' },
      {
        series: `node_mountstats_nfs_operations_requests_total{${host}, export="nfs:/ckpt", mountaddr="10.0.0.9", operation="GETATTR", protocol="tcp"}`,
        values: '0+7680x12',
      },
      {
        series: `node_mountstats_nfs_operations_transmissions_total{${host}, export="nfs:/ckpt", mountaddr="10.0.0.9", operation="GETATTR", protocol="tcp"}`,
        values: '0+7687.5x12',
      },
      {
        series: `node_mountstats_nfs_operations_response_time_seconds_total{${host}, export="nfs:/ckpt", mountaddr="10.0.0.9", operation="GETATTR", protocol="tcp"}`,
        values: '0+7.5x12',
      },
    );
  }
  return series;
}

/**
 * What each default feature query must answer per node at 12 minutes, and the labels that tell its
 * devices apart (NFS rates chosen so the ratios are exact in floating point: 128 GETATTR/s, 2^-10 s each).
 */
const EXPECTED: Record<string, { device?: Record<string, string>; values: [number, number] }> = {
  gpu_temperature_celsius: { device: { gpu: '0' }, values: [61, 61] },
  gpu_memory_temperature_celsius: { device: { gpu: '0' }, values: [70, 70] },
  gpu_power_watts: { device: { gpu: '0' }, values: [650, 650] },
  gpu_sm_clock_hertz: { device: { gpu: '0' }, values: [1.98e9, 1.98e9] },
  gpu_utilization: { device: { gpu: '0' }, values: [0.97, 0.97] },
  gpu_hw_slowdown_share: { device: { gpu: '0' }, values: [0, 1] },
  gpu_ecc_correctable_10m: { device: { gpu: '0' }, values: [30, 30] },
  gpu_row_remaps_1h: { device: { gpu: '0' }, values: [0, 0] },
  gpu_row_remap_pending: { device: { gpu: '0' }, values: [0, 0] },
  gpu_pcie_replays_per_second: { device: { gpu: '0' }, values: [1, 1] },
  // Replays all along since 0: the 5-minute slots ending at 5 and 10 minutes saw them (the one at 0 has no samples before it).
  gpu_pcie_replay_slots_1h: { device: { gpu: '0' }, values: [2, 2] },
  rdma_link_errors_per_second: { device: { ib_port: 'mlx5_0/1' }, values: [2, 2] },
  rdma_transmit_bytes_per_second: { values: [4e10, 4e10] },
  nfs_getattr_rtt_seconds: { device: { mount: 'nfs:/ckpt' }, values: [2 ** -10, 2 ** -10] },
  nfs_retransmissions_per_operation: { values: [2 ** -10, 2 ** -10] },
};
/** What the two exporters cannot give: Xid counts, iteration times, transport retries. */
const UNAVAILABLE = ['xid_fatal_5m', 'xid_errors_1h', 'rdma_transport_retries_per_second', 'training_iteration_seconds'];

describe('the compat recording rules (rules/compat.yml)', () => {
  it("let the detector's own feature queries score a fleet that has only dcgm-exporter and node_exporter, per node and device", async () => {
    const features = defaultFeatureQueries({ agentJob: 'dcgm-exporter|node-exporter', nodeLabel: 'node' });
    expect(features.map((feature) => feature.name).sort()).toEqual([...Object.keys(EXPECTED), ...UNAVAILABLE].sort());
    const label = (labels: Record<string, string>) =>
      `{${Object.entries(labels)
        .map(([name, value]) => `${name}=${JSON.stringify(value)}`)
        .join(', ')}}`;
    const cases = features.map((feature) => {
      const expected = EXPECTED[feature.name];
      return {
        expr: feature.query,
        eval_time: '12m',
        exp_samples: expected
          ? expected.values.map((value, index) => ({ labels: label({ node: `gpu-node-${index + 1}`, ...(expected.device ?? {}) }), value }))
          : [],
      };
    });
    const file = join(dir, 'compat-features.test.yml');
    await writeFile(
      file,
      stringify({
        rule_files: [ruleFile('compat')],
        evaluation_interval: '1m',
        tests: [{ interval: '1m', input_series: inputSeries(), promql_expr_test: cases }],
      }),
    );
    const result = await new Promise<{ code: number; output: string }>((resolve) =>
      execFile(PROMTOOL, ['test', 'rules', file], (error, stdout, stderr) =>
        resolve({ code: error ? Number(error.code ?? 1) : 0, output: `${stdout}${stderr}` }),
      ),
    );
    expect(result.output).toContain('SUCCESS');
    expect(result.code, result.output).toBe(0);
  }, 30_000);
});
