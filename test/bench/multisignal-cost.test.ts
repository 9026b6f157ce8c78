import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';

/**
 * bench/multisignal-cost.ts runs to completion on a tiny size (one job of 8 nodes, 1.5 h of
 * history, 2 evaluations): it backfills, starts Prometheus, reads every node back through the
 * online watch and the CLI's window, and prints its tables with no failed query. No figure is
 * checked: timing is the bench's to print.
 */

const BENCH = join(repoRoot(), 'dist', 'bench', 'multisignal-cost.js');

describe('bench/multisignal-cost.ts', () => {
  it('measures one 8-node job through the real Prometheus and prints its tables', async () => {
    expect(existsSync(BENCH), `${BENCH} is built by npm run build`).toBe(true);
    const env = {
      ...process.env,
      STEADFAST_BENCH_COST_NODES: '8',
      STEADFAST_BENCH_COST_HOURS: '1.5',
      STEADFAST_BENCH_COST_EVALUATIONS: '2',
      STEADFAST_BENCH_COST_WARMUP: '1',
      STEADFAST_BENCH_COST_SETTLE_SECONDS: '0',
    };
    const { stdout } = await promisify(execFile)(process.execPath, [BENCH], { env, encoding: 'utf8', timeout: 100_000 });
    expect(stdout).toContain('| nodes | GPUs | samples backfilled | backfill s | blocks | watch start wall s | online eval wall ms p50 |');
    // 8 nodes, 64 GPUs; the last columns are the failed queries and the load average.
    expect(stdout).toMatch(/^\| 8 \| 64 \| [\d.]+ M \|.*\| 0 \| [\d.]+ \|$/m);
    expect(stdout).toMatch(/^\| 8 \| \d+ \| [\d.]+ % \| \d+ \| [\d.]+ % \|$/m);
    // The feature queries answer with series: the generated history holds what they read.
    for (const feature of [
      'gpu_temperature_celsius',
      'gpu_hw_slowdown_share',
      'gpu_row_remap_pending',
      'xid_errors_1h',
      'gpu_pcie_replay_slots_1h',
      'rdma_transport_retries_per_second',
      'nfs_getattr_rtt_seconds',
      'training_iteration_seconds',
    ]) {
      expect(stdout).toMatch(new RegExp(`^\\| ${feature} \\| [\\d.]+ / [\\d.]+ \\| [1-9]\\d* \\| [1-9]\\d* \\|`, 'm'));
    }
    expect(stdout).toContain("nodes in the matrix at the window's end: 8 of 8");
  }, 120_000);
});
