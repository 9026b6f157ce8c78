import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';

/**
 * The preflight (clients/python/steadfast_preflight.py) under Python's own unittest, with Debian's
 * /usr/bin/python3 and its torch: the bisection over a stand-in link test, and whole runs of four
 * node processes under real gloo on 127.0.0.1 with one node's link slow or broken, reporting to a
 * stand-in controller. Among the lab's files because it starts a dozen PyTorch processes.
 */

const run = promisify(execFile);

describe('the preflight across nodes, in Python', () => {
  it('names a slow or broken node by pairwise bisection, reports it once and exits with its codes', async () => {
    const { stdout, stderr } = await run(
      '/usr/bin/python3',
      ['-m', 'unittest', 'discover', '-s', join(repoRoot(), 'clients', 'python', 'tests'), '-p', 'test_steadfast_preflight.py', '-v'],
      { env: { ...process.env, PYTHONDONTWRITEBYTECODE: '1' }, timeout: 240_000 },
    ).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`python unittest failed:\n${error.stderr ?? ''}${error.stdout ?? ''}${error.message}`);
    });
    const report = `${stdout}${stderr}`;
    expect(report).toMatch(/\nOK\n/);
    expect(report).not.toMatch(/skipped/);
    expect(report).toMatch(/test_a_single_bad_node_is_named_in_two_rounds.* ok/);
    expect(report).toMatch(/test_two_bad_nodes_are_both_named_within_log2_n_plus_2_rounds_and_no_good_node_is .* ok/);
    expect(report).toMatch(/test_a_slow_node_is_named_by_every_process_and_reported_once_with_a_healthy_nodes_credential .* ok/);
    expect(report).toMatch(/test_a_broken_node_costs_each_pair_its_timeout_and_is_named_without_hanging_the_run .* ok/);
  }, 300_000);
});
