import type { ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { stringify } from 'yaml';
import type { Config } from '../core/config.js';
import { repoRoot } from '../core/paths.js';
import { workerConnection } from '../core/redis.js';
import { QUEUE_NAMES } from '../core/queues.js';
import { httpOk, waitFor, type ProcessGroup } from './processes.js';

/**
 * `steadfast controller` as a child process, run from the TypeScript sources (`node --import
 * tsx cli/main.ts`) so it is the code under test whatever dist/ holds. The fault tests kill it
 * with SIGKILL mid-work and start it again; the scale-out test runs one as a worker-only replica.
 */

/** USER_HZ, which Linux fixes at 100 for /proc. */
const CLOCK_TICKS_PER_SECOND = 100;

export interface ControllerProcessOptions {
  /** Name in the ProcessGroup, and the stem of its config and log files under `dir`. */
  readonly name: string;
  readonly dir: string;
  readonly config: Config;
  /** Serve HTTP (`--no-http` when false); the port is the config's, which must not be 0. */
  readonly http?: boolean;
  /** Run the workers (`--no-workers` when false). */
  readonly workers?: boolean;
  /** Options for node itself, e.g. `--cpu-prof` to profile it. */
  readonly nodeArgs?: readonly string[];
  /**
   * Run the compiled CLI (bin/steadfast.js over dist/, as an installation runs it) rather than
   * the TypeScript sources through tsx: for benchmarks, where tsx's loader would be measured too.
   */
  readonly compiled?: boolean;
}

export class ControllerProcess {
  child: ChildProcess | undefined;
  readonly configFile: string;
  readonly logFile: string;

  constructor(
    private readonly group: ProcessGroup,
    readonly options: ControllerProcessOptions,
  ) {
    this.configFile = join(options.dir, `${options.name}.yml`);
    this.logFile = join(options.dir, `${options.name}.log`);
    writeFileSync(this.configFile, stringify(options.config));
  }

  get url(): string {
    return `http://127.0.0.1:${this.options.config.controller.port}`;
  }

  /** Starts the process and waits until it serves HTTP, or until its workers are connected to Redis. */
  async start(timeoutMs = 60_000): Promise<void> {
    const { name, http = true, workers = true, config } = this.options;
    if (http && config.controller.port === 0) throw new Error('a controller process serving HTTP needs a fixed port');
    const entry = this.options.compiled ? [join(repoRoot(), 'bin', 'steadfast.js')] : ['--import', 'tsx', join(repoRoot(), 'cli', 'main.ts')];
    const args = [...(this.options.nodeArgs ?? []), ...entry, 'controller', '--config', this.configFile];
    if (!http) args.push('--no-http');
    if (!workers) args.push('--no-workers');
    const before = workers ? await this.workerCount() : 0;
    this.child = this.group.start(name, process.execPath, args, this.logFile, { cwd: repoRoot(), env: { ...process.env } });
    if (http) await waitFor(`${name} to answer /healthz`, () => httpOk(`${this.url}/healthz`), timeoutMs, 200);
    // BullMQ names each worker's connection after its queue: the new process shows up there.
    if (workers) await waitFor(`${name}'s workers to connect`, async () => (await this.workerCount()) > before, timeoutMs, 200);
  }

  /** Workers connected to the signals queue, from every process sharing this Redis and prefix. */
  async workerCount(queue: string = QUEUE_NAMES.signals): Promise<number> {
    const connection = workerConnection(this.options.config.redis);
    const handle = new Queue(queue, { connection, prefix: this.options.config.redis.prefix });
    try {
      return (await handle.getWorkersCount()) as number;
    } finally {
      await handle.close();
      connection.disconnect();
    }
  }

  /** CPU time (user + system) the process has used so far, from /proc (Linux). */
  cpuSeconds(): number {
    const pid = this.child?.pid;
    if (pid === undefined) return Number.NaN;
    // Fields after the command name: state is field 3, utime 14 and stime 15 (proc(5)).
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8')
      .replace(/^.*\) /s, '')
      .split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLOCK_TICKS_PER_SECOND;
  }

  /** The most resident memory the process has held so far (VmHWM in /proc, Linux), in bytes. */
  peakRssBytes(): number {
    const pid = this.child?.pid;
    if (pid === undefined) return Number.NaN;
    const kib = /^VmHWM:\s+(\d+) kB$/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
    return kib === undefined ? Number.NaN : Number(kib) * 1024;
  }

  /** Kills it at once, as the OOM killer or a lost machine would: nothing is flushed or released. */
  async kill(): Promise<void> {
    await this.group.stop(this.options.name, 0, 'SIGKILL');
  }

  async stop(): Promise<void> {
    await this.group.stop(this.options.name, 5000);
  }
}
