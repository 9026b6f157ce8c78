import { spawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Registry } from 'prom-client';
import type { FastPathEvent } from '../../core/fast-path-event.js';
import { silentLogger } from '../../core/log.js';
import type { CollectorContext, CollectorPaths, CollectorSettings } from '../../exporters/collector.js';

/** Shared helpers for the exporter tests; not a test file itself. */

const here = dirname(fileURLToPath(import.meta.url));

/** The real captured samples live beside the repository (/work/shared next to /work/main; CI clones the same way). */
export const REALWORLD = resolve(here, '../fixtures/realworld');
export const XID_LOGS = resolve(REALWORLD, 'xid-kernel-logs');
export const NVIDIA_SMI_XML = resolve(REALWORLD, 'nvidia-smi-xml');
export const FIXTURES = resolve(here, '../fixtures');
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
  return text.replace(/^((?:steadfast_collector_duration_seconds|steadfast_gpu_last_poll_timestamp_seconds|steadfast_gpu_poll_age_seconds)(?:\{[^}]*\})?) \S+$/gm, '$1 0');
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
