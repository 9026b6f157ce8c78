import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { createServer as createTcpServer, type Server as TcpServer, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MultiSignalDetector } from '../../../analyzers/multisignal/detector.js';
import type { FeatureMatrix, FeatureValue } from '../../../analyzers/multisignal/types.js';
import { PrometheusFeatureSource, detectSuspects } from '../../../analyzers/multisignal/source.js';
import { DEFAULT_FEATURES, detectorFeatures, type FeatureQuery } from '../../../analyzers/multisignal/features.js';
import { PrometheusQueryRejectedError, PrometheusUnavailableError } from '../../../core/prometheus.js';
import { startPrometheus, type PrometheusPart } from '../../../tryit/parts.js';
import { ProcessGroup, freePort } from '../../../tryit/processes.js';
import { detectCommand } from '../../../cli/detect.js';
import { PROMETHEUS_METRICS, agentMetricNames, parsePromql } from '../../support/promql.js';
import { until } from '../../support/until.js';

/** What one simulated node exposes: gauges as given, counters growing at the given rate per second. */
interface NodeShape {
  temperature: [number, number];
  power: number;
  smClockHz: number;
  symbolErrorsPerSecond: number;
  xidLines: number;
  iterationSeconds: number;
}

const HEALTHY = (index: number): NodeShape => ({
  temperature: [60 + index * 0.4, 62 + index * 0.3],
  power: 650 + index * 3,
  smClockHz: 1.86e9 + index * 2e6,
  symbolErrorsPerSecond: 0,
  xidLines: 0,
  iterationSeconds: 4.2 + index * 0.01,
});
const NODES: Record<string, NodeShape> = {
  n1: HEALTHY(0),
  n2: HEALTHY(1),
  n3: HEALTHY(2),
  n4: HEALTHY(3),
  n5: HEALTHY(4),
  // Hot, drawing little power, clocks held down, a link throwing symbol errors, slow, and an Xid.
  n6: { temperature: [84, 61], power: 420, smClockHz: 1.5e9, symbolErrorsPerSecond: 200, xidLines: 1, iterationSeconds: 6.5 },
};
const GETATTR_RTT_SECONDS = 0.0006;
const GETATTR_PER_SECOND = 50;
const RETRANSMISSIONS_PER_OPERATION = 0.001;

/** The agent's exposition for one node (real metric names and labels; the scrape adds `node`). */
function exposition(shape: NodeShape, elapsedSeconds: number): string {
  const gpus = [
    { gpu: '0', pci_bus_id: '0000:18:00' },
    { gpu: '1', pci_bus_id: '0000:2a:00' },
  ];
  const labels = (extra: Record<string, string>) =>
    `{${Object.entries(extra)
      .map(([name, value]) => `${name}="${value}"`)
      .join(',')}}`;
  const lines: string[] = ['steadfast_collector_success{collector="xid"} 1'];
  gpus.forEach((gpu, index) => {
    lines.push(
      `steadfast_gpu_temperature_celsius${labels(gpu)} ${shape.temperature[index]}`,
      `steadfast_gpu_memory_temperature_celsius${labels(gpu)} ${70 + index}`,
      `steadfast_gpu_power_watts${labels(gpu)} ${index === 0 ? shape.power : 660}`,
      `steadfast_gpu_clock_hertz${labels({ ...gpu, clock: 'sm' })} ${index === 0 ? shape.smClockHz : 1.86e9}`,
      `steadfast_gpu_clock_hertz${labels({ ...gpu, clock: 'memory' })} 3.9e9`,
      `steadfast_gpu_utilization_ratio${labels(gpu)} 0.97`,
      `steadfast_gpu_throttle_reason${labels({ ...gpu, reason: 'hw_slowdown' })} 0`,
      `steadfast_gpu_throttle_reason${labels({ ...gpu, reason: 'sw_power_cap' })} 1`,
      `steadfast_gpu_ecc_errors_total${labels({ ...gpu, scope: 'volatile', type: 'correctable', location: 'dram' })} 0`,
      `steadfast_gpu_remapped_rows_total${labels({ ...gpu, type: 'correctable' })} 0`,
      `steadfast_gpu_remapped_rows_pending${labels(gpu)} 0`,
      `steadfast_gpu_pcie_replay_errors_total${labels(gpu)} 0`,
    );
  });
  if (shape.xidLines > 0) lines.push(`steadfast_xid_errors_total{pci_bus_id="0000:18:00",xid="79",severity="fatal"} ${shape.xidLines}`);
  const port = { device: 'mlx5_0', port: '1' };
  lines.push(
    `steadfast_rdma_port_symbol_errors_total${labels(port)} ${Math.floor(shape.symbolErrorsPerSecond * elapsedSeconds)}`,
    `steadfast_rdma_port_local_link_integrity_errors_total${labels(port)} 0`,
    `steadfast_rdma_port_receive_errors_total${labels(port)} 0`,
    `steadfast_rdma_port_retransmits_total${labels(port)} ${Math.floor(2 * elapsedSeconds)}`,
    `steadfast_rdma_port_ack_timeouts_total${labels(port)} 0`,
    `steadfast_rdma_port_data_transmitted_bytes_total${labels(port)} ${Math.floor(4e10 * elapsedSeconds)}`,
  );
  const getattr = { mount: 'nfs:/ckpt', operation: 'GETATTR' };
  const operations = GETATTR_PER_SECOND * elapsedSeconds;
  lines.push(
    `steadfast_nfs_operations_total${labels(getattr)} ${operations}`,
    `steadfast_nfs_transmissions_total${labels(getattr)} ${operations * (1 + RETRANSMISSIONS_PER_OPERATION)}`,
    `steadfast_nfs_rtt_seconds_total${labels(getattr)} ${operations * GETATTR_RTT_SECONDS}`,
    `steadfast_training_iteration_seconds{training_job="llama",rank="0"} ${shape.iterationSeconds}`,
  );
  return `${lines.join('\n')}\n`;
}

async function listen(server: Server | TcpServer): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

describe('multi-signal features read from a real Prometheus', () => {
  const processes = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-multisignal-'));
  const exporters: Server[] = [];
  let prometheus: PrometheusPart;

  beforeAll(async () => {
    const started = Date.now();
    const targets = [];
    for (const [node, shape] of Object.entries(NODES)) {
      const server = createServer((_request, response) => {
        response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(exposition(shape, (Date.now() - started) / 1000));
      });
      exporters.push(server);
      targets.push({ address: `127.0.0.1:${await listen(server)}`, labels: { node } });
    }
    prometheus = await startPrometheus(processes, root, { targets, ruleFiles: [], alertmanagerAddress: '127.0.0.1:9', intervalSeconds: 1 });
  }, 30_000);

  afterAll(async () => {
    await processes.stopAll();
    await Promise.all(exporters.map((server) => new Promise((resolve) => server.close(resolve))));
    rmSync(root, { recursive: true, force: true });
  });

  it('builds the node × feature matrix from the default queries and raises the outlier node', async () => {
    const source = new PrometheusFeatureSource({ url: prometheus.url, timeoutMs: 5_000 });
    // Rates need two samples of every counter: wait until every node has every feature. The
    // series are seconds old, so a 5-minute rate still depends on when Prometheus first scraped
    // each target (seconds apart on a loaded machine); wait too until the transmit rates, equal
    // in truth, agree within 5 %, or the late node would rightly look like it sends less.
    const transmitAgrees = (matrix: FeatureMatrix): boolean => {
      const rates = Object.values(matrix).map((row) => (typeof row.rdma_transmit_bytes_per_second === 'number' ? row.rdma_transmit_bytes_per_second : 0));
      return Math.min(...rates) > 0 && Math.max(...rates) / Math.min(...rates) <= 1.05;
    };
    const reading = await until(
      'every default feature for every node, transmit rates within 5 % of each other',
      () => source.read(Date.now()),
      (answer) =>
        answer.failures.length > 0 ||
        (Object.keys(answer.matrix).length === 6 &&
          Object.values(answer.matrix).every((row) => Object.keys(row).length === DEFAULT_FEATURES.length) &&
          transmitAgrees(answer.matrix)),
      45_000,
    );
    expect(reading.failures).toEqual([]);
    expect(reading.empty).toEqual([]);
    const { matrix } = reading;
    // GPU features come per GPU, in GPU order, so one GPU of two is not averaged away.
    expect(matrix.n1?.gpu_temperature_celsius).toEqual([60, 62]);
    expect(matrix.n6?.gpu_temperature_celsius).toEqual([84, 61]);
    expect(matrix.n6?.gpu_power_watts).toEqual([420, 660]);
    expect(matrix.n6?.gpu_sm_clock_hertz).toEqual([1.5e9, 1.86e9]); // the sm clock, not the memory clock
    expect(matrix.n1?.gpu_hw_slowdown_share).toEqual([0, 0]); // sw_power_cap is configuration, not protection
    expect(matrix.n1?.gpu_row_remap_pending).toEqual([0, 0]);
    expect(matrix.n1?.xid_fatal_5m).toBe(0); // no Xid series at all: a peer with none, not a gap
    expect(matrix.n6?.xid_fatal_5m).toBe(1); // the first Xid of a GPU, counted at the series' birth
    // xid_errors_1h counts 5-minute slots on Prometheus' aligned subquery steps, so a seconds-old
    // Xid shows there only from the next slot on: test/analyzers/multisignal/xid.test.ts pins it with promtool.
    // rate() divides by the whole window (5m), and these series are seconds old: the rates are
    // still a fraction of the counters' pace, but nonzero where the counters move. One value per port.
    const onlyPort = (value: FeatureValue | undefined) => (Array.isArray(value) && value.length === 1 ? (value[0] as number) : Number.NaN);
    expect(onlyPort(matrix.n6?.rdma_link_errors_per_second)).toBeGreaterThan(0.2);
    expect(onlyPort(matrix.n1?.rdma_link_errors_per_second)).toBe(0);
    expect(onlyPort(matrix.n1?.rdma_transport_retries_per_second)).toBeGreaterThan(0);
    expect(matrix.n1?.rdma_transmit_bytes_per_second).toBeGreaterThan(0);
    expect(onlyPort(matrix.n3?.nfs_getattr_rtt_seconds)).toBeCloseTo(GETATTR_RTT_SECONDS, 9);
    expect(matrix.n3?.nfs_retransmissions_per_operation).toBeCloseTo(RETRANSMISSIONS_PER_OPERATION, 6);
    expect(matrix.n6?.training_iteration_seconds).toBe(6.5);

    const detector = new MultiSignalDetector({ features: detectorFeatures(), persistence: { k: 1, n: 1 } });
    const run = await detectSuspects(source, detector, Date.now());
    expect(run.failures).toEqual([]);
    expect(run.suspects.map((suspect) => [suspect.node, suspect.reason])).toEqual([['n6', 'raise']]);
    const evidence = new Map(run.suspects[0]?.evidence.map((item) => [item.feature, item]));
    expect(evidence.get('xid_fatal_5m')?.kind).toBe('raise');
    // The hot GPU is named by its index, not folded into a node mean.
    expect(evidence.get('gpu_temperature_celsius')).toMatchObject({ kind: 'peer', device: 0, value: 84 });
    expect(evidence.get('rdma_link_errors_per_second')?.kind).toBeDefined();
  }, 60_000);

  it('steadfast detect suspects replays the detector over a past window and ranks the nodes that stood out', async () => {
    const output: string[] = [];
    const write = process.stdout.write.bind(process.stdout);
    process.stdout.write = ((chunk: string) => output.push(String(chunk)) > 0) as typeof process.stdout.write;
    try {
      await detectCommand()
        .exitOverride()
        .parseAsync(['suspects', '--prometheus', prometheus.url, '--minutes', '0.2', '--step-seconds', '1'], { from: 'user' });
    } finally {
      process.stdout.write = write;
    }
    const answer = JSON.parse(output.join('')) as {
      evaluations: number;
      nodes: { node: string; anomalousIn: number; evidence: { feature: string }[] }[];
      suspects: { node: string }[];
      failures: string[];
    };
    expect(answer.evaluations).toBe(12);
    expect(answer.failures).toEqual([]);
    expect(answer.nodes.map((entry) => entry.node)).toEqual(['n6']);
    expect(answer.nodes[0]?.anomalousIn).toBeGreaterThanOrEqual(1);
    expect(answer.nodes[0]?.evidence.map((item) => item.feature)).toContain('gpu_temperature_celsius');
    expect(answer.suspects.every((suspect) => suspect.node === 'n6')).toBe(true);
  }, 30_000);

  it('keeps the features that answered and names the query of each one that did not', async () => {
    const good: FeatureQuery = { name: 'power', direction: 'lower', minSpread: 10, query: 'min by (node) (steadfast_gpu_power_watts)' };
    const broken: FeatureQuery[] = [
      { name: 'syntax', direction: 'higher', minSpread: 1, query: 'max by (node) (steadfast_gpu_temperature_celsius' },
      { name: 'no_node', direction: 'higher', minSpread: 1, query: 'max(steadfast_gpu_temperature_celsius)' },
      { name: 'per_gpu', direction: 'higher', minSpread: 1, query: 'steadfast_gpu_temperature_celsius' },
      { name: 'scalar', direction: 'higher', minSpread: 1, query: 'scalar(vector(1))' },
    ];
    const source = new PrometheusFeatureSource({ url: prometheus.url, features: [good, ...broken] });
    const reading = await source.read(Date.now());
    expect(Object.keys(reading.matrix).sort()).toEqual(['n1', 'n2', 'n3', 'n4', 'n5', 'n6']);
    expect(reading.matrix.n6).toEqual({ power: 420 });
    expect(reading.answered).toEqual(['power']);
    expect(reading.failures.map((failure) => failure instanceof PrometheusQueryRejectedError)).toEqual([true, true, true, true]);
    const messages = reading.failures.map((failure) => failure.message);
    broken.forEach((feature, index) => expect(messages[index]).toContain(`feature ${feature.name} (query: ${feature.query})`));
    expect(messages[0]).toMatch(/HTTP 400, bad_data/);
    expect(messages[1]).toMatch(/no `node` label/);
    expect(messages[2]).toMatch(/more than one series for node n\d/);
    expect(messages[3]).toMatch(/returns a scalar/);

    await expect(
      detectSuspects(new PrometheusFeatureSource({ url: prometheus.url, features: broken }), new MultiSignalDetector({ features: detectorFeatures(broken) })),
    ).rejects.toThrow(PrometheusQueryRejectedError);
  });

  it('reports Prometheus down, silent or not Prometheus at all as errors naming the query', async () => {
    const features = DEFAULT_FEATURES.slice(0, 2);
    const detector = new MultiSignalDetector({ features: detectorFeatures(features) });

    const closedPort = await freePort();
    const down = new PrometheusFeatureSource({ url: `http://127.0.0.1:${closedPort}`, features });
    const downReading = await down.read(Date.now());
    expect(downReading.failures.every((failure) => failure instanceof PrometheusUnavailableError)).toBe(true);
    expect(downReading.failures[0]?.message).toContain(`could not reach Prometheus at http://127.0.0.1:${closedPort}`);
    expect(downReading.failures[0]?.message).toContain(features[0]?.query);
    const thrown = await detectSuspects(down, detector).catch((error: unknown) => error);
    expect(thrown).toBeInstanceOf(PrometheusUnavailableError);
    expect((thrown as PrometheusUnavailableError).queries).toEqual(features.map((feature) => feature.query));

    // Accepts the connection and never answers.
    const sockets: Socket[] = [];
    const silent = createTcpServer((socket) => sockets.push(socket));
    const silentPort = await listen(silent);
    try {
      const reading = await new PrometheusFeatureSource({ url: `http://127.0.0.1:${silentPort}`, features, timeoutMs: 300 }).read(Date.now());
      expect(reading.failures[0]).toBeInstanceOf(PrometheusUnavailableError);
      expect(reading.failures[0]?.message).toMatch(/no answer from http:\/\/127\.0\.0\.1:\d+ within 300 ms/);
    } finally {
      sockets.forEach((socket) => socket.destroy());
      silent.close();
    }

    // An exporter's port given by mistake: HTTP 200, but exposition text, not a query answer.
    const notPrometheus = await new PrometheusFeatureSource({
      url: `http://${(exporters[0]?.address() as AddressInfo).address}:${(exporters[0]?.address() as AddressInfo).port}`,
      features,
    }).read(Date.now());
    expect(notPrometheus.failures[0]).toBeInstanceOf(PrometheusQueryRejectedError);
    expect(notPrometheus.failures[0]?.message).toMatch(/HTTP 200 with a body that is not JSON/);
  });

  it('refuses a source without a usable URL or with malformed features, naming the field', () => {
    expect(() => new PrometheusFeatureSource({ url: 'not a url' })).toThrow(/url/);
    expect(() => new PrometheusFeatureSource({ url: prometheus.url, features: [{ name: 'x', direction: 'higher', minSpread: 1, query: '' }] })).toThrow(
      /features\.0\.query/,
    );
    const twice: FeatureQuery = { name: 'x', direction: 'higher', minSpread: 1, query: 'max by (node) (steadfast_gpu_temperature_celsius)' };
    expect(() => new PrometheusFeatureSource({ url: prometheus.url, features: [twice, twice] })).toThrow(/features: feature names must be unique/);
  });
});

describe('the default feature queries', () => {
  it('parse and select only metrics the agent really exports', async () => {
    const produced = new Set([...(await agentMetricNames()), ...PROMETHEUS_METRICS]);
    for (const feature of DEFAULT_FEATURES) {
      const parsed = parsePromql(feature.query);
      expect(parsed.errors, feature.query).toEqual([]);
      expect(parsed.metrics.length, feature.query).toBeGreaterThan(0);
      expect(
        parsed.metrics.filter((name) => !produced.has(name)),
        feature.query,
      ).toEqual([]);
    }
  }, 20_000);
});
