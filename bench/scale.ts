import { cpus, totalmem } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { PrometheusFeatureSource } from '../analyzers/multisignal/source.js';
import { agentSelector, equals, series } from '../core/promql.js';
import { QUEUE_NAMES } from '../core/queues.js';
import { ScaleCluster, type InjectionResult } from '../tryit/scale-cluster.js';
import { quantile } from './stats.js';

/**
 * Signal → action latency at scale: a simulated cluster of STEADFAST_BENCH_SCALE_NODES nodes
 * (default 256) scraped every second by the real Prometheus with the shipped rules, half of it
 * running one registered job watched by the online analyzers, against the same injections on an
 * 8-node cluster in the same run as the baseline. Each run injects fatal Xids on distinct nodes
 * outside the job, through the fast path and through Prometheus alone, and times injection →
 * drain done. It also reports what Prometheus and the analyzers spend keeping up.
 */

const LARGE = Number(process.env.STEADFAST_BENCH_SCALE_NODES ?? 256);
const BASELINE = 8;
const INJECTIONS = Number(process.env.STEADFAST_BENCH_INJECTIONS ?? 10);

interface RunFigures {
  readonly nodes: number;
  readonly fast: number[];
  readonly prometheus: number[];
  readonly failures: number;
  readonly doubleDrains: number;
  /** CPU cores the controller process used on average while faults were injected. */
  readonly controllerCpu: number;
  readonly scrapeP50Ms: number;
  readonly ruleGroupMaxMs: number;
  readonly samplesPerScrape: number;
  readonly featureReadMs: number;
  readonly oldestWaitingSignalS: number;
  readonly targetsDown: number;
}

async function median(times: number, work: () => Promise<void>): Promise<number> {
  const spans: number[] = [];
  for (let index = 0; index < times; index += 1) {
    const started = performance.now();
    await work();
    spans.push(performance.now() - started);
  }
  return quantile(
    spans.sort((a, b) => a - b),
    0.5,
  );
}

async function measure(nodes: number): Promise<RunFigures> {
  process.stderr.write(`bench: starting a ${nodes}-node simulated cluster …\n`);
  // Half the cluster runs a job the analyzers watch; faults go to the other half (the drain path).
  const jobNodes = Math.floor(nodes / 2);
  const cluster = await ScaleCluster.start({
    nodes,
    jobNodes,
    progress: (step, seconds) => process.stderr.write(`bench:   ${step} (${seconds.toFixed(1)} s)\n`),
  });
  const results: InjectionResult[] = [];
  try {
    // Let a few rounds of scrapes, rule evaluations and analyzer ticks pass before measuring.
    await sleep(6000);
    const cpuAtStart = cluster.controller.cpuSeconds();
    const wallAtStart = performance.now();
    // Victims outside the job, each (node, GPU) used once; a node is returned to service (as
    // `steadfast resume` does) once its drain and its Prometheus alert are both in, so a small
    // cluster takes as many injections as a large one.
    const free = cluster.names.slice(0, nodes - jobNodes);
    const drainsExpected = new Map<string, number>();
    for (let index = 0; index < INJECTIONS * 2; index += 1) {
      const node = free[index % free.length] as string;
      const gpu = Math.floor(index / free.length) % 8;
      const path = index % 2 === 0 ? 'fast' : 'prometheus';
      const injectedAt = Date.now();
      const result = await cluster.inject(node, gpu, path);
      results.push(result);
      drainsExpected.set(node, (drainsExpected.get(node) ?? 0) + 1);
      process.stderr.write(`bench: ${nodes} nodes, ${path} path, ${node} GPU ${gpu}: ${result.latencyMs ?? 'no drain'} ms\n`);
      if (!(await cluster.recycle(node, gpu, injectedAt))) process.stderr.write(`bench: ${node}: no Prometheus alert for GPU ${gpu}\n`);
      // Spread injections over scrape phases instead of locking onto one.
      await sleep(200 + Math.random() * 800);
    }
    const controllerCpu = (cluster.controller.cpuSeconds() - cpuAtStart) / ((performance.now() - wallAtStart) / 1000);
    const scrape = (await cluster.query(`scrape_duration_seconds${agentSelector()}`)).sort((a, b) => a - b);
    const ruleGroups = await cluster.ruleGroupSeconds();
    const samples = await cluster.query(`sum(scrape_samples_scraped${agentSelector()})`);
    const oldest = await cluster.query(`max(${series('steadfast_queue_oldest_waiting_seconds', equals('queue', QUEUE_NAMES.signals))})`);
    const source = new PrometheusFeatureSource({ url: cluster.prometheus.url });
    const featureReadMs = await median(3, async () => void (await source.read(Date.now())));
    const health = await cluster.targetHealth();
    // One Slurm drain per injection: more would be a fault handled twice.
    const drains = cluster.plane.slurmDrainCounts();
    const doubles = [...drains].filter(([node, count]) => count !== (drainsExpected.get(node) ?? 0)).length;
    if (doubles > 0) process.stderr.write(`bench: ${doubles} nodes drained a different number of times than injected\n`);
    const sorted = (path: 'fast' | 'prometheus'): number[] =>
      results
        .filter((result) => result.path === path && result.latencyMs !== undefined)
        .map((result) => result.latencyMs as number)
        .sort((a, b) => a - b);
    return {
      nodes,
      fast: sorted('fast'),
      prometheus: sorted('prometheus'),
      failures: results.filter((result) => result.latencyMs === undefined).length + doubles,
      doubleDrains: doubles,
      controllerCpu,
      scrapeP50Ms: quantile(scrape, 0.5) * 1000,
      ruleGroupMaxMs: Math.max(...ruleGroups) * 1000,
      samplesPerScrape: samples[0] ?? 0,
      featureReadMs,
      oldestWaitingSignalS: oldest[0] ?? 0,
      targetsDown: health.down,
    };
  } finally {
    await cluster.stop();
  }
}

function cell(samples: readonly number[], q: number): string {
  return samples.length === 0 ? '—' : quantile(samples, q).toFixed(0);
}

async function main(): Promise<void> {
  const baseline = await measure(BASELINE);
  const large = await measure(LARGE);
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  const out = process.stdout;
  out.write(`\nSignal → action latency at scale (fatal Xid injected → drain done in Slurm), ${INJECTIONS} injections per path and cluster size\n`);
  out.write(`machine: ${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; 1 s scrape and evaluation interval\n\n`);
  out.write('| nodes | path | n | p50 ms | p95 ms | max ms |\n|---|---|---|---|---|---|\n');
  for (const run of [baseline, large]) {
    for (const [name, samples] of [
      ['fast path', run.fast],
      ['Prometheus path', run.prometheus],
    ] as const) {
      out.write(
        `| ${run.nodes} | ${name} | ${samples.length} | ${cell(samples, 0.5)} | ${cell(samples, 0.95)} | ${samples.length ? Math.max(...samples) : '—'} |\n`,
      );
    }
  }
  out.write(
    '\n| nodes | series per scrape round | scrape p50 ms | slowest rule group ms | multi-signal feature read ms | oldest waiting signal s | controller CPU (cores) | targets down |\n|---|---|---|---|---|---|---|---|\n',
  );
  for (const run of [baseline, large]) {
    out.write(
      `| ${run.nodes} | ${run.samplesPerScrape} | ${run.scrapeP50Ms.toFixed(1)} | ${run.ruleGroupMaxMs.toFixed(1)} | ${run.featureReadMs.toFixed(0)} | ${run.oldestWaitingSignalS.toFixed(1)} | ${run.controllerCpu.toFixed(2)} | ${run.targetsDown} |\n`,
    );
  }
  const ratio = (large: number[], small: number[]): string => (quantile(large, 0.5) / quantile(small, 0.5)).toFixed(2);
  out.write(
    `\np50 at ${LARGE} nodes / p50 at ${BASELINE} nodes: fast path ${ratio(large.fast, baseline.fast)}×, Prometheus path ${ratio(large.prometheus, baseline.prometheus)}×\n`,
  );
  if (baseline.failures + large.failures > 0) {
    out.write(`failures (no drain within 30 s, or a node drained twice): ${baseline.failures + large.failures}\n`);
    process.exitCode = 1;
  }
}

await main();
