import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { promisify } from 'node:util';
import { Registry } from 'prom-client';
import { silentLogger } from '../core/log.js';
import type { Collector, CollectorContext } from '../agent/collector.js';
import type { CollectorSettings } from '../agent/flags.js';
import type { CollectorPaths } from '../agent/paths.js';
import { gpuCollectorFactory } from '../agent/collectors/gpu/collector.js';
import { nvlinkCollectorFactory } from '../agent/collectors/nvlink.js';
import { GpuProcessBoard } from '../agent/gpu-processes.js';
import { DEFAULT_NVML_LIBRARY, GPU_SOURCE_FLAG, GpuSourceChoice, NVML_LIBRARY_FLAG } from '../agent/gpu-source.js';
import { NvmlLibrary } from '../agent/sources/nvml/library.js';
import { readNvmlNvlink, readNvmlPoll } from '../agent/sources/nvml/poll.js';
import { parseNvidiaSmiXml } from '../agent/sources/nvidia-smi-xml.js';
import { parseNvlinkErrors } from '../agent/sources/nvlink-errors.js';
import { XidLedger } from '../agent/xid-ledger.js';
import { StandInNvml } from '../tryit/nvml/stand-in.js';
import { ProcessGroup } from '../tryit/processes.js';
import { compareGpuValues, compareNvlink, type ValueRow } from './gpu-sources/compare.js';
import { idleCpu, measureScrapes, withAgent, type ScrapeFigures, type ServingOptions } from './gpu-sources/serving.js';
import { GPU_COUNT, NVLINKS, benchGpus, standInState, writeStandInNvidiaSmi } from './gpu-sources/node.js';
import { quantile } from './stats.js';

/**
 * What reading the GPUs costs the agent, through NVML in-process against running nvidia-smi,
 * measured in the same run on the same GPUs:
 *   per poll:   the gpu and nvlink collectors, made by their factories as the agent makes them
 *               and read through the same --gpu.source choice, each poll being the collector's
 *               own poll() (what its BackgroundPoll timer calls) called alone, so that each one
 *               is timed by itself; POLLS of each collector per source, in interleaved blocks,
 *               each block with its own collectors. Wall time per poll; CPU as user+sys of this
 *               process (process.cpuUsage(): every thread, so the agent's NVML thread and the GC
 *               too) plus that of its reaped child processes (nvidia-smi; cutime+cstime of
 *               /proc/self/stat, in 10 ms ticks, summed over the polls).
 *   serving:    the agent as a process of its own (bench/gpu-sources/serving.ts: the module
 *               tree, gpu and nvlink collectors only) serving 127.0.0.1 with its poll loops
 *               running every POLL_INTERVAL s; its CPU (utime+stime+cutime+cstime of
 *               /proc/PID/stat) for IDLE_SECONDS with no scrapes, less that of an agent with no
 *               collector at all, then over SCRAPES sequential scrapes.
 *   values:     one NVML read between two nvidia-smi reads, side by side (bench/gpu-sources/compare.ts).
 * By default on stand-ins, an 8-GPU H200 node (bench/gpu-sources/node.ts): nvidia-smi is a shell
 * script printing a file (a fork and an exec, none of the real binary's driver work), NVML is
 * tryit/nvml/stand-in.c answering scripted values. The stand-in's Xid event wait re-reads a file every
 * 5 ms, which the real library does not do, so its state offers no Xid events and the NVML
 * source's event loop does not run here. With `--real` the same bench runs on this machine's
 * libnvidia-ml.so.1 (`--nvml-library PATH` for another) and nvidia-smi (`--nvidia-smi PATH`),
 * event loop included, and prints every value of both sources side by side.
 */

const execFileAsync = promisify(execFile);
const argv = process.argv.slice(2);
const REAL = argv.includes('--real');
const POLLS = Number(process.env.STEADFAST_BENCH_GPU_POLLS ?? (REAL ? 30 : 60));
const BLOCKS = Math.max(1, Math.min(5, POLLS));
const SCRAPES = Number(process.env.STEADFAST_BENCH_GPU_SCRAPES ?? 300);
const SCRAPE_WARMUP = Math.min(20, SCRAPES);
const IDLE_SECONDS = Number(process.env.STEADFAST_BENCH_GPU_IDLE_SECONDS ?? 8);
const POLL_INTERVAL = Number(process.env.STEADFAST_BENCH_GPU_POLL_INTERVAL ?? 0.5);
const CLOCK_TICKS_PER_SECOND = 100;
/** Quoted from docs/evaluation.md, measured on a real H200 node; not this run's. */
const REAL_H200_NOTE =
  'on a real H200 (1 GPU, driver 580.159.04, 16 cores) one `nvidia-smi -q -x` took 115-121 ms wall and about 70 ms of CPU, more on 8-GPU nodes';

function option(name: string): string | undefined {
  const at = argv.indexOf(name);
  return at >= 0 ? argv[at + 1] : undefined;
}

interface Setup {
  readonly nvidiaSmi: string;
  readonly nvmlLibrary: string;
  /** GPUs and NVLink counters each poll must yield (the stand-in's); undefined on real GPUs: what the first read gave. */
  gpus: number | undefined;
  nvlinkCounters: number | undefined;
  readonly description: string[];
}

const SOURCES = [
  { label: 'nvidia-smi', setting: 'nvidia-smi' },
  { label: 'NVML', setting: 'nvml' },
] as const;
type Source = (typeof SOURCES)[number];

/** Milliseconds of CPU this process's reaped children used (cutime + cstime). */
function childCpuMs(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return ((Number(fields[13]) + Number(fields[14])) * 1000) / CLOCK_TICKS_PER_SECOND;
}

interface Rig {
  readonly gpu: Collector;
  readonly nvlink: Collector;
  readonly registry: Registry;
}

/** The gpu and nvlink collectors on one source, as the agent makes them (one shared source choice), after their first poll. */
async function openRig(source: Source, setup: Setup): Promise<Rig> {
  const registry = new Registry();
  const logger = silentLogger();
  const settings: CollectorSettings = { [GPU_SOURCE_FLAG]: source.setting, [NVML_LIBRARY_FLAG]: setup.nvmlLibrary };
  const paths: CollectorPaths = { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: setup.nvidiaSmi };
  const context: CollectorContext = {
    registry,
    paths,
    logger,
    node: 'bench-gpu-node',
    fastPath: () => undefined,
    // The timer never fires during the bench: each poll is called in turn.
    pollIntervalSeconds: 3600,
    settings,
    gpuProcesses: new GpuProcessBoard(),
    gpuSource: new GpuSourceChoice({ settings, paths, logger, registry }),
    xids: new XidLedger(registry),
  };
  const rig = { gpu: gpuCollectorFactory.create(context), nvlink: nvlinkCollectorFactory.create(context), registry };
  await rig.gpu.start({ waitForFirstRead: true });
  await rig.nvlink.start({ waitForFirstRead: true });
  return rig;
}

async function closeRig(rig: Rig): Promise<void> {
  await rig.gpu.close();
  await rig.nvlink.close();
}

/** The collector's own poll: the method its BackgroundPoll calls (private to the collector; reached here on purpose). */
function pollOf(collector: Collector): () => Promise<void> {
  const poll = (collector as unknown as { poll?: unknown }).poll;
  if (typeof poll !== 'function')
    throw new Error(`the ${collector.name} collector has no poll() any more: bench/gpu-sources.ts calls what its BackgroundPoll calls; update the bench`);
  return () => (poll as () => Promise<void>).call(collector);
}

/** Throws unless the last polls succeeded and gave every GPU and every NVLink counter. */
async function checkRig(rig: Rig, source: Source, setup: Setup): Promise<void> {
  await rig.gpu.update();
  await rig.nvlink.update();
  const attached = (await rig.registry.getSingleMetric('steadfast_gpu_attached')?.get())?.values[0]?.value;
  const counters = (await rig.registry.getSingleMetric('steadfast_gpu_nvlink_errors_total')?.get())?.values.length ?? 0;
  setup.gpus ??= attached;
  setup.nvlinkCounters ??= counters;
  if (attached !== setup.gpus || counters !== setup.nvlinkCounters) {
    throw new Error(`${source.label}: a poll gave ${attached} GPUs and ${counters} NVLink counters, expected ${setup.gpus} and ${setup.nvlinkCounters}`);
  }
}

interface PollFigures {
  readonly walls: number[];
  selfMs: number;
  /** The part of selfMs spent in the kernel (system time). */
  selfSysMs: number;
  childMs: number;
  polls: number;
}

const noFigures = (): PollFigures => ({ walls: [], selfMs: 0, selfSysMs: 0, childMs: 0, polls: 0 });

async function timePolls(poll: () => Promise<void>, count: number, into: PollFigures): Promise<void> {
  const children = childCpuMs();
  const self = process.cpuUsage();
  for (let i = 0; i < count; i++) {
    const started = performance.now();
    await poll();
    into.walls.push(performance.now() - started);
  }
  const used = process.cpuUsage(self);
  into.selfMs += (used.user + used.system) / 1000;
  into.selfSysMs += used.system / 1000;
  into.childMs += childCpuMs() - children;
  into.polls += count;
}

interface SourcePolls {
  readonly gpu: PollFigures;
  readonly nvlink: PollFigures;
}

/** POLLS polls of each collector per source, in BLOCKS blocks, the sources' order swapped from block to block. */
async function measurePolls(setup: Setup): Promise<Record<Source['label'], SourcePolls>> {
  const figures = { 'nvidia-smi': { gpu: noFigures(), nvlink: noFigures() }, NVML: { gpu: noFigures(), nvlink: noFigures() } };
  for (let block = 0; block < BLOCKS; block++) {
    const count = Math.floor(POLLS / BLOCKS) + (block < POLLS % BLOCKS ? 1 : 0);
    for (const source of block % 2 === 0 ? SOURCES : [...SOURCES].reverse()) {
      const rig = await openRig(source, setup);
      try {
        await checkRig(rig, source, setup);
        // One poll each before the clock starts: the first after start() still warms code paths.
        await pollOf(rig.gpu)();
        await pollOf(rig.nvlink)();
        await timePolls(pollOf(rig.gpu), count, figures[source.label].gpu);
        await timePolls(pollOf(rig.nvlink), count, figures[source.label].nvlink);
        await checkRig(rig, source, setup);
      } finally {
        await closeRig(rig);
      }
    }
  }
  return figures;
}

interface ValueComparison {
  readonly rows: ValueRow[];
  readonly nvlink: ReturnType<typeof compareNvlink>;
  /** NVML calls in one poll of each collector, once the process names are known (as from the second poll on). */
  readonly calls: { readonly gpu: number; readonly nvlink: number };
  /** As NVML names them: the driver, and each GPU's product name. */
  readonly driver: string | undefined;
  readonly products: string[];
}

/** One NVML read between two nvidia-smi reads; the NVLink counters of both; and how many NVML calls a poll makes. */
async function compareValues(setup: Setup): Promise<ValueComparison> {
  const smi = async (): Promise<string> => (await execFileAsync(setup.nvidiaSmi, ['-q', '-x'], { maxBuffer: 64 * 1024 * 1024, encoding: 'utf8' })).stdout;
  const nvml = await NvmlLibrary.load(setup.nvmlLibrary);
  let calls = 0;
  const call = nvml.call.bind(nvml);
  nvml.call = (...args: Parameters<NvmlLibrary['call']>) => {
    calls++;
    return call(...args);
  };
  const counted = <T>(work: () => T): [T, number] => {
    const from = calls;
    const result = work();
    return [result, calls - from];
  };
  try {
    nvml.init();
    const names = new Map<number, string | undefined>();
    const before = parseNvidiaSmiXml(await smi()).gpus;
    const read = readNvmlPoll(nvml, { nvlink: true, failed: () => undefined }, names);
    const after = parseNvidiaSmiXml(await smi()).gpus;
    const links = parseNvlinkErrors((await execFileAsync(setup.nvidiaSmi, ['nvlink', '-e'], { maxBuffer: 8 * 1024 * 1024, encoding: 'utf8' })).stdout);
    // What the gpu collector's poll asks (processes, no NVLink), and the nvlink collector's.
    const [, gpu] = counted(() => readNvmlPoll(nvml, { failed: () => undefined }, names));
    const [, nvlink] = counted(() => readNvmlNvlink(nvml, () => undefined));
    return {
      rows: compareGpuValues(before, read.gpus, after),
      nvlink: compareNvlink(links, read.nvlink),
      calls: { gpu, nvlink },
      driver: read.driverVersion,
      products: read.gpus.map((sample) => sample.productName ?? 'unnamed'),
    };
  } finally {
    nvml.close();
  }
}

async function standInSetup(root: string): Promise<Setup> {
  const gpus = benchGpus();
  const dir = join(root, 'node');
  mkdirSync(dir, { recursive: true });
  const standIn = await StandInNvml.create(join(dir, 'nvml'), standInState(gpus));
  const { script, xmlBytes } = writeStandInNvidiaSmi(dir, gpus);
  return {
    nvidiaSmi: script,
    nvmlLibrary: standIn.library,
    gpus: GPU_COUNT,
    nvlinkCounters: GPU_COUNT * NVLINKS * 3,
    description: [
      `GPUs: a stand-in HGX H200 node (bench/gpu-sources/node.ts): ${GPU_COUNT} GPUs under training load, one process each, ${NVLINKS} active NVLinks each (${GPU_COUNT * NVLINKS * 3} counters)`,
      `nvidia-smi: a shell script that cats a ${(xmlBytes / 1024).toFixed(0)} KB \`-q -x\` report (the real H200 capture's <gpu> element × ${GPU_COUNT}) or the \`nvlink -e\` text: a fork and an exec, none of the real binary's driver work`,
      "NVML: tryit/nvml/stand-in.c, scripted values from a state file, called through koffi on the agent's NVML thread as the real library is; no Xid events offered (the stand-in waits for them by re-reading a file every 5 ms)",
    ],
  };
}

async function realSetup(): Promise<Setup> {
  const nvidiaSmi = option('--nvidia-smi') ?? 'nvidia-smi';
  const nvmlLibrary = option('--nvml-library') ?? DEFAULT_NVML_LIBRARY;
  try {
    await execFileAsync(nvidiaSmi, ['-L'], { encoding: 'utf8' });
  } catch (error) {
    throw new Error(`--real: cannot run ${nvidiaSmi} -L (${error instanceof Error ? error.message : String(error)}); give --nvidia-smi PATH`, { cause: error });
  }
  const nvml = await NvmlLibrary.load(nvmlLibrary).catch((error: unknown) => {
    throw new Error(`--real: cannot load ${nvmlLibrary} (${error instanceof Error ? error.message : String(error)}); give --nvml-library PATH`);
  });
  nvml.close();
  return {
    nvidiaSmi,
    nvmlLibrary,
    gpus: undefined,
    nvlinkCounters: undefined,
    description: [`GPUs: this machine's, through ${nvmlLibrary} and ${nvidiaSmi}; NVML's Xid event loop runs as in the agent`],
  };
}

const fixed = (value: number, digits = 2): string => (Number.isFinite(value) ? value.toFixed(digits) : 'n/a');
const ratio = (a: number, b: number): string => (b > 0 && Number.isFinite(a) ? `${(a / b).toFixed(1)}×` : 'n/a');
const sorted = (values: readonly number[]): number[] => [...values].sort((a, b) => a - b);

function wall(figures: PollFigures): { median: number; p90: number } {
  const walls = sorted(figures.walls);
  return { median: quantile(walls, 0.5), p90: quantile(walls, 0.9) };
}

function printPolls(polls: Record<Source['label'], SourcePolls>, calls: ValueComparison['calls']): void {
  const smi = polls['nvidia-smi'];
  const nvml = polls.NVML;
  const perPoll = (figures: PollFigures, part: 'self' | 'sys' | 'child' | 'both'): number =>
    ({ self: figures.selfMs, sys: figures.selfSysMs, child: figures.childMs, both: figures.selfMs + figures.childMs })[part] / Math.max(1, figures.polls);
  // name, nvidia-smi, NVML, and what each shows in brackets (p90, system time).
  const rows: [string, number, number, number?, number?][] = [];
  for (const collector of ['gpu', 'nvlink'] as const) {
    const [a, b] = [wall(smi[collector]), wall(nvml[collector])];
    rows.push([`${collector}: wall ms, median (p90)`, a.median, b.median, a.p90, b.p90]);
    rows.push([
      `${collector}: CPU ms, agent process (of which system)`,
      perPoll(smi[collector], 'self'),
      perPoll(nvml[collector], 'self'),
      perPoll(smi[collector], 'sys'),
      perPoll(nvml[collector], 'sys'),
    ]);
    rows.push([`${collector}: CPU ms, child processes (nvidia-smi)`, perPoll(smi[collector], 'child'), perPoll(nvml[collector], 'child')]);
  }
  const both = (source: SourcePolls): number => perPoll(source.gpu, 'both') + perPoll(source.nvlink, 'both');
  rows.push(['both collectors: CPU ms per poll, all processes', both(smi), both(nvml)]);
  const walls = (source: SourcePolls): number => wall(source.gpu).median + wall(source.nvlink).median;
  rows.push(['both collectors: wall ms per poll, medians added', walls(smi), walls(nvml)]);
  process.stdout.write(`\nPer poll: ${smi.gpu.polls} polls of each collector per source, in ${BLOCKS} interleaved blocks, each poll alone\n\n`);
  process.stdout.write('| per poll | nvidia-smi | NVML | nvidia-smi / NVML |\n|---|---|---|---|\n');
  for (const [name, a, b, aAside, bAside] of rows) {
    const show = (value: number, aside?: number): string => (aside === undefined ? fixed(value) : `${fixed(value)} (${fixed(aside)})`);
    process.stdout.write(`| ${name} | ${show(a, aAside)} | ${show(b, bAside)} | ${ratio(a, b)} |\n`);
  }
  const microseconds = (figures: PollFigures, count: number): string => fixed((1000 * figures.selfMs) / Math.max(1, figures.polls) / Math.max(1, count), 1);
  process.stdout.write(
    `\nNVML calls per poll: gpu ${calls.gpu}, nvlink ${calls.nvlink} (synchronous koffi calls on the agent's NVML thread, one message each way per poll); the agent's CPU per call: ${microseconds(nvml.gpu, calls.gpu)} µs (gpu), ${microseconds(nvml.nvlink, calls.nvlink)} µs (nvlink)\n`,
  );
}

/**
 * The poll loops' CPU per second turned into CPU per poll of both collectors: each loop polls,
 * then waits POLL_INTERVAL, so about once every POLL_INTERVAL plus its poll's wall (the median
 * measured per poll above; the two loops run side by side).
 */
function perRound(msPerSecond: number, polls: SourcePolls): number {
  return msPerSecond * (POLL_INTERVAL + (wall(polls.gpu).median + wall(polls.nvlink).median) / 2 / 1000);
}

function printScrapes(scrapes: Record<Source['label'], ScrapeFigures>, floor: number, polls: Record<Source['label'], SourcePolls>): void {
  const smi = scrapes['nvidia-smi'];
  const nvml = scrapes.NVML;
  process.stdout.write(
    `\nServing /metrics: the agent in its own process (dist/cli/main.js; gpu and nvlink collectors only) on 127.0.0.1, polling every ${POLL_INTERVAL} s; ${IDLE_SECONDS} s without scrapes, then ${SCRAPES} sequential scrapes (after ${SCRAPE_WARMUP} not counted)\n\n`,
  );
  process.stdout.write('| serving | nvidia-smi | NVML | nvidia-smi / NVML |\n|---|---|---|---|\n');
  const rows: [string, number, number][] = [
    ['agent CPU ms per second, no scrapes', smi.idleMsPerSecond, nvml.idleMsPerSecond],
    [`the same, less an agent's with no collectors (${fixed(floor)}): the poll loops`, smi.idleMsPerSecond - floor, nvml.idleMsPerSecond - floor],
    [
      '≈ CPU ms per poll of both collectors, as the serving agent polls',
      perRound(smi.idleMsPerSecond - floor, polls['nvidia-smi']),
      perRound(nvml.idleMsPerSecond - floor, polls.NVML),
    ],
    ["CPU ms per scrape, all of the agent's (poll loops running)", smi.rawMsPerScrape, nvml.rawMsPerScrape],
    ["CPU ms per scrape, less the poll loops' rate", smi.netMsPerScrape, nvml.netMsPerScrape],
    ['scrape wall ms, median', smi.latencyMs, nvml.latencyMs],
  ];
  for (const [name, a, b] of rows) process.stdout.write(`| ${name} | ${fixed(a)} | ${fixed(b)} | ${ratio(a, b)} |\n`);
  process.stdout.write(`| series / bytes of a scrape | ${smi.series} / ${smi.bytes} | ${nvml.series} / ${nvml.bytes} | |\n`);
}

function printValues(result: ValueComparison): void {
  const { rows, nvlink } = result;
  const gpus = new Set(rows.map((row) => row.gpu)).size;
  const count = (verdict: ValueRow['verdict']) => rows.filter((row) => row.verdict === verdict).length;
  process.stdout.write(
    `\nValues: one NVML read between two nvidia-smi reads, ${gpus} GPUs × ${rows.length / Math.max(1, gpus)} values: ${count('=')} equal, ${count('~')} moved between the reads, ${count('≠')} differing; NVLink counters: nvidia-smi ${nvlink.nvidiaSmi}, NVML ${nvlink.nvml}, ${nvlink.differing.length} differing\n`,
  );
  const shown = REAL ? rows : rows.filter((row) => row.verdict !== '=');
  if (shown.length > 0) {
    process.stdout.write('\n| GPU | value | nvidia-smi before | NVML | nvidia-smi after | |\n|---|---|---|---|---|---|\n');
    for (const row of shown) process.stdout.write(`| ${row.gpu} | ${row.name} | ${row.before} | ${row.nvml} | ${row.after} | ${row.verdict} |\n`);
  }
  for (const line of nvlink.differing.slice(0, 20)) process.stdout.write(`  NVLink ${line}\n`);
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-gpu-sources-'));
  const group = new ProcessGroup();
  try {
    const loadBefore = loadavg()[0] ?? 0;
    const setup = REAL ? await realSetup() : await standInSetup(root);
    const values = await compareValues(setup);
    const polls = await measurePolls(setup);
    const serving: ServingOptions = {
      root,
      group,
      nvidiaSmi: setup.nvidiaSmi,
      nvmlLibrary: setup.nvmlLibrary,
      pollIntervalSeconds: POLL_INTERVAL,
      idleSeconds: IDLE_SECONDS,
      scrapes: SCRAPES,
      warmup: SCRAPE_WARMUP,
    };
    const floor = await withAgent(undefined, serving, (agent) => idleCpu(agent, IDLE_SECONDS));
    const scrapes = { 'nvidia-smi': await measureScrapes('nvidia-smi', serving), NVML: await measureScrapes('nvml', serving) };

    process.stdout.write(`\nGPU sources: nvidia-smi against NVML in the same run (${REAL ? 'real GPUs' : 'stand-ins'})\n`);
    process.stdout.write(
      `machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}; load average ${fixed(loadBefore)} before the run, ${fixed(loadavg()[0] ?? 0)} after\n`,
    );
    for (const line of setup.description) process.stdout.write(`${line}\n`);
    const products = [...new Set(values.products)].map((name) => `${values.products.filter((product) => product === name).length} × ${name}`).join(', ');
    process.stdout.write(`GPUs read: ${setup.gpus} (${products}, driver ${values.driver ?? 'unknown'}), NVLink counters: ${setup.nvlinkCounters}\n`);
    process.stdout.write('CPU: user+sys of the process (every thread) and of its reaped child processes (cutime+cstime)\n');
    printPolls(polls, values.calls);
    printScrapes(scrapes, floor, polls);
    printValues(values);
    process.stdout.write(`\nFor context only, not this run's: ${REAL_H200_NOTE}.\n`);
    if (!REAL)
      process.stdout.write(
        "Stand-ins: the ratios measure the agent's own side of each source (spawning and parsing against FFI calls), not the driver's work; run with --real on a GPU node for that.\n",
      );
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
