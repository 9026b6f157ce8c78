import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';

/**
 * bench/gpu-sources.ts runs to completion on a tiny count (2 polls, 3 scrapes, a 0.2 s idle
 * window): both sources read the stand-in node's 8 GPUs and 432 NVLink counters, and the two
 * sources' values of the same GPUs agree (the bench writes the stand-in NVML's state and the
 * nvidia-smi report from one model). No figure is checked: timing is the bench's to print.
 */

const BENCH = join(repoRoot(), 'dist', 'bench', 'gpu-sources.js');

describe('bench/gpu-sources.ts', () => {
  it('measures both sources on the stand-in node and finds their values equal', async () => {
    expect(existsSync(BENCH), `${BENCH} is built by npm run build`).toBe(true);
    const env = {
      ...process.env,
      STEADFAST_BENCH_GPU_POLLS: '2',
      STEADFAST_BENCH_GPU_SCRAPES: '3',
      STEADFAST_BENCH_GPU_IDLE_SECONDS: '0.2',
      STEADFAST_BENCH_GPU_POLL_INTERVAL: '0.2',
    };
    const { stdout } = await promisify(execFile)(process.execPath, [BENCH], { env, encoding: 'utf8', timeout: 100_000 });
    expect(stdout).toContain('GPUs read: 8 (8 × NVIDIA H200, driver 580.159.04), NVLink counters: 432');
    expect(stdout).toContain('| per poll | nvidia-smi | NVML | nvidia-smi / NVML |');
    expect(stdout).toContain('| serving | nvidia-smi | NVML | nvidia-smi / NVML |');
    expect(stdout).toMatch(/8 GPUs × \d+ values: \d+ equal, 0 moved between the reads, 0 differing; NVLink counters: nvidia-smi 432, NVML 432, 0 differing/);
  }, 120_000);
});
