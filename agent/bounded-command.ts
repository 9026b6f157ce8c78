import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { lazyCrypto } from '../core/lazy-crypto.js';
import { performance } from 'node:perf_hooks';
import type { Readable } from 'node:stream';
import { errorMessage } from '../core/errors.js';

/**
 * Runs one command (an argv array, never a shell) in its own process group under a time limit:
 * SIGTERM to the whole group at the limit, SIGKILL after a grace, so that an `mpirun` or a
 * wrapper script takes its children with it. Keeps only the tail of the output, can hash stdout
 * as it streams (the bit-wise alignment reference step, ByteRobust §4.3), and can watch stdout
 * line by line. Always resolves; a binary that cannot be started is a result, not a throw.
 */

export interface BoundedCommandOptions {
  readonly argv: readonly string[];
  readonly limitMs: number;
  /** Time between SIGTERM and SIGKILL at the limit or on abort. */
  readonly killGraceMs: number;
  readonly env: Readonly<Record<string, string | undefined>>;
  /** How much of the combined stdout and stderr to keep, from the end. */
  readonly tailBytes: number;
  /** Hash all of stdout with sha256. */
  readonly hashStdout?: boolean | undefined;
  /** Called with each complete stdout line (without the newline). */
  readonly onStdoutLine?: ((line: string) => void) | undefined;
  readonly signal?: AbortSignal | undefined;
}

export interface BoundedCommandResult {
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly seconds: number;
  /** Why it was stopped, when it was: its time limit, or the abort signal. */
  readonly stoppedBy: 'limit' | 'abort' | null;
  /** Set when the command could not be started at all (missing binary, not executable). */
  readonly spawnError?: string;
  readonly outputTail: string;
  /** sha256 of stdout in hex, when hashStdout was asked for. */
  readonly stdoutSha256?: string;
}

/** A stdout line longer than this is cut before it reaches onStdoutLine. */
const MAX_LINE_CHARS = 64 * 1024;
/** How long to wait for the output pipes to close once the process is gone or killed. */
const PIPE_DRAIN_MS = 1000;

/** The last `limit` bytes of a stream, kept without holding the rest. */
class Tail {
  private readonly chunks: Buffer[] = [];
  private size = 0;

  constructor(private readonly limit: number) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.chunks.length > 1 && this.size - this.chunks[0]!.length >= this.limit) this.size -= this.chunks.shift()!.length;
  }

  text(): string {
    const all = Buffer.concat(this.chunks);
    // A cut through a multi-byte character decodes as U+FFFD at the start; drop it.
    return all
      .subarray(Math.max(0, all.length - this.limit))
      .toString('utf8')
      .replace(/^\uFFFD+/, '');
  }
}

function describeSpawnError(binary: string, error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') return `${binary} not found (is it installed, and on the agent's PATH?)`;
  if (code === 'EACCES') return `${binary} is not executable by the agent`;
  return `cannot run ${binary}: ${errorMessage(error)}`;
}

export function runBoundedCommand(options: BoundedCommandOptions): Promise<BoundedCommandResult> {
  const [binary = '', ...args] = options.argv;
  const tail = new Tail(options.tailBytes);
  const started = performance.now();
  const elapsed = (): number => (performance.now() - started) / 1000;
  if (options.signal?.aborted) {
    return Promise.resolve({ exitCode: null, signal: null, seconds: 0, stoppedBy: 'abort', outputTail: '' });
  }
  return new Promise((resolve) => {
    let child: ChildProcessByStdio<null, Readable, Readable>;
    try {
      child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: options.env });
    } catch (error) {
      // spawn throws synchronously for some bad arguments; the config schema should prevent them.
      resolve({ exitCode: null, signal: null, seconds: elapsed(), stoppedBy: null, spawnError: describeSpawnError(binary, error), outputTail: '' });
      return;
    }
    const hash = options.hashStdout ? lazyCrypto().createHash('sha256') : undefined;
    let partialLine = '';
    let stoppedBy: 'limit' | 'abort' | null = null;
    let exit: { code: number | null; signal: NodeJS.Signals | null; seconds: number } | undefined;
    let spawnError: string | undefined;
    let settled = false;
    const timers: NodeJS.Timeout[] = [];

    const signalGroup = (signal: NodeJS.Signals): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, signal);
      } catch {
        // The group is already gone.
      }
    };
    const finish = (): void => {
      if (settled) return;
      settled = true;
      timers.forEach(clearTimeout);
      options.signal?.removeEventListener('abort', onAbort);
      if (options.onStdoutLine && partialLine !== '') options.onStdoutLine(partialLine);
      child.stdout.destroy();
      child.stderr.destroy();
      resolve({
        exitCode: exit?.code ?? null,
        signal: exit?.signal ?? null,
        seconds: exit?.seconds ?? elapsed(),
        stoppedBy,
        ...(spawnError === undefined ? {} : { spawnError }),
        outputTail: tail.text(),
        ...(hash === undefined || spawnError !== undefined ? {} : { stdoutSha256: hash.digest('hex') }),
      });
    };
    const stop = (why: 'limit' | 'abort'): void => {
      if (exit !== undefined || stoppedBy !== null) return;
      stoppedBy = why;
      signalGroup('SIGTERM');
      timers.push(setTimeout(() => signalGroup('SIGKILL'), options.killGraceMs));
      // Whatever escaped the group may hold the pipes open; do not wait for it forever.
      timers.push(setTimeout(finish, options.killGraceMs + PIPE_DRAIN_MS));
    };
    const onAbort = (): void => stop('abort');

    timers.push(setTimeout(() => stop('limit'), options.limitMs));
    options.signal?.addEventListener('abort', onAbort, { once: true });

    child.stdout.on('data', (chunk: Buffer) => {
      tail.push(chunk);
      hash?.update(chunk);
      if (options.onStdoutLine) {
        const lines = (partialLine + chunk.toString('utf8')).split('\n');
        partialLine = lines.pop()!.slice(-MAX_LINE_CHARS);
        for (const line of lines) options.onStdoutLine(line.slice(0, MAX_LINE_CHARS));
      }
    });
    child.stderr.on('data', (chunk: Buffer) => tail.push(chunk));
    child.on('error', (error) => {
      // Only a failed start reaches here with no exit; later errors come with an exit too.
      if (exit === undefined) spawnError = describeSpawnError(binary, error);
      finish();
    });
    child.on('exit', (code, signal) => {
      exit = { code, signal, seconds: elapsed() };
      // A check leaves nothing running behind it: take down what is left of its group.
      signalGroup('SIGKILL');
      timers.push(setTimeout(finish, PIPE_DRAIN_MS));
    });
    child.on('close', finish);
  });
}
