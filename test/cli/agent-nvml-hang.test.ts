import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { StandInNvml } from '../../tryit/nvml/stand-in.js';
import { tempDirPerTest } from '../agent/helpers.js';

/**
 * A driver that hangs in an NVML call keeps that call's thread forever, and Node waits for every
 * thread when a process ends. The agent's `--once`, its shutdown on SIGTERM and `steadfast check`
 * must still end, with their own exit status, once their work is done.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const BIN = join(ROOT, 'bin', 'steadfast.js');
const HUNG = 'driver 580.159.04\ngpus 1\n0 pci 00000000:00:06.0\n0 minor 0\n0 temp 37\n0 hang.temp 1\n';
const dir = tempDirPerTest('steadfast-nvml-hang-');

function built(): void {
  if (!existsSync(join(ROOT, 'dist', 'agent.cjs'))) throw new Error('dist/agent.cjs is missing: run `npm run build` (npm test does it)');
}

describe('a driver hung in an NVML call', () => {
  it('does not hold agent --once or steadfast check past their answer', async () => {
    built();
    const nvml = await StandInNvml.create(join(dir(), 'nvml'), HUNG);
    const source = ['--gpu.source', 'nvml', '--gpu.nvml-library', nvml.library, '--path.kmsg', '/dev/null'];
    const env = { ...process.env, STEADFAST_LOG_LEVEL: 'silent' };
    const once = run(
      process.execPath,
      [BIN, 'agent', '--once', '--node', 'n1', '--no-collector.process', '--xid.state-file', join(dir(), 'agent.json'), ...source],
      { env, timeout: 60_000 },
    );
    const check = run(process.execPath, [BIN, 'check', '--node', 'n1', '--expect-gpus', '1', '--xid.state-file', join(dir(), 'check.json'), ...source], {
      env,
      timeout: 60_000,
    }).then(
      () => ({ code: 0, stdout: '' }),
      (error: { code?: number; stdout?: string; killed?: boolean }) => ({ code: error.killed ? 'killed' : error.code, stdout: error.stdout ?? '' }),
    );
    const { stdout } = await once;
    // The gpu and nvlink collectors' polls, each timed out once.
    expect(stdout).toMatch(/^steadfast_gpu_query_failures_total\{command="nvml",reason="timeout"\} [12]$/m);
    expect(stdout).toContain('steadfast_collector_success{collector="gpu"} 0');
    expect(await check).toEqual({ code: 1, stdout: expect.stringContaining('GPUs unreadable: cannot read NVML') });
    expect((await check).stdout).toContain('stuck in nvmlDeviceGetTemperature');
  }, 90_000);

  it('lets the serving agent stop on SIGTERM', async () => {
    built();
    const nvml = await StandInNvml.create(join(dir(), 'nvml'), HUNG);
    const agent = spawn(
      process.execPath,
      [
        BIN,
        'agent',
        '--web.insecure',
        '--web.listen-address',
        '127.0.0.1:0',
        '--node',
        'n1',
        '--no-collector.process',
        '--xid.state-file',
        join(dir(), 'agent.json'),
        '--path.kmsg',
        '/dev/null',
        '--gpu.source',
        'nvml',
        '--gpu.nvml-library',
        nvml.library,
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    const exited = new Promise<number | null>((resolve) => agent.once('exit', (code) => resolve(code)));
    try {
      let log = '';
      await new Promise<void>((resolve, reject) => {
        agent.stderr.on('data', (chunk: Buffer) => {
          log += chunk.toString();
          if (log.includes('steadfast agent started')) resolve();
        });
        agent.once('exit', () => reject(new Error(`the agent exited before it started: ${log}`)));
      });
      agent.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(log).not.toContain('"level":50');
    } finally {
      agent.kill('SIGKILL');
    }
  }, 90_000);
});
