import { spawn } from 'node:child_process';
import { constants } from 'node:fs';
import { access } from 'node:fs/promises';
import { delimiter, isAbsolute, join } from 'node:path';
import { errorMessage } from '../../core/errors.js';
import type { ProcessRole } from './proc-tree.js';

/**
 * Runs `py-spy dump --pid <pid>` over a set of processes: a few at a time, each under its own
 * timeout, all of them under one deadline. The dump text is returned as py-spy printed it.
 * py-spy needs ptrace rights over the target (root, or CAP_SYS_PTRACE); when it lacks them its
 * own message comes back as that process's error.
 */

export interface PySpyTarget {
  readonly pid: number;
  readonly role: ProcessRole;
  readonly rank: number | null;
}

export type PySpyDump = PySpyTarget & ({ readonly ok: true; readonly dump: string } | { readonly ok: false; readonly error: string });

export interface PySpyOptions {
  /** The py-spy binary: a path, or a name looked up on PATH. */
  readonly binary: string;
  /** Longest one `py-spy dump` may run before it is killed. */
  readonly perProcessTimeoutMs: number;
  /** When every dump must be over, counted from the call; later ones are cut short or not started. */
  readonly deadlineMs: number;
  /** How many py-spy processes run at once. */
  readonly concurrency: number;
  readonly signal?: AbortSignal | undefined;
}

/** py-spy is neither at the given path nor on PATH. */
export class PySpyNotFoundError extends Error {
  constructor(readonly binary: string) {
    super(`py-spy not found at ${binary}; install it with pip install py-spy`);
    this.name = 'PySpyNotFoundError';
  }
}

/** Resolves the binary to an executable path, or throws PySpyNotFoundError. */
export async function locatePySpy(binary: string, pathVariable = process.env.PATH ?? ''): Promise<string> {
  const candidates = binary.includes('/')
    ? [binary]
    : pathVariable
        .split(delimiter)
        .filter(isAbsolute)
        .map((dir) => join(dir, binary));
  for (const candidate of candidates) {
    try {
      await access(candidate, constants.X_OK);
      return candidate;
    } catch {
      // Not here (or not executable); try the next PATH entry.
    }
  }
  throw new PySpyNotFoundError(binary);
}

/** A dump of hundreds of threads with --locals stays well under this. */
const MAX_OUTPUT_BYTES = 8 * 1024 * 1024;
const MAX_ERROR_CHARS = 4096;

type RunResult = { ok: true; stdout: string } | { ok: false; error: string };

/** Runs one command, killing its whole process group at the timeout or on abort. */
function runBounded(binary: string, args: readonly string[], timeoutMs: number, signal: AbortSignal | undefined): Promise<RunResult> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve({ ok: false, error: 'cancelled: the agent is shutting down' });
      return;
    }
    // Own process group, so that a wrapper script's children die with it at the timeout.
    const child = spawn(binary, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    const stdout: Buffer[] = [];
    let stdoutBytes = 0;
    let stderr = '';
    let settled = false;
    const finish = (result: RunResult): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
      resolve(result);
    };
    const kill = (): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // Already gone.
      }
    };
    const onAbort = (): void => {
      kill();
      finish({ ok: false, error: 'cancelled: the agent is shutting down' });
    };
    const timer = setTimeout(() => {
      kill();
      finish({ ok: false, error: `py-spy did not finish within ${(timeoutMs / 1000).toFixed(1)} s and was killed` });
    }, timeoutMs);
    signal?.addEventListener('abort', onAbort, { once: true });
    child.stdout.on('data', (chunk: Buffer) => {
      stdoutBytes += chunk.length;
      if (stdoutBytes <= MAX_OUTPUT_BYTES) stdout.push(chunk);
    });
    child.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < MAX_ERROR_CHARS) stderr += chunk.toString('utf8');
    });
    child.on('error', (error) => finish({ ok: false, error: `cannot run ${binary}: ${errorMessage(error)}` }));
    child.on('close', (code, killedBy) => {
      if (code === 0) {
        finish({ ok: true, stdout: Buffer.concat(stdout).toString('utf8') });
        return;
      }
      const how = code === null ? `was killed by ${killedBy ?? 'a signal'}` : `exited with status ${code}`;
      const said = stderr.trim().slice(0, MAX_ERROR_CHARS);
      finish({ ok: false, error: said === '' ? `py-spy ${how}` : `py-spy ${how}: ${said}` });
    });
  });
}

/** Dumps every target; always resolves, with one entry per target in the order given. */
export async function dumpPythonStacks(targets: readonly PySpyTarget[], options: PySpyOptions): Promise<PySpyDump[]> {
  const deadline = Date.now() + options.deadlineMs;
  const results: PySpyDump[] = new Array<PySpyDump>(targets.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < targets.length) {
      const index = next;
      next += 1;
      const target = targets[index]!;
      const remaining = deadline - Date.now();
      if (remaining <= 0) {
        results[index] = { ...target, ok: false, error: `not started: the deadline of ${(options.deadlineMs / 1000).toFixed(1)} s had passed` };
        continue;
      }
      const run = await runBounded(options.binary, ['dump', '--pid', String(target.pid)], Math.min(options.perProcessTimeoutMs, remaining), options.signal);
      results[index] = run.ok ? { ...target, ok: true, dump: run.stdout } : { ...target, ok: false, error: run.error };
    }
  };
  const workers = Math.max(1, Math.min(options.concurrency, targets.length));
  await Promise.all(Array.from({ length: workers }, worker));
  return results;
}
