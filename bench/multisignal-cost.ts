import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { PrometheusFeatureSource, type FeatureReading, type FeatureSource } from '../analyzers/multisignal/source.js';
import { DEFAULT_WATCH_WARMUP, SuspectWatch } from '../analyzers/workers/suspect-watch.js';
import { suspectsOverWindow } from '../analyzers/multisignal/window.js';
import { jobSpecSchema } from '../core/job.js';
import { ProcessGroup } from '../tryit/processes.js';
import { backfillFleet, startPrometheusOn } from './heldout/backfill.js';
import { HOUR, MINUTE } from './heldout/fleet.js';
import { quantile } from './stats.js';
import { GPUS, JOB, STEP_SECONDS, costPlan, writeExtraSeries } from './multisignal-cost-fleet.js';

/**
 * What the multi-signal detector costs per evaluation as one training job grows: for each size
 * (STEADFAST_BENCH_COST_NODES, default 64, 256 and 1,024 nodes of 8 GPUs, all in ONE job), a
 * healthy history of the agents' series (bench/heldout's writer over a one-job plan: per-GPU
 * temperature, power, clocks, utilization, throttling, ECC, remaps, PCIe replays, Xid counters,
 * RDMA port counters, NFS, training iteration) is backfilled with promtool into the real
 * Prometheus, and then, on the same machine in the same run:
 *
 * - the controller's online watch (SuspectWatch.run: PrometheusFeatureSource.read + the
 *   detector's evaluate, once a minute): wall and process CPU per evaluation, median of
 *   STEADFAST_BENCH_COST_EVALUATIONS after a warm-up that lets the nodes' own normals be learnt,
 *   and Prometheus' own CPU (its process_cpu_seconds_total) over them;
 * - one 15-minute window as `steadfast detect suspects --minutes 15 --nodes <the job's nodes>`
 *   replays it (suspectsOverWindow with the CLI's defaults: 15 evaluations a minute apart after
 *   18 readings over the 3 hours before): wall, process CPU and Prometheus CPU;
 * - each feature query alone, one after another: wall, Prometheus' own evaluation time and the
 *   samples it touched (`stats=all`), to say which query dominates.
 *
 * Ratios are per node against the smallest size of the same run. Timing is printed, never asserted.
 */

const SIZES = (process.env.STEADFAST_BENCH_COST_NODES ?? '64,256,1024').split(',').map(Number);
/** Hours of history: the CLI's 3-hour warm-up, the window, and the hour the longest queries look back. */
const HOURS = Number(process.env.STEADFAST_BENCH_COST_HOURS ?? 4.5);
const EVALUATIONS = Number(process.env.STEADFAST_BENCH_COST_EVALUATIONS ?? 10);
/** Warm-up evaluations 5 minutes apart before the measured ones: the detector samples each node's normal every 5 minutes and needs 6. */
const WARM_UP = Number(process.env.STEADFAST_BENCH_COST_WARMUP ?? 7);
/** Seconds Prometheus is given after start to merge the overlapping backfilled blocks before anything is measured (0: do not wait). */
const SETTLE_SECONDS = Number(process.env.STEADFAST_BENCH_COST_SETTLE_SECONDS ?? 70);
/** Repetitions of each single feature query. */
const QUERY_REPEATS = 3;

for (const [name, value] of [
  ['STEADFAST_BENCH_COST_HOURS', HOURS],
  ['STEADFAST_BENCH_COST_EVALUATIONS', EVALUATIONS],
] as const) {
  if (!(value > 0)) throw new RangeError(`${name} must be a positive number, got ${value}`);
}
if (SIZES.length === 0 || SIZES.some((size) => !Number.isInteger(size) || size < 5))
  throw new RangeError(`STEADFAST_BENCH_COST_NODES: node counts of at least 5 (the detector's fewest peers), got ${SIZES.join(',')}`);

/** Times each read (wall and this process's CPU), so that the evaluation's own share is what remains. */
class TimedSource implements FeatureSource {
  readMs: number[] = [];
  readCpuMs: number[] = [];
  failures = 0;
  constructor(private readonly source: FeatureSource) {}
  async read(time: number): Promise<FeatureReading> {
    const cpu = process.cpuUsage();
    const started = performance.now();
    const reading = await this.source.read(time);
    this.readMs.push(performance.now() - started);
    this.readCpuMs.push(cpuMs(process.cpuUsage(cpu)));
    this.failures += reading.failures.length;
    return reading;
  }
}

function cpuMs(usage: NodeJS.CpuUsage): number {
  return (usage.user + usage.system) / 1000;
}

async function prometheusMetric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${name} `));
  if (line === undefined) throw new Error(`Prometheus' /metrics has no ${name}`);
  return Number(line.slice(name.length + 1));
}

const prometheusCpuSeconds = (url: string) => prometheusMetric(url, 'process_cpu_seconds_total');

/**
 * Waits until Prometheus has merged the backfilled blocks (promtool writes one per part, all over
 * the same hours; Prometheus compacts overlapping blocks a minute after it starts) and is idle:
 * under 2 % of a core over 5 s. Returns the seconds waited and the blocks left.
 */
async function settle(url: string): Promise<{ seconds: number; blocks: number }> {
  const started = performance.now();
  if (SETTLE_SECONDS > 0) {
    await sleep(SETTLE_SECONDS * 1000);
    for (let round = 0; round < 120; round += 1) {
      const before = await prometheusCpuSeconds(url);
      await sleep(5000);
      if ((await prometheusCpuSeconds(url)) - before < 0.1) break;
    }
  }
  return { seconds: (performance.now() - started) / 1000, blocks: await prometheusMetric(url, 'prometheus_tsdb_blocks_loaded') };
}

interface QueryFigures {
  readonly name: string;
  readonly wallMs: number;
  readonly evalMs: number;
  readonly samples: number;
  readonly series: number;
  readonly bytes: number;
}

/** One query alone (after the others), QUERY_REPEATS times: median wall, Prometheus' evaluation time, samples touched. */
async function timeQuery(url: string, name: string, query: string, time: number): Promise<QueryFigures> {
  const walls: number[] = [];
  let last: { evalMs: number; samples: number; series: number; bytes: number } = { evalMs: Number.NaN, samples: Number.NaN, series: 0, bytes: 0 };
  for (let repeat = 0; repeat < QUERY_REPEATS; repeat += 1) {
    const params = new URLSearchParams({ query, time: (time / 1000).toFixed(3), stats: 'all' });
    const started = performance.now();
    const response = await fetch(`${url}/api/v1/query?${params}`, { signal: AbortSignal.timeout(60_000) });
    const body = await response.text();
    walls.push(performance.now() - started);
    const json = JSON.parse(body) as {
      status: string;
      error?: string;
      data?: { result?: unknown[]; stats?: { timings?: { evalTotalTime?: number }; samples?: { totalQueryableSamples?: number } } };
    };
    if (json.status !== 'success') throw new Error(`query ${name} failed: ${json.error ?? body.slice(0, 200)}`);
    last = {
      evalMs: (json.data?.stats?.timings?.evalTotalTime ?? Number.NaN) * 1000,
      samples: json.data?.stats?.samples?.totalQueryableSamples ?? Number.NaN,
      series: json.data?.result?.length ?? 0,
      bytes: body.length,
    };
  }
  return {
    name,
    wallMs: quantile(
      walls.sort((a, b) => a - b),
      0.5,
    ),
    ...last,
  };
}

interface SizeFigures {
  readonly nodes: number;
  readonly samples: number;
  readonly backfillSeconds: number;
  readonly settleSeconds: number;
  readonly blocks: number;
  /** The watch's first run on the job, with its warm-up readings of history. */
  readonly startWallS: number;
  readonly evalWallMs: number;
  readonly evalCpuMs: number;
  readonly readWallMs: number;
  readonly readCpuMs: number;
  readonly prometheusCpuMs: number;
  readonly windowWallS: number;
  readonly windowCpuS: number;
  readonly windowPrometheusCpuS: number;
  readonly windowSuspects: number;
  readonly onlineSuspects: number;
  readonly nodesRead: number;
  readonly failures: number;
  /** The machine's 1-minute load average after the online evaluations: what else shared the two cores. */
  readonly load: number;
  readonly queries: readonly QueryFigures[];
}

async function measure(nodes: number): Promise<SizeFigures> {
  // Data in the recent past, whole minutes, ending an hour ago (Prometheus' head stays out of it).
  const start = Math.floor((Date.now() - HOURS * HOUR - HOUR) / MINUTE) * MINUTE;
  const plan = costPlan(nodes, start, HOURS);
  const root = mkdtempSync(join(tmpdir(), 'steadfast-multisignal-cost-'));
  const group = new ProcessGroup();
  try {
    process.stderr.write(`bench: ${nodes} nodes × ${GPUS} GPUs, one job, ${HOURS} h at ${STEP_SECONDS} s: writing and backfilling …\n`);
    const backfilled = await backfillFleet(plan, root, join(root, 'data'), 64);
    const extraStarted = performance.now();
    const extraFile = join(root, 'extra.om');
    const extraSamples = await writeExtraSeries(plan, extraFile);
    await promisify(execFile)('promtool', ['tsdb', 'create-blocks-from', 'openmetrics', '--max-block-duration=500h', extraFile, join(root, 'data')], {
      maxBuffer: 16 * 1024 * 1024,
    });
    rmSync(extraFile, { force: true });
    const backfill = { samples: backfilled.samples + extraSamples, backfillSeconds: backfilled.backfillSeconds + (performance.now() - extraStarted) / 1000 };
    const { url } = await startPrometheusOn(group, root, join(root, 'data'));
    const settled = await settle(url);
    process.stderr.write(
      `bench:   ${backfill.samples} samples in ${backfill.backfillSeconds.toFixed(0)} s; Prometheus settled after ${settled.seconds.toFixed(0)} s with ${settled.blocks} block(s)\n`,
    );

    const spec = jobSpecSchema.parse({ name: JOB, nodes: plan.nodes, ranksPerNode: GPUS, launcher: 'slurm', codeVersion: 'cost' });
    const source = new PrometheusFeatureSource({ url });
    const timed = new TimedSource(source);
    let onlineSuspects = 0;
    const watch = new SuspectWatch({ source: timed, enqueue: async (signals) => void (onlineSuspects += signals.length) });
    const windowEnd = plan.end - MINUTE;
    const firstMeasured = windowEnd - (EVALUATIONS - 1) * MINUTE;
    // The first run learns the job's nodes from history first (DEFAULT_WATCH_WARMUP readings): what a controller start costs, once per job.
    let startWallS = 0;
    for (let index = WARM_UP; index >= 1; index -= 1) {
      const started = performance.now();
      await watch.run([spec], firstMeasured - index * 5 * MINUTE);
      if (index === WARM_UP) startWallS = (performance.now() - started) / 1000;
    }
    timed.readMs = [];
    timed.readCpuMs = [];
    const walls: number[] = [];
    const cpu: number[] = [];
    const prometheusBefore = await prometheusCpuSeconds(url);
    for (let index = 0; index < EVALUATIONS; index += 1) {
      const cpuBefore = process.cpuUsage();
      const started = performance.now();
      await watch.run([spec], firstMeasured + index * MINUTE);
      walls.push(performance.now() - started);
      cpu.push(cpuMs(process.cpuUsage(cpuBefore)));
    }
    const prometheusCpuMs = (((await prometheusCpuSeconds(url)) - prometheusBefore) * 1000) / EVALUATIONS;
    const load = loadavg()[0] as number;
    const nodesRead = Object.keys((await source.read(windowEnd)).matrix).length;

    process.stderr.write(
      `bench:   online p50 ${quantile(
        [...walls].sort((a, b) => a - b),
        0.5,
      ).toFixed(0)} ms; replaying a 15-minute window as the CLI does …\n`,
    );
    const windowPrometheusBefore = await prometheusCpuSeconds(url);
    const windowCpu = process.cpuUsage();
    const windowStarted = performance.now();
    // `steadfast detect suspects --minutes 15 --nodes <the job's nodes>`, its defaults: a step of 60 s, 3 h of warm-up every 10 min.
    const report = await suspectsOverWindow(source, {
      end: windowEnd,
      steps: 15,
      stepMs: MINUTE,
      only: new Set(plan.nodes),
      peers: 'all',
      warmupSteps: 18,
      warmupStepMs: 10 * MINUTE,
    });
    const windowWallS = (performance.now() - windowStarted) / 1000;
    const windowCpuS = cpuMs(process.cpuUsage(windowCpu)) / 1000;
    const windowPrometheusCpuS = (await prometheusCpuSeconds(url)) - windowPrometheusBefore;
    if (report.failures.length > 0) process.stderr.write(`bench:   the window's failed queries: ${report.failures.join('\n')}\n`);

    const queries: QueryFigures[] = [];
    const liveQuery = 'group by (node) (steadfast_collector_success{job="steadfast-agent"}) or group by (node) (up{job="steadfast-agent"} == 1)';
    queries.push(await timeQuery(url, '(nodes reporting)', liveQuery, windowEnd));
    for (const feature of source.features) queries.push(await timeQuery(url, feature.name, feature.query, windowEnd));

    const sorted = (values: number[]) => [...values].sort((a, b) => a - b);
    return {
      nodes,
      samples: backfill.samples,
      backfillSeconds: backfill.backfillSeconds,
      settleSeconds: settled.seconds,
      blocks: settled.blocks,
      startWallS,
      evalWallMs: quantile(sorted(walls), 0.5),
      evalCpuMs: quantile(sorted(cpu), 0.5),
      readWallMs: quantile(sorted(timed.readMs), 0.5),
      readCpuMs: quantile(sorted(timed.readCpuMs), 0.5),
      prometheusCpuMs,
      windowWallS,
      windowCpuS,
      windowPrometheusCpuS,
      windowSuspects: report.suspects.length,
      onlineSuspects,
      nodesRead,
      failures: timed.failures + report.failures.length,
      load,
      queries,
    };
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

function ratio(value: number, nodes: number, base: number, baseNodes: number): string {
  return `${(value / nodes / (base / baseNodes)).toFixed(2)}×`;
}

async function main(): Promise<void> {
  const began = performance.now();
  const results: SizeFigures[] = [];
  for (const nodes of SIZES) results.push(await measure(nodes));
  const base = results[0] as SizeFigures;
  const out = process.stdout;
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  out.write(
    `\nMulti-signal detector cost per evaluation, one training job of N nodes × ${GPUS} GPUs, the real Prometheus over ${HOURS} h of backfilled history at ${STEP_SECONDS} s\n`,
  );
  out.write(
    `machine: ${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; load average at the end ${loadavg()
      .map((value) => value.toFixed(2))
      .join(' ')}\n`,
  );
  out.write(
    `online: SuspectWatch.run (feature read + evaluate), median of ${EVALUATIONS} evaluations 60 s apart after ${WARM_UP} warm-up evaluations (the first of them also reads ${DEFAULT_WATCH_WARMUP.readings} readings of history: "watch start"); window: suspectsOverWindow as \`steadfast detect suspects --minutes 15 --nodes …\` (15 evaluations + 18 warm-up readings)\n\n`,
  );
  out.write(
    '| nodes | GPUs | samples backfilled | backfill s | blocks | watch start wall s | online eval wall ms p50 | of which read ms | CPU ms p50 | of which read CPU ms | Prometheus CPU ms / eval | 15-min window wall s | window CPU s | window Prometheus CPU s | suspects (online / window) | failed queries | load average |\n',
  );
  out.write('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n');
  for (const r of results) {
    out.write(
      `| ${r.nodes} | ${r.nodes * GPUS} | ${(r.samples / 1e6).toFixed(1)} M | ${r.backfillSeconds.toFixed(0)} | ${r.blocks} | ${r.startWallS.toFixed(1)} | ${r.evalWallMs.toFixed(0)} | ${r.readWallMs.toFixed(0)} | ${r.evalCpuMs.toFixed(0)} | ${r.readCpuMs.toFixed(0)} | ${r.prometheusCpuMs.toFixed(0)} | ${r.windowWallS.toFixed(1)} | ${r.windowCpuS.toFixed(1)} | ${r.windowPrometheusCpuS.toFixed(1)} | ${r.onlineSuspects} / ${r.windowSuspects} | ${r.failures} | ${r.load.toFixed(1)} |\n`,
    );
  }
  out.write(`\nPer-node cost against ${base.nodes} nodes (1.00× = grows linearly with nodes; below 1 = less than linear):\n\n`);
  out.write('| nodes | online wall / node | online CPU / node | Prometheus CPU / node | window wall / node | window CPU / node |\n|---|---|---|---|---|---|\n');
  for (const r of results) {
    out.write(
      `| ${r.nodes} | ${ratio(r.evalWallMs, r.nodes, base.evalWallMs, base.nodes)} | ${ratio(r.evalCpuMs, r.nodes, base.evalCpuMs, base.nodes)} | ${ratio(r.prometheusCpuMs, r.nodes, base.prometheusCpuMs, base.nodes)} | ${ratio(r.windowWallS, r.nodes, base.windowWallS, base.nodes)} | ${ratio(r.windowCpuS, r.nodes, base.windowCpuS, base.nodes)} |\n`,
    );
  }
  out.write(
    '\nThe online watch (one evaluation per 60 s of controller time):\n\n| nodes | controller CPU ms / min | share of one core | Prometheus CPU ms / min | share of one core |\n|---|---|---|---|---|\n',
  );
  for (const r of results) {
    out.write(
      `| ${r.nodes} | ${r.evalCpuMs.toFixed(0)} | ${((100 * r.evalCpuMs) / 60_000).toFixed(2)} % | ${r.prometheusCpuMs.toFixed(0)} | ${((100 * r.prometheusCpuMs) / 60_000).toFixed(2)} % |\n`,
    );
  }
  out.write(
    `\nEach query alone, one after another at the window's end (median of ${QUERY_REPEATS}; Prometheus' evaluation time and samples touched from stats=all):\n\n`,
  );
  out.write(
    `| query | ${results.map((r) => `${r.nodes} nodes: wall ms / eval ms`).join(' | ')} | samples touched at ${results.at(-1)?.nodes} | series answered | response KiB | share of the sequential wall at ${results.at(-1)?.nodes} |\n`,
  );
  out.write(`|---|${results.map(() => '---|').join('')}---|---|---|---|\n`);
  const last = results.at(-1) as SizeFigures;
  const totalWall = last.queries.reduce((sum, query) => sum + query.wallMs, 0);
  last.queries.forEach((query, index) => {
    const cells = results.map((r) => {
      const q = r.queries[index] as QueryFigures;
      return `${q.wallMs.toFixed(1)} / ${q.evalMs.toFixed(1)}`;
    });
    out.write(
      `| ${query.name} | ${cells.join(' | ')} | ${query.samples} | ${query.series} | ${(query.bytes / 1024).toFixed(0)} | ${((100 * query.wallMs) / totalWall).toFixed(0)} % |\n`,
    );
  });
  out.write(`\nnodes in the matrix at the window's end: ${results.map((r) => `${r.nodesRead} of ${r.nodes}`).join(', ')}\n`);
  out.write(`bench wall time: ${((performance.now() - began) / 1000).toFixed(0)} s\n`);
  if (results.some((r) => r.failures > 0 || r.nodesRead !== r.nodes)) process.exitCode = 1;
}

await main();
