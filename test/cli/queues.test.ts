import { Queue, Worker } from 'bullmq';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { queuesCommand, type QueueSummary } from '../../cli/queues.js';
import { workerConnection } from '../../core/redis.js';
import { testRedis } from '../support/redis.js';
import { runCli, type CliRun } from '../support/cli.js';

/** Runs `steadfast queues ARGS` in-process. */
function runQueues(args: string[], env: Record<string, string>): Promise<CliRun> {
  return runCli(queuesCommand(), args, env);
}

describe('steadfast queues', () => {
  const env = testRedis();
  const signals = new Queue('signals', { connection: env.redis, prefix: env.prefix });
  const actions = new Queue('steps', { connection: env.redis, prefix: env.prefix });
  const cliEnv = { STEADFAST_REDIS__URL: env.url, STEADFAST_REDIS__PREFIX: env.prefix };

  beforeAll(async () => {
    await signals.add('signal', { node: 'gpu-1' });
    await signals.add('signal', { node: 'gpu-2' }, { delay: 60_000 });
    // Seven failures, so only the newest five are listed.
    for (let index = 0; index < 7; index += 1) await actions.add('drain', { node: `gpu-${index}` }, { jobId: `drain-${index}`, timestamp: 1_000_000 + index });
    const connection = workerConnection(env.url);
    const worker = new Worker<{ node: string }>(
      'steps',
      async (job) => {
        throw new Error(`scontrol refused ${job.data.node}\nstack line`);
      },
      { connection, prefix: env.prefix, autorun: false },
    );
    const failed = new Promise<void>((resolve) => {
      let count = 0;
      worker.on('failed', () => {
        count += 1;
        if (count === 7) resolve();
      });
    });
    void worker.run();
    await failed;
    await worker.close();
    connection.disconnect();
  });

  afterAll(async () => {
    await Promise.all([signals.close(), actions.close()]);
    await env.cleanup();
  });

  afterEach(() => {
    vi.restoreAllMocks();
  });

  it('--json prints counts by state and the five newest failed jobs per queue', async () => {
    const { stdout, stderr, exitCode } = await runQueues(['--redis', '--json'], cliEnv);
    expect(stderr).toBe('');
    expect(exitCode).toBe(0);
    expect(stdout.endsWith('\n')).toBe(true);
    const body = JSON.parse(stdout) as { queues: QueueSummary[] };
    expect(body.queues.map((queue) => queue.name)).toEqual(['signals', 'steps', 'analysis']);
    const [queueSignals, queueActions] = body.queues;
    expect(queueSignals).toEqual({
      name: 'signals',
      isPaused: false,
      counts: { waiting: 1, active: 0, delayed: 1, completed: 0, failed: 0, paused: 0 },
      failed: [],
    });
    expect(queueActions?.counts).toEqual({ waiting: 0, active: 0, delayed: 0, completed: 0, failed: 7, paused: 0 });
    expect(queueActions?.failed).toHaveLength(5);
    // Failed jobs are ordered by when they failed, newest first; the worker took them oldest first.
    expect(queueActions?.failed.map((job) => job.id)).toEqual(['drain-6', 'drain-5', 'drain-4', 'drain-3', 'drain-2']);
    expect(queueActions?.failed[0]).toEqual({
      id: 'drain-6',
      name: 'drain',
      failedReason: 'scontrol refused gpu-6\nstack line',
      attemptsMade: 1,
      timestamp: 1_000_006,
    });
  });

  it('counts the jobs of a paused queue as paused, not waiting', async () => {
    await signals.pause();
    try {
      const { stdout } = await runQueues(['--redis', '--json'], cliEnv);
      const [queueSignals] = (JSON.parse(stdout) as { queues: QueueSummary[] }).queues;
      expect(queueSignals).toMatchObject({ name: 'signals', isPaused: true, counts: { waiting: 0, delayed: 1, paused: 1 } });
      const table = await runQueues(['--redis'], cliEnv);
      expect(table.stdout.split('\n')[0]).toMatch(/waiting 0 .* paused 1 {2}\(queue paused\)$/);
    } finally {
      await signals.resume();
    }
  });

  it('prints a table without --json', async () => {
    const { stdout, exitCode } = await runQueues(['--redis'], cliEnv);
    expect(exitCode).toBe(0);
    const lines = stdout.trimEnd().split('\n');
    expect(lines[0]).toMatch(/^signals\s+waiting 1 {2}active 0 {2}delayed 1 {2}completed 0 {2}failed 0 {2}paused 0$/);
    expect(lines[1]).toMatch(/^steps\s+waiting 0 .* failed 7 {2}paused 0$/);
    // Five failed transitions, then the (empty) analysis queue.
    expect(lines.slice(2, 7)).toHaveLength(5);
    expect(lines[7]).toMatch(/^analysis\s+waiting 0 /);
    expect(lines[2]).toContain('drain-6  drain  attempts 1  scontrol refused gpu-6');
    expect(lines[2]).not.toContain('stack line');
  });

  it('fails (exit code 1) rather than waiting when Redis is unreachable, without printing its password', async () => {
    const { stdout, stderr, exitCode } = await runQueues(['--redis', '--json'], { ...cliEnv, STEADFAST_REDIS__URL: 'redis://user:hunter2@127.0.0.1:1' });
    expect(exitCode).toBe(1);
    expect(stdout).toBe('');
    expect(stderr).toMatch(/^steadfast: Redis at 127\.0\.0\.1:1 is not reachable/);
    expect(stderr).not.toContain('hunter2');
  });

  it('reports an invalid config as a usage error (exit code 2)', async () => {
    const { stderr, exitCode } = await runQueues(['--redis', '--json'], { ...cliEnv, STEADFAST_REDIS__PREFIX: 'not a prefix!' });
    expect(exitCode).toBe(2);
    expect(stderr).toMatch(/^steadfast: .*prefix/);
  });
});
