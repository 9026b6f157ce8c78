import { spawn } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import { afterEach, beforeEach, expect } from 'vitest';
import type { FastPathEvent } from '../../core/fast-path-event.js';
import { silentLogger } from '../../core/log.js';
import { CollectorSet, type Collector, type CollectorContext } from '../../agent/collector.js';
import type { CollectorSettings } from '../../agent/flags.js';
import type { CollectorPaths } from '../../agent/paths.js';
import { infinibandClassDir } from '../../agent/sources/infiniband.js';

/** Shared helpers for the exporter tests; not a test file itself. */

const here = dirname(fileURLToPath(import.meta.url));

/** The real captured samples, each folder with a README naming its source. */
export const REALWORLD = resolve(here, '../fixtures/realworld');
export const XID_LOGS = resolve(REALWORLD, 'xid-kernel-logs');
/** Host kernel log samples (lockups, hung tasks, OOM, MCE, AER, SXid). */
export const HOST_LOGS = resolve(REALWORLD, 'host-kernel-logs');
export const NVIDIA_SMI_XML = resolve(REALWORLD, 'nvidia-smi-xml');
export const FIXTURES = resolve(here, '../fixtures');
/** Captured dcgm-exporter scrapes (`*.prom`), read by the source's and the gpu collector's tests. */
export const DCGM_SAMPLES = resolve(REALWORLD, 'dcgm-exporter');
export const DCGM_SCRAPES = readdirSync(DCGM_SAMPLES).filter((name) => name.endsWith('.prom'));
export const EXPECTED = resolve(FIXTURES, 'expected');

export interface TestContext extends CollectorContext {
  readonly events: FastPathEvent[];
}

export function testContext(paths: Partial<CollectorPaths> = {}, pollIntervalSeconds = 5, settings: CollectorSettings = {}): TestContext {
  const events: FastPathEvent[] = [];
  return {
    registry: new Registry(),
    paths: { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: '/nonexistent/nvidia-smi', ...paths },
    logger: silentLogger(),
    node: 'node-1',
    fastPath: (event) => events.push(event),
    pollIntervalSeconds,
    settings,
    events,
  };
}

/**
 * Removes what changes from run to run (how long a collector took, when nvidia-smi was last
 * read, how long ago that was) so that the rest of the exposition can be compared byte for byte.
 */
export function normaliseExposition(text: string): string {
  return text.replace(
    /^((?:steadfast_collector_duration_seconds|steadfast_gpu_last_poll_timestamp_seconds|steadfast_gpu_poll_age_seconds)(?:\{[^}]*\})?) \S+$/gm,
    '$1 0',
  );
}

/** Captured training logs: Megatron runs (healthy or cancelled), and PyTorch / NCCL failures. */
export const MEGATRON_LOGS = resolve(REALWORLD, 'megatron-logs');
export const MEGATRON_LOG_FILES = readdirSync(MEGATRON_LOGS).filter((name) => name.endsWith('.out') || name.endsWith('.txt'));
export const NCCL_TORCH_ERRORS = resolve(REALWORLD, 'nccl-torch-errors');

/** Captured /proc/self/mountstats files, read by the parser's and the nfs collector's tests. */
export const MOUNTSTATS_SAMPLES = resolve(REALWORLD, 'procfs-nfs-infiniband', 'mountstats');
export const MOUNTSTATS_FILES = readdirSync(MOUNTSTATS_SAMPLES).sort();

export function mountstatsSample(name: string): string {
  return readFileSync(join(MOUNTSTATS_SAMPLES, name), 'utf8');
}

/** Captured /sys/class/infiniband trees: each sample is a directory of `<device>/...` trees. */
export const INFINIBAND_SAMPLES_ROOT = resolve(REALWORLD, 'procfs-nfs-infiniband', 'sys-class-infiniband');
export const INFINIBAND_SAMPLES = {
  procfs_fixtures: ['hfi1_0', 'mlx4_0', 'mlx5_0'],
  gpud_h100_cluster: ['mlx5_0', 'mlx5_1', 'mlx5_bond_0'],
  node_exporter_fixtures: ['mlx4_0'],
} as const;
export type InfinibandSample = keyof typeof INFINIBAND_SAMPLES;
export const INFINIBAND_SAMPLE_NAMES = Object.keys(INFINIBAND_SAMPLES) as InfinibandSample[];

/** A sysfs root under `dir` holding a writable copy of the sample, for tests that change files. */
export function copiedInfinibandSysfs(dir: string, sample: InfinibandSample): { sysfs: string; classDir: string } {
  const sysfs = join(dir, 'sys');
  const classDir = infinibandClassDir(sysfs);
  cpSync(join(INFINIBAND_SAMPLES_ROOT, sample), classDir, { recursive: true });
  return { sysfs, classDir };
}

/** The lines of one captured sample file. */
export function sampleLines(dir: string, name: string): string[] {
  return readFileSync(join(dir, name), 'utf8').split('\n');
}

export function dcgmScrape(name: string): string {
  return readFileSync(join(DCGM_SAMPLES, name), 'utf8');
}

/** A fresh temporary directory for each test of the file, removed after it; call the result for the current one. */
export function tempDirPerTest(prefix: string): () => string {
  let dir = '';
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), prefix));
  });
  afterEach(() => {
    rmSync(dir, { recursive: true, force: true });
  });
  return () => dir;
}

/** Compares with the expected file, or rewrites it when UPDATE_EXPECTED=1. Returns the expected text. */
export function expectedText(file: string, actual: string): string {
  if (process.env.UPDATE_EXPECTED === '1') {
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, actual);
  }
  if (!existsSync(file)) throw new Error(`expected file ${file} is missing; run the test with UPDATE_EXPECTED=1 to write it`);
  return readFileSync(file, 'utf8');
}

/** One scrape of a lone collector, normalised for comparison; the caller closes the collector. */
export async function scrapeOne(context: CollectorContext, collector: Collector): Promise<string> {
  const set = new CollectorSet([collector], context.registry, context.logger);
  await set.start();
  return normaliseExposition(await set.scrape());
}

/**
 * The exposition equals its expected file under test/fixtures/expected/ (rewritten with
 * UPDATE_EXPECTED=1), and `promtool check metrics` accepts it.
 */
export async function expectMatchesAndLints(file: string, actual: string): Promise<void> {
  const expected = expectedText(file, actual);
  expect(actual).toBe(expected);
  const lint = await promtoolCheckMetrics(expected);
  expect(lint.output).toBe('');
  expect(lint.code).toBe(0);
}

/** Runs `promtool check metrics` on the text; resolves with its exit status and output. */
export function promtoolCheckMetrics(text: string): Promise<{ code: number | null; output: string }> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn('/usr/bin/promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code, output }));
    child.stdin.end(text);
  });
}

/** Polls `condition` until it holds or `timeoutMs` passes. */
export async function waitFor(condition: () => boolean | Promise<boolean>, timeoutMs = 5000, stepMs = 20): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`condition not met within ${timeoutMs} ms`);
    await new Promise((resolveStep) => setTimeout(resolveStep, stepMs));
  }
}

/** The value of one series in an exposition text, or undefined when it is absent. */
export function seriesValue(text: string, series: string): number | undefined {
  const line = text.split('\n').find((candidate) => candidate.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}
