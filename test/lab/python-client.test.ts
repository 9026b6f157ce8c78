import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';
import type { Controller } from '../../controller/service.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../tryit/processes.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';

const AGENT_WEB_TOKEN = 'pyclient-agent-web-token-0123456789';
import { testRedis } from '../support/redis.js';

/**
 * The Python client (clients/python) under Python's own unittest, with Debian's /usr/bin/python3:
 * against a stand-in server, and against a real agent (`steadfast agent`, from the sources) and a
 * real controller on the test Redis, whose addresses the Python tests get from the environment.
 */

const run = promisify(execFile);
const PYTHON = '/usr/bin/python3';

describe('the Python training client', () => {
  const store = testRedis();
  const group = new ProcessGroup();
  let root: string;
  let controller: Controller;
  let controllerUrl: string;
  let agentUrl: string;

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'steadfast-pyclient-'));
    ({ controller, url: controllerUrl } = await startController(testConfig(store.url, store.prefix), { workers: false }));
    const registered = await post(`${controllerUrl}/api/v1/jobs`, {
      name: 'pyclient',
      nodes: ['node-1', 'node-2'],
      ranksPerNode: 1,
      topology: { dp: 2 },
      launcher: 'accept',
      codeVersion: 'v1',
      microbatches: { perIteration: 8 },
    });
    expect(registered.body.error).toBeUndefined();
    expect(registered.status).toBe(201);
    const hotSwap = await post(`${controllerUrl}/api/v1/jobs`, {
      name: 'pyhotswap',
      nodes: ['swap-1', 'swap-2'],
      ranksPerNode: 1,
      topology: { dp: 2 },
      launcher: 'accept',
      codeVersion: 'v1',
      hotSwap: { spares: ['swap-3'] },
    });
    expect(hotSwap.body.error).toBeUndefined();
    expect(hotSwap.status).toBe(201);
    const port = await freePort();
    agentUrl = `http://127.0.0.1:${port}`;
    // Only the training collector: the push endpoint and its series.
    const off = ['gpu', 'xid', 'rdma', 'nfs', 'process'].map((name) => `--no-collector.${name}`);
    // The agent's POST endpoints are closed by default: the ranks present its web token.
    const webTokenFile = join(root, 'agent-web-token');
    writeFileSync(webTokenFile, `${AGENT_WEB_TOKEN}\n`, { mode: 0o600 });
    group.start(
      'agent',
      process.execPath,
      [
        '--import',
        'tsx',
        join(repoRoot(), 'cli', 'main.ts'),
        'agent',
        '--node',
        'pyclient-node',
        `--web.listen-address=127.0.0.1:${port}`,
        '--web.token-file',
        webTokenFile,
        ...off,
      ],
      join(root, 'agent.log'),
      {
        cwd: repoRoot(),
      },
    );
    await waitFor('the agent to answer /healthz', () => httpOk(`${agentUrl}/healthz`), 30_000, 200);
  }, 60_000);

  afterAll(async () => {
    await group.stopAll();
    await controller?.close();
    await store.cleanup();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  it('passes its unittest suite against the stand-in, the real agent and the real controller', async () => {
    const { stdout, stderr } = await run(
      PYTHON,
      ['-m', 'unittest', 'discover', '-s', join(repoRoot(), 'clients', 'python', 'tests'), '-p', 'test_steadfast_client.py', '-v'],
      {
        env: {
          ...process.env,
          STEADFAST_TEST_AGENT_URL: agentUrl,
          STEADFAST_TEST_AGENT_TOKEN: AGENT_WEB_TOKEN,
          STEADFAST_TEST_CONTROLLER_URL: controllerUrl,
          STEADFAST_TEST_CONTROLLER_TOKEN: TEST_TOKEN,
          PYTHONDONTWRITEBYTECODE: '1',
        },
        timeout: 60_000,
      },
    ).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`python unittest failed:\n${error.stderr ?? ''}${error.stdout ?? ''}${error.message}`);
    });
    const report = `${stdout}${stderr}`;
    expect(report).toMatch(/\nOK\n/);
    // The real-server classes skip themselves without the addresses; here they must have run.
    expect(report).not.toMatch(/skipped/);
    expect(report).toMatch(/test_pushed_steps_become_the_agents_training_series .* ok/);
    expect(report).toMatch(/test_checkpoint_reports_make_the_restore_plan .* ok/);
  }, 90_000);

  it('passes the hot swap suite: buffers, replicas, placement, and ranks killed mid-training under real gloo', async () => {
    // Real processes (three ranks, a TCPStore server, a stand-in world endpoint) on loopback.
    const { stdout, stderr } = await run(
      PYTHON,
      ['-m', 'unittest', 'discover', '-s', join(repoRoot(), 'clients', 'python', 'tests'), '-p', 'test_steadfast_hotswap.py', '-v'],
      {
        env: { ...process.env, STEADFAST_TEST_CONTROLLER_URL: controllerUrl, STEADFAST_TEST_CONTROLLER_TOKEN: TEST_TOKEN, PYTHONDONTWRITEBYTECODE: '1' },
        timeout: 150_000,
      },
    ).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`python unittest failed:\n${error.stderr ?? ''}${error.stdout ?? ''}${error.message}`);
    });
    const report = `${stdout}${stderr}`;
    expect(report).toMatch(/\nOK\n/);
    expect(report).not.toMatch(/skipped/);
    expect(report).toMatch(/test_the_spare_takes_the_killed_ranks_shard_and_the_losses_equal_an_unfaulted_run .* ok/);
    expect(report).toMatch(/test_when_the_spare_dies_mid_swap_the_survivor_reports_failed_within_the_bound .* ok/);
    expect(report).toMatch(/test_when_the_replica_holder_dies_mid_swap_the_spare_reports_failed_within_the_bound .* ok/);
    expect(report).toMatch(/test_a_failure_mid_copy_leaves_the_committed_buffer_whole_and_committed .* ok/);
    expect(report).toMatch(/test_the_real_controllers_world_places_each_replica_on_another_node_and_takes_reports .* ok/);
  }, 180_000);
});
