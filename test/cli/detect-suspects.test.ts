import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { PrometheusFeatureSource } from '../../analyzers/multisignal/source.js';
import { detectCommand } from '../../cli/detect.js';
import type { SuspectsReport } from '../../cli/detect-suspects.js';
import { AGENT_SCRAPE_JOB } from '../../core/scrape.js';
import { startPrometheus, type PrometheusPart } from '../../tryit/parts.js';
import { ProcessGroup, freePort } from '../../tryit/processes.js';
import { runCli, type CliRun } from '../support/cli.js';
import { until } from '../support/until.js';

/**
 * `steadfast detect suspects` against a real Prometheus whose fleet names things its own way: the
 * node label is `host`, the training job label `run`. Two jobs of six nodes; job b runs a lighter
 * model (less power), and h3 of job a has one hot GPU. Only GPU temperature, power, the Xid
 * collector and iteration times are exported: every other default feature has no data.
 */
const JOBS: Record<string, string> = { h1: 'a', h2: 'a', h3: 'a', h4: 'a', h5: 'a', h6: 'a', h7: 'b', h8: 'b', h9: 'b', h10: 'b', h11: 'b', h12: 'b' };

function exposition(host: string): string {
  const index = Number(host.slice(1));
  const run = JOBS[host] as string;
  const power = (run === 'a' ? 650 : 420) + index;
  const lines = ['steadfast_collector_success{collector="xid"} 1'];
  for (const gpu of ['0', '1']) {
    const hot = host === 'h3' && gpu === '0';
    lines.push(`steadfast_gpu_temperature_celsius{gpu="${gpu}"} ${hot ? 86 : 60 + 0.3 * index}`, `steadfast_gpu_power_watts{gpu="${gpu}"} ${power}`);
  }
  lines.push(`steadfast_training_iteration_seconds{run="${run}",rank="0"} ${run === 'a' ? 4.2 + 0.01 * index : 2.1 + 0.01 * index}`);
  return `${lines.join('\n')}\n`;
}

const processes = new ProcessGroup();
const root = mkdtempSync(join(tmpdir(), 'steadfast-detect-suspects-'));
const exporters: Server[] = [];
let prometheus: PrometheusPart;

beforeAll(async () => {
  const targets = [];
  for (const host of Object.keys(JOBS)) {
    const server = createServer((_request, response) => response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(exposition(host)));
    exporters.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    targets.push({ address: `127.0.0.1:${(server.address() as AddressInfo).port}`, labels: { host } });
  }
  prometheus = await startPrometheus(processes, root, { targets, ruleFiles: [], alertmanagerAddress: '127.0.0.1:9', intervalSeconds: 1 });
  // Wait until every host's temperature and run label were in Prometheus already at the start of
  // the commands' 12-second window, so each of their evaluations sees the whole fleet.
  const source = new PrometheusFeatureSource({ url: prometheus.url, nodeLabel: 'host', trainingJobLabel: 'run' });
  const windowStart = () => Date.now() - 13_000;
  await until(
    'every host reporting with its run label since the start of the window',
    async () => ({ reading: await source.read(windowStart()), groups: await source.readGroups(windowStart()) }),
    ({ reading, groups }) => Object.keys(reading.matrix).length === 12 && Object.keys(groups.groups).length === 12,
    45_000,
  );
}, 60_000);

afterAll(async () => {
  await processes.stopAll();
  await Promise.all(exporters.map((server) => new Promise((resolve) => server.close(resolve))));
  rmSync(root, { recursive: true, force: true });
});

afterEach(() => {
  process.exitCode = undefined;
  vi.restoreAllMocks();
});

/** `detect suspects` over the last 12 seconds, one evaluation a second. */
function suspects(...args: string[]): Promise<CliRun> {
  return runCli(detectCommand(), ['suspects', '--prometheus', prometheus.url, '--minutes', '0.2', '--step-seconds', '1', ...args]);
}

const reportOf = (run: CliRun) => JSON.parse(run.stdout) as SuspectsReport;

describe('steadfast detect suspects on a real Prometheus', () => {
  it("with the fleet's own label names, groups the nodes by training job and raises the node unlike its job", async () => {
    const run = await suspects('--node-label', 'host', '--training-job-label', 'run');
    expect(run.exitCode, run.stderr).toBe(0);
    const report = reportOf(run);
    expect(report.failures).toEqual([]);
    expect(report.peers.mode).toBe('training-job');
    expect(report.peers.groups.map((group) => [group.group, group.members, group.peerScored])).toEqual([
      ['a', 6, true],
      ['b', 6, true],
    ]);
    expect(report.peers.ungrouped).toEqual([]);
    // Job b's lighter load is its own normal, not six anomalies: only h3, on its hot GPU 0.
    expect(report.suspects.map((suspect) => [suspect.node, suspect.group])).toEqual([['h3', 'a']]);
    expect(report.nodes.map((node) => node.node)).toEqual(['h3']);
    expect(report.nodes[0]?.evidence).toContainEqual(expect.objectContaining({ feature: 'gpu_temperature_celsius', device: 0, value: 86 }));
  }, 30_000);

  it('names each feature without data and why: a metric nobody exports', async () => {
    const report = reportOf(await suspects('--node-label', 'host', '--training-job-label', 'run'));
    const missing = new Map(report.missing.map((entry) => [entry.feature, entry.reason]));
    expect(missing.get('gpu_temperature_celsius')).toBeUndefined();
    expect(missing.get('gpu_ecc_correctable_10m')).toBe('no series of steadfast_gpu_ecc_errors_total in the last 10 minutes');
    expect(missing.get('nfs_getattr_rtt_seconds')).toBe('no series of steadfast_nfs_rtt_seconds_total in the last 10 minutes');
  }, 30_000);

  it('says the node label is wrong when the series carry none, and that nobody could be grouped', async () => {
    const run = await suspects();
    expect(run.exitCode, run.stderr).toBe(0);
    const report = reportOf(run);
    const missing = new Map(report.missing.map((entry) => [entry.feature, entry.reason]));
    expect(missing.get('gpu_temperature_celsius')).toBe(
      'steadfast_gpu_temperature_celsius series have no node label (set the node label, or add it when scraping)',
    );
    expect(missing.get('gpu_power_watts')).toMatch(/have no node label/);
    expect(report.suspects).toEqual([]);
    expect(report.peers.groups).toEqual([]);
    expect(run.stderr).toContain('no node carried the training_job label, so none was compared with peers');
  }, 30_000);

  it('says the metrics are under another scrape job when --scrape-job names the wrong one', async () => {
    const run = await suspects('--node-label', 'host', '--training-job-label', 'run', '--scrape-job', 'gpu-nodes');
    expect(run.exitCode, run.stderr).toBe(0);
    const report = reportOf(run);
    const missing = new Map(report.missing.map((entry) => [entry.feature, entry.reason]));
    expect(missing.get('gpu_temperature_celsius')).toBe(
      `steadfast_gpu_temperature_celsius is scraped under job(s) ${AGENT_SCRAPE_JOB}, not gpu-nodes (set the scrape job)`,
    );
    expect(report.suspects).toEqual([]);
  }, 30_000);

  it('compares every node with every other with --peers all', async () => {
    const report = reportOf(await suspects('--node-label', 'host', '--peers', 'all'));
    expect(report.peers.mode).toBe('all');
    expect(report.peers.groups.map((group) => [group.group, group.members])).toEqual([['all', 12]]);
  }, 30_000);

  it('exits 1 naming the address when every query failed, and never prints a healthy-looking report', async () => {
    const closed = await freePort();
    const run = await runCli(detectCommand(), [
      'suspects',
      '--prometheus',
      `http://127.0.0.1:${closed}`,
      '--minutes',
      '0.05',
      '--step-seconds',
      '1',
      '--baseline-hours',
      '0',
    ]);
    expect(run.exitCode).toBe(1);
    expect(run.stdout).toBe('');
    expect(run.stderr).toContain('every query failed');
    expect(run.stderr).toContain(`could not reach Prometheus at http://127.0.0.1:${closed}`);
  }, 30_000);

  it('exits 2 naming the flag for a label name Prometheus could not have', async () => {
    const node = await suspects('--node-label', 'host-name');
    expect(node.exitCode).toBe(2);
    expect(node.stderr).toContain('--node-label: must be a Prometheus label name');
    const training = await suspects('--training-job-label', '1job');
    expect(training.exitCode).toBe(2);
    expect(training.stderr).toContain('--training-job-label: must be a Prometheus label name');
    const job = await suspects('--scrape-job', 'a"b');
    expect(job.exitCode).toBe(2);
    expect(job.stderr).toContain('--scrape-job: must not hold quotes');
  });
});
