import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { setTimeout as sleep } from 'node:timers/promises';
import { repoRoot } from '../../core/paths.js';
import { COLLECTOR_FACTORIES } from '../../agent/index.js';
import { GPU_SOURCE_FLAG, NVML_LIBRARY_FLAG } from '../../agent/gpu-source.js';
import { type ProcessGroup, freePort, waitFor } from '../../tryit/processes.js';
import { quantile } from '../stats.js';

/**
 * bench/gpu-sources.ts's serving half: the agent as a process of its own (dist/cli/main.js, the
 * module tree, so that a tree built by tsc alone runs it), with the gpu and nvlink collectors on
 * one source and no other collector, serving 127.0.0.1 with its poll loops running; its CPU from
 * /proc/PID/stat (utime+stime+cutime+cstime: nvidia-smi's runs are its reaped children).
 */

const CLOCK_TICKS_PER_SECOND = 100;
const MODULE_TREE = join(repoRoot(), 'dist', 'cli', 'main.js');

export interface ServingOptions {
  /** A scratch directory for the agent's log and empty kernel log. */
  readonly root: string;
  readonly group: ProcessGroup;
  readonly nvidiaSmi: string;
  readonly nvmlLibrary: string;
  readonly pollIntervalSeconds: number;
  /** How long an agent is left alone to measure its CPU without scrapes. */
  readonly idleSeconds: number;
  readonly scrapes: number;
  /** Scrapes before the counted ones. */
  readonly warmup: number;
}

export type ServedSource = 'nvidia-smi' | 'nvml';

/** Milliseconds of CPU a process and its reaped children used (utime + stime + cutime + cstime). */
function processCpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14])) * 1000) / CLOCK_TICKS_PER_SECOND;
}

export interface ScrapeFigures {
  readonly idleMsPerSecond: number;
  readonly rawMsPerScrape: number;
  readonly netMsPerScrape: number;
  readonly latencyMs: number;
  readonly bytes: number;
  readonly series: number;
}

export interface RunningAgent {
  readonly name: string;
  readonly pid: number;
  readonly log: string;
  scrape(): Promise<string>;
}

/**
 * Runs `work` on the agent in a process of its own, with the gpu and nvlink collectors on
 * `source` and no other collector (without a source, no collector at all: the floor an idle agent
 * costs), once it serves and, with a source, has read the GPUs and both poll loops have gone
 * round twice; stops the agent after.
 */
export async function withAgent<T>(source: ServedSource | undefined, options: ServingOptions, work: (agent: RunningAgent) => Promise<T>): Promise<T> {
  const { root, group } = options;
  const port = await freePort();
  const disabled = COLLECTOR_FACTORIES.map((factory) => factory.name).filter((name) => source === undefined || (name !== 'gpu' && name !== 'nvlink'));
  const kmsg = join(root, 'kern.log');
  writeFileSync(kmsg, '');
  const args = [
    MODULE_TREE,
    'agent',
    '--web.listen-address',
    `127.0.0.1:${port}`,
    '--node',
    'bench-gpu-node',
    '--web.insecure',
    '--path.sysfs',
    join(root, 'sys'),
    '--path.procfs',
    join(root, 'proc'),
    '--path.kmsg',
    kmsg,
    '--gpu.poll-interval',
    String(options.pollIntervalSeconds),
    `--${GPU_SOURCE_FLAG}`,
    source ?? 'auto',
    `--${NVML_LIBRARY_FLAG}`,
    options.nvmlLibrary,
    '--nvidia-smi.path',
    options.nvidiaSmi,
    ...disabled.map((name) => `--no-collector.${name}`),
  ];
  const name = `agent-${source ?? 'no-collectors'}`;
  const log = join(root, `${name}.log`);
  const child = group.start(name, process.execPath, args, log, {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LANG: process.env.LANG ?? 'C.UTF-8', STEADFAST_LOG_LEVEL: 'warn' },
  });
  const url = `http://127.0.0.1:${port}/metrics`;
  const scrape = async (): Promise<string> => {
    const response = await fetch(url);
    const text = await response.text();
    if (!response.ok) throw new Error(`${name} answered ${response.status}`);
    return text;
  };
  try {
    // Serving starts before the first poll ends: wait until the GPUs are read, then for both loops to have gone round.
    const ready = async (): Promise<boolean> => {
      const text = await scrape();
      return source === undefined || Number(/^steadfast_gpu_attached (\S+)$/m.exec(text)?.[1] ?? 0) > 0;
    };
    await waitFor(`${name} to serve${source ? ' the GPUs' : ''}`, ready, 30_000, 100, async () => readFileSync(log, 'utf8').slice(-2000));
    await sleep(2 * options.pollIntervalSeconds * 1000);
    return await work({ name, pid: child.pid ?? 0, log, scrape });
  } finally {
    await group.stop(name);
  }
}

/** CPU ms per second of an agent left alone for `seconds`. */
export async function idleCpu(agent: RunningAgent, seconds: number): Promise<number> {
  const cpu = processCpuMs(agent.pid);
  const started = performance.now();
  await sleep(seconds * 1000);
  return (processCpuMs(agent.pid) - cpu) / ((performance.now() - started) / 1000);
}

/** The agent's CPU with no scrapes, then per scrape. */
export async function measureScrapes(source: ServedSource, options: ServingOptions): Promise<ScrapeFigures> {
  const { scrapes } = options;
  return withAgent(source, options, async (agent) => {
    const idleMsPerSecond = await idleCpu(agent, options.idleSeconds);
    for (let i = 0; i < options.warmup; i++) await agent.scrape();
    const latencies: number[] = [];
    let text = '';
    const cpuStart = processCpuMs(agent.pid);
    const started = performance.now();
    for (let i = 0; i < scrapes; i++) {
      const at = performance.now();
      text = await agent.scrape();
      latencies.push(performance.now() - at);
    }
    const seconds = (performance.now() - started) / 1000;
    const cpu = processCpuMs(agent.pid) - cpuStart;
    if (!/steadfast_collector_success\{collector="gpu"\} 1/.test(text)) throw new Error(`${agent.name}: the gpu collector failed; see ${agent.log}`);
    return {
      idleMsPerSecond,
      rawMsPerScrape: cpu / scrapes,
      netMsPerScrape: (cpu - idleMsPerSecond * seconds) / scrapes,
      latencyMs: quantile(
        [...latencies].sort((a, b) => a - b),
        0.5,
      ),
      bytes: Buffer.byteLength(text),
      series: text.split('\n').filter((line) => line !== '' && !line.startsWith('#')).length,
    };
  });
}
