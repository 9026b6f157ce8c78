import { cpus, totalmem } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { SimEnvironment } from '../sim/environment.js';
import { runFallenOffBus } from '../sim/scenario.js';
import { quantile } from './stats.js';

/**
 * Fault → drain latency on the real parts, for the agent fast path and for the Prometheus path
 * (scrape → rule → Alertmanager → webhook), each over INJECTIONS faults on distinct nodes.
 * The Prometheus path runs with 1 s scrape and evaluation intervals and group_wait 0s.
 */

const INJECTIONS = Number(process.env.STEADFAST_BENCH_INJECTIONS ?? 12);


interface PathFigures {
  readonly name: string;
  readonly samples: number[];
  readonly failures: number;
}

async function measure(name: string, fastPath: boolean): Promise<PathFigures> {
  process.stderr.write(`bench: starting ${INJECTIONS}-node environment for the ${name} …\n`);
  const env = await SimEnvironment.start({ nodes: INJECTIONS, fastPath, intervalSeconds: 1, maxDrainsPerWindow: INJECTIONS * 2 });
  const samples: number[] = [];
  let failures = 0;
  try {
    for (const [index, node] of env.nodes.entries()) {
      const result = await runFallenOffBus(env, { node: node.name, gpuIndex: index % 8, waitForAlert: false, timeoutMs: 30_000 });
      const done = result.timeline.find((step) => step.label === 'action done')?.afterMs;
      if (!result.ok || done === undefined) {
        failures += 1;
        process.stderr.write(`bench: ${node.name}: ${result.problems.join('; ')}\n`);
      } else {
        samples.push(done);
        process.stderr.write(`bench: ${name} ${node.name}: ${done} ms\n`);
      }
      // Spread injections over scrape phases instead of locking onto one.
      await sleep(150 + Math.random() * 700);
    }
  } finally {
    await env.stop();
  }
  return { name, samples: samples.sort((a, b) => a - b), failures };
}

function row(figures: PathFigures, target: number): string {
  const p50 = quantile(figures.samples, 0.5);
  const p95 = quantile(figures.samples, 0.95);
  const verdict = p50 <= target ? 'meets' : 'misses';
  return `| ${figures.name} | ${figures.samples.length} | ${p50.toFixed(0)} | ${p95.toFixed(0)} | ${Math.min(...figures.samples)}–${Math.max(...figures.samples)} | ${verdict} ≤ ${target} ms p50 | ${figures.failures} |`;
}

async function main(): Promise<void> {
  const fast = await measure('fast path (agent → controller)', true);
  const prometheus = await measure('Prometheus path (scrape → rule → Alertmanager → webhook)', false);
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  process.stdout.write(`\nFault → drain latency in ms (Xid 79 written to the kernel log → Slurm drain done), ${INJECTIONS} injections per path\n`);
  process.stdout.write(`machine: ${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}\n\n`);
  process.stdout.write('| path | n | p50 | p95 | range | target | failed |\n|---|---|---|---|---|---|---|\n');
  process.stdout.write(`${row(fast, 250)}\n${row(prometheus, 3000)}\n`);
  const ratio = quantile(prometheus.samples, 0.5) / quantile(fast.samples, 0.5);
  process.stdout.write(`\nPrometheus path p50 / fast path p50 = ${ratio.toFixed(1)}×; ByteRobust reports ~10 s to detect a lost GPU, ${(10_000 / quantile(fast.samples, 0.5)).toFixed(0)}× the fast-path p50.\n`);
  if (fast.failures + prometheus.failures > 0) process.exitCode = 1;
}

await main();
