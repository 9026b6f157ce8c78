import { spawn, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { createWriteStream } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * Child processes started for the demo and the tests, tracked so that every one of them is
 * stopped at the end, whatever happens in between.
 */
export class ProcessGroup {
  private readonly children = new Map<string, ChildProcess>();
  // However this process ends (an uncaught error, process.exit), its children end with it.
  private readonly killOnExit = (): void => {
    for (const child of this.children.values()) child.kill('SIGKILL');
  };

  constructor() {
    process.once('exit', this.killOnExit);
  }

  /** Starts `command`, writing its output to `logFile`. */
  start(name: string, command: string, args: readonly string[], logFile: string, options: SpawnOptions = {}): ChildProcess {
    const log = createWriteStream(logFile, { flags: 'a' });
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], ...options });
    child.stdout?.pipe(log);
    child.stderr?.pipe(log);
    child.on('error', (error) => log.write(`\n[steadfast] could not start ${command}: ${error.message}\n`));
    this.children.set(name, child);
    child.once('exit', () => {
      if (this.children.get(name) === child) this.children.delete(name);
    });
    return child;
  }

  isRunning(name: string): boolean {
    const child = this.children.get(name);
    return child !== undefined && child.exitCode === null && child.signalCode === null;
  }

  /** Stops one child: SIGTERM, then SIGKILL after `graceMs`. */
  async stop(name: string, graceMs = 3000, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    const child = this.children.get(name);
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
    child.kill(signal);
    const timer = setTimeout(() => child.kill('SIGKILL'), graceMs);
    await exited;
    clearTimeout(timer);
  }

  async stopAll(graceMs = 3000): Promise<void> {
    await Promise.all([...this.children.keys()].map((name) => this.stop(name, graceMs)));
    process.removeListener('exit', this.killOnExit);
  }
}

export { freePort, freePorts } from './ports.js';

/** Reports how long each set-up step took, for progress output. */
export type StepProgress = (step: string, seconds: number) => void;

/** Runs one set-up step and reports its seconds to `progress`, when given. */
export async function timedStep<T>(progress: StepProgress | undefined, name: string, work: () => Promise<T>): Promise<T> {
  const started = performance.now();
  const result = await work();
  progress?.(name, (performance.now() - started) / 1000);
  return result;
}

/**
 * Polls `check` until it returns true or `timeoutMs` passes. On a timeout the error says what
 * was awaited, the last error `check` threw and, with `seen`, what the world looked like then.
 */
export async function waitFor(what: string, check: () => Promise<boolean>, timeoutMs = 15_000, intervalMs = 100, seen?: () => Promise<string>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let lastError = '';
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (error) {
      lastError = error instanceof Error ? error.message : String(error);
    }
    await sleep(intervalMs);
  }
  const observed = seen ? await seen().catch((error: unknown) => `(could not tell: ${error instanceof Error ? error.message : String(error)})`) : '';
  throw new Error(
    `timed out after ${timeoutMs} ms waiting for ${what}${lastError ? ` (last error: ${lastError})` : ''}${observed ? `; seen: ${observed}` : ''}`,
  );
}

/** GET `url` and return true on a 2xx answer. */
export async function httpOk(url: string): Promise<boolean> {
  const response = await fetch(url, { signal: AbortSignal.timeout(2000) });
  await response.arrayBuffer();
  return response.ok;
}
