import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PrometheusFeatureSource } from '../../../analyzers/multisignal/source.js';
import { detectCommand } from '../../../cli/detect.js';
import type { SuspectsReport } from '../../../cli/detect-suspects.js';
import { SuspectWatch } from '../../../analyzers/workers/suspect-watch.js';
import { jobSpecSchema } from '../../../core/job.js';
import type { Signal } from '../../../core/signal.js';
import { startPrometheus, type PrometheusPart } from '../../../tryit/parts.js';
import { ProcessGroup } from '../../../tryit/processes.js';
import { runCli } from '../../support/cli.js';
import { until } from '../../support/until.js';

/**
 * A node that stops reporting in a running job is raised for its silence, through a real
 * Prometheus that scrapes real HTTP endpoints once a second: job a (n1–n6) keeps running but n3's
 * agent stops answering; job b (n7–n10) stops as a whole. Every node also exports a counter read
 * over an hour (row remaps): Prometheus keeps answering for it long after the node went quiet,
 * which is what hid silent nodes — only the agent's own liveness says a node is there now.
 */

const JOBS: Record<string, string> = { n1: 'a', n2: 'a', n3: 'a', n4: 'a', n5: 'a', n6: 'a', n7: 'b', n8: 'b', n9: 'b', n10: 'b' };
const QUIET = new Set(['n3', 'n7', 'n8', 'n9', 'n10']);

function exposition(node: string): string {
  const index = Number(node.slice(1));
  const lines = ['steadfast_collector_success{collector="gpu"} 1', 'steadfast_collector_success{collector="xid"} 1'];
  for (const gpu of ['0', '1']) {
    lines.push(
      `steadfast_gpu_temperature_celsius{gpu="${gpu}"} ${60 + 0.3 * index}`,
      `steadfast_gpu_power_watts{gpu="${gpu}"} ${600 + index}`,
      `steadfast_gpu_remapped_rows_total{gpu="${gpu}"} 0`,
    );
  }
  lines.push(`steadfast_training_iteration_seconds{training_job="${JOBS[node] as string}",rank="0"} ${4 + 0.01 * index}`);
  return `${lines.join('\n')}\n`;
}

const processes = new ProcessGroup();
const root = mkdtempSync(join(tmpdir(), 'steadfast-silence-'));
const exporters = new Map<string, Server>();
const stopped = new Set<string>();
let prometheus: PrometheusPart;
let quietSince = 0;

beforeAll(async () => {
  const targets = [];
  for (const node of Object.keys(JOBS)) {
    // A stopped node's endpoint fails its scrapes, as an agent that hangs or a node that is down does.
    const server = createServer((_request, response) =>
      stopped.has(node) ? response.destroy() : response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' }).end(exposition(node)),
    );
    exporters.set(node, server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    targets.push({ address: `127.0.0.1:${(server.address() as AddressInfo).port}`, labels: { node } });
  }
  prometheus = await startPrometheus(processes, root, { targets, ruleFiles: [], alertmanagerAddress: '127.0.0.1:9', intervalSeconds: 1 });
  const source = new PrometheusFeatureSource({ url: prometheus.url });
  await until(
    'every node reporting with its training job',
    async () => ({ reading: await source.read(Date.now()), groups: await source.readGroups(Date.now()) }),
    ({ reading, groups }) => Object.keys(reading.matrix).length === 10 && Object.keys(groups.groups).length === 10,
    45_000,
  );
  await new Promise((resolve) => setTimeout(resolve, 3000));
  for (const node of QUIET) stopped.add(node);
  quietSince = Date.now();
  // Until Prometheus has marked the quiet nodes' series stale.
  await until(
    'the quiet nodes no longer reporting',
    () => source.read(Date.now()),
    (reading) => [...QUIET].every((node) => reading.stopped?.includes(node)),
    30_000,
  );
}, 90_000);

afterAll(async () => {
  await processes.stopAll();
  await Promise.all([...exporters.values()].map((server) => new Promise((resolve) => server.close(resolve))));
  rmSync(root, { recursive: true, force: true });
});

describe('a node that goes quiet in a running job', () => {
  it('is left out of the matrix though its hour-long counter still answers, and stays a member of its job', async () => {
    const source = new PrometheusFeatureSource({ url: prometheus.url });
    const reading = await source.read(Date.now());
    expect(reading.stopped).toEqual(['n10', 'n3', 'n7', 'n8', 'n9']);
    expect(Object.keys(reading.matrix).sort()).toEqual(['n1', 'n2', 'n4', 'n5', 'n6']);
    const groups = await source.readGroups(Date.now(), reading.stopped);
    expect(groups.groups.n3).toBe('a');
    expect(groups.groups.n7).toBe('b');
  }, 30_000);

  it('is raised for its silence by detect suspects; a job that stopped as a whole is not', async () => {
    // The evaluations from the moment they went quiet, one a second.
    await new Promise((resolve) => setTimeout(resolve, Math.max(0, quietSince + 7000 - Date.now())));
    const seconds = (Date.now() - quietSince) / 1000;
    const run = await runCli(detectCommand(), ['suspects', '--prometheus', prometheus.url, '--minutes', String(seconds / 60), '--step-seconds', '1']);
    expect(run.exitCode, run.stderr).toBe(0);
    const report = JSON.parse(run.stdout) as SuspectsReport;
    expect(report.suspects.map((suspect) => [suspect.node, suspect.reason])).toEqual([['n3', 'silence']]);
    expect(report.silent).toEqual(['n3']);
  }, 30_000);

  it('is raised for its silence online, for the registered job whose other nodes report', async () => {
    const raised: Signal[] = [];
    const watch = new SuspectWatch({ source: new PrometheusFeatureSource({ url: prometheus.url }), enqueue: async (signals) => void raised.push(...signals) });
    const spec = (name: string, nodes: string[]) => jobSpecSchema.parse({ name, nodes, ranksPerNode: 8, launcher: 'slurm', codeVersion: 'v1' });
    const jobs = [spec('a', ['n1', 'n2', 'n3', 'n4', 'n5', 'n6']), spec('b', ['n7', 'n8', 'n9', 'n10'])];
    for (let evaluation = 0; evaluation < 5; evaluation += 1) await watch.run(jobs, Date.now() + evaluation * 1000);
    expect(raised.map((signal) => [signal.node, signal.evidence?.reason])).toEqual([['n3', 'silence']]);
  }, 30_000);
});
