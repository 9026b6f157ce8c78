import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { repoRoot } from '../core/paths.js';
import { buildFixtureNode } from '../tryit/fixture-node.js';
import { ProcessGroup, freePorts, httpOk, waitFor } from '../tryit/processes.js';
import { quantile } from './stats.js';

/**
 * Scrape cost of the agent against Debian's prometheus-node-exporter, in the same run, on the
 * same fixture node (8 GPUs, 8 InfiniBand ports, 4 NFS mounts, one with nconnect=16).
 * node_exporter runs only its infiniband and mountstats collectors; the agent runs all of its
 * collectors, so it reads more (nvidia-smi XML, the kernel log, the process table) and exports
 * more series.
 */

const SCRAPES = Number(process.env.STEADFAST_BENCH_SCRAPES ?? 300);
const WARMUP = 30;
const CLOCK_TICKS_PER_SECOND = 100;

function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // utime and stime are fields 14 and 15 of stat; after the command they are at 11 and 12.
  return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND;
}

interface Target {
  readonly name: string;
  readonly url: string;
  readonly pid: number;
  readonly latencies: number[];
  cpuStart: number;
  series: number;
}

async function scrape(target: Target): Promise<number> {
  const started = performance.now();
  const response = await fetch(target.url);
  const text = await response.text();
  const elapsed = performance.now() - started;
  if (!response.ok) throw new Error(`${target.name} answered ${response.status}`);
  target.series = text.split('\n').filter((line) => line !== '' && !line.startsWith('#')).length;
  return elapsed;
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-scrape-'));
  const group = new ProcessGroup();
  try {
    const node = buildFixtureNode(root);
    const [agentPort, exporterPort] = await freePorts(2);
    const exporter = group.start(
      'node_exporter',
      'prometheus-node-exporter',
      [
        `--web.listen-address=127.0.0.1:${exporterPort}`,
        `--path.sysfs=${node.sysfs}`,
        `--path.procfs=${node.procfs}`,
        '--collector.disable-defaults',
        '--collector.infiniband',
        '--collector.mountstats',
      ],
      join(root, 'node_exporter.log'),
    );
    const agent = group.start(
      'agent',
      process.execPath,
      [
        join(repoRoot(), 'bin', 'steadfast.js'),
        'agent',
        '--web.listen-address',
        `127.0.0.1:${agentPort}`,
        '--node',
        'fixture-node',
        '--path.sysfs',
        node.sysfs,
        '--path.procfs',
        node.procfs,
        '--path.kmsg',
        node.kmsg,
        '--nvidia-smi.xml',
        node.nvidiaSmiXml,
        '--web.insecure',
      ],
      join(root, 'agent.log'),
      { env: { ...process.env, STEADFAST_LOG_LEVEL: 'warn' } },
    );
    const targets: Target[] = [
      { name: 'steadfast agent (all collectors)', url: `http://127.0.0.1:${agentPort}/metrics`, pid: agent.pid ?? 0, latencies: [], cpuStart: 0, series: 0 },
      {
        name: 'node_exporter 1.5 (infiniband + mountstats)',
        url: `http://127.0.0.1:${exporterPort}/metrics`,
        pid: exporter.pid ?? 0,
        latencies: [],
        cpuStart: 0,
        series: 0,
      },
    ];
    for (const target of targets) await waitFor(`${target.name} to serve /metrics`, () => httpOk(target.url), 20_000);
    for (let i = 0; i < WARMUP; i += 1) for (const target of targets) await scrape(target);
    for (const target of targets) target.cpuStart = cpuSeconds(target.pid);
    // Interleaved, so both see the same machine conditions.
    for (let i = 0; i < SCRAPES; i += 1) for (const target of targets) target.latencies.push(await scrape(target));

    process.stdout.write(`\nScrape cost on a fixture node (8 GPUs, 8 IB ports, 4 NFS mounts incl. nconnect=16), ${SCRAPES} scrapes each, interleaved\n`);
    process.stdout.write(`machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}\n\n`);
    process.stdout.write('| exporter | series | p50 ms | p95 ms | CPU ms / scrape |\n|---|---|---|---|---|\n');
    const figures = targets.map((target) => {
      const sorted = [...target.latencies].sort((a, b) => a - b);
      const cpuPerScrape = ((cpuSeconds(target.pid) - target.cpuStart) * 1000) / SCRAPES;
      const row = { p50: quantile(sorted, 0.5), p95: quantile(sorted, 0.95), cpu: cpuPerScrape };
      process.stdout.write(`| ${target.name} | ${target.series} | ${row.p50.toFixed(2)} | ${row.p95.toFixed(2)} | ${row.cpu.toFixed(2)} |\n`);
      return row;
    });
    const [ours, theirs] = figures as [(typeof figures)[0], (typeof figures)[0]];
    process.stdout.write(
      `\nratio agent / node_exporter: latency p50 ${(ours.p50 / theirs.p50).toFixed(2)}, CPU per scrape ${(ours.cpu / theirs.cpu).toFixed(2)} (target ≤ 1.0)\n`,
    );
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
