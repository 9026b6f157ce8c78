import { EventEmitter } from 'node:events';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { loadKoffi, NvmlError, NvmlUnavailableError, NVML_FUNCTIONS, type NvmlEntryPoints, type NvmlFunction } from './library.js';
import { NVML_WORKER_ROLE, type NvmlFailure, type NvmlMessage, type NvmlPollValue, type NvmlWorkerData } from './worker.js';
import type { NvlinkErrorCount } from '../nvlink-errors.js';

/**
 * The event loop's side of the NVML thread (worker.ts): requests with a time limit, answered in
 * order. While a request has been unanswered for longer than its limit (a call stuck in the
 * driver), later requests fail at once, naming that call, instead of queueing behind it; the
 * thread's late answer is dropped.
 *
 * The worker runs the module that holds it: the agent's bundle (dist/agent.cjs) when the agent
 * runs from it, worker.js beside this file in the compiled tree, or worker.ts through tsx when
 * the sources run directly (tests, tsx).
 */

export interface NvmlXidReport {
  readonly pciBusId: string;
  readonly index: number;
  readonly xid: number;
}

/** The Xid event wait failing (with an nvmlReturn_t code) or answering again. */
export interface NvmlEventsState {
  readonly state: 'failing' | 'ok';
  readonly code?: number | undefined;
}

interface Pending {
  readonly resolve: (value: unknown) => void;
  readonly reject: (error: Error) => void;
  readonly since: number;
  readonly failures: (failures: readonly NvmlFailure[]) => void;
}

function timeoutError(message: string): Error {
  const error = new Error(message);
  error.name = 'TimeoutError';
  return error;
}

/**
 * The worker's script: nvml-worker.cjs beside the agent's bundle (scripts/build-agent.mjs), the
 * bundle itself where that is missing, or worker.js beside this file. Running from the
 * TypeScript sources (tests, tsx), where a worker thread has no TypeScript loader, worker.ts is
 * bundled once with esbuild (a development dependency) into node_modules/.cache, where koffi
 * resolves.
 */
async function workerScript(): Promise<URL> {
  const here = import.meta.url;
  if (here.endsWith('.cjs')) {
    const own = new URL('./nvml-worker.cjs', here);
    return existsSync(own) ? own : new URL(here);
  }
  if (!here.endsWith('.ts')) return new URL('./worker.js', here);
  sourceWorker ??= (async () => {
    // Named through a variable, so that the agent's bundle does not take esbuild in with it.
    const bundler = 'esbuild';
    const { build } = (await import(bundler)) as typeof import('esbuild');
    const root = fileURLToPath(new URL('../../../', here));
    const out = join(root, 'node_modules', '.cache', 'steadfast', `nvml-worker-${process.pid}.cjs`);
    await build({
      entryPoints: [fileURLToPath(new URL('./worker.ts', here))],
      outfile: out,
      bundle: true,
      platform: 'node',
      format: 'cjs',
      target: 'node20',
      external: ['koffi'],
      logLevel: 'warning',
    });
    process.once('exit', () => rmSync(out, { force: true }));
    return pathToFileURL(out);
  })();
  return sourceWorker;
}

let sourceWorker: Promise<URL> | undefined;

/**
 * NVML threads that close() left stuck in the driver. While one is, the process cannot end on its
 * own: at exit Node joins every thread, and that one never returns (a stuck koffi call on libuv's
 * pool would hold the exit the same way).
 */
let stuckThreads = 0;

/**
 * Ends the process now, with `process.exitCode`, when an NVML thread is stuck in the driver
 * (libc's _exit, through koffi: no thread is joined); otherwise returns, and the process ends
 * as usual. For the agent's shutdown, `--once` and `steadfast check`, so that a hung driver
 * cannot hold them past their work. Standard output and error are written synchronously on Linux.
 */
export async function exitIfNvmlStuck(log: (message: string) => void): Promise<void> {
  if (stuckThreads === 0) return;
  log('an NVML call is stuck in the driver: ending the process without waiting for it');
  const code = typeof process.exitCode === 'number' ? process.exitCode : 0;
  try {
    const koffi = await loadKoffi();
    koffi.load('libc.so.6').func('void _exit(int status)')(code);
  } catch {
    process.kill(process.pid, 'SIGKILL');
  }
}

export class NvmlClient extends EventEmitter<{ xid: [NvmlXidReport]; failures: [readonly NvmlFailure[]]; events: [NvmlEventsState] }> {
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly progress: Int32Array;
  private exited: Error | undefined;

  private constructor(
    readonly library: string,
    /** The entry point the library gives for each reading that has several (library.ts NVML_ENTRY_POINTS). */
    readonly entryPoints: NvmlEntryPoints,
    private readonly worker: Worker,
    progress: SharedArrayBuffer,
  ) {
    super();
    this.progress = new Int32Array(progress);
  }

  /**
   * Starts the thread and loads the library there. Throws NvmlUnavailableError with the reason
   * (no koffi binary for this platform, no such library, not NVML).
   */
  static async start(library: string): Promise<NvmlClient> {
    const progress = new SharedArrayBuffer(4);
    const data: NvmlWorkerData = { role: NVML_WORKER_ROLE, library, progress };
    const worker = new Worker(await workerScript(), { workerData: data });
    let client: NvmlClient | undefined;
    let settleStart: (outcome: NvmlMessage | Error) => void = () => undefined;
    const started = new Promise<NvmlMessage | Error>((resolve) => {
      settleStart = resolve;
    });
    // One set of listeners for the thread's life: the first message says whether the library loaded.
    worker.on('message', (message: NvmlMessage) => (client ? client.receive(message) : settleStart(message)));
    worker.on('error', (error) => (client ? client.fail(new Error(`the NVML thread failed: ${error.message}`)) : settleStart(error)));
    worker.on('exit', (code) => {
      const error = new Error(`the NVML thread exited (code ${code})`);
      if (client) client.fail(error);
      else settleStart(error);
    });
    const first = await started;
    if (first instanceof Error) throw new NvmlUnavailableError(`cannot start the NVML thread: ${first.message}`, { cause: first });
    if (first.kind === 'unavailable') {
      await worker.terminate();
      throw new NvmlUnavailableError(first.message);
    }
    if (first.kind !== 'ready') {
      await worker.terminate();
      throw new NvmlUnavailableError(`the NVML thread answered ${first.kind} before it was ready`);
    }
    client = new NvmlClient(library, first.entryPoints, worker, progress);
    return client;
  }

  /** Reads every GPU (and with `nvlink` their link counters). */
  poll(timeoutMs: number, signal?: AbortSignal): Promise<NvmlPollValue> {
    return this.request({ kind: 'poll', nvlink: false }, timeoutMs, signal) as Promise<NvmlPollValue>;
  }

  /** The NVLink error counters of every GPU. */
  nvlink(timeoutMs: number, signal?: AbortSignal): Promise<NvlinkErrorCount[]> {
    return this.request({ kind: 'nvlink' }, timeoutMs, signal) as Promise<NvlinkErrorCount[]>;
  }

  /** Starts the Xid events on the GPUs of the last poll (`xid` events); answers how many GPUs offer them. */
  watchXids(timeoutMs: number): Promise<number> {
    return this.request({ kind: 'events' }, timeoutMs) as Promise<number>;
  }

  /** Shuts NVML down and ends the thread; a thread stuck in the driver is left behind (it keeps nothing alive). */
  async close(timeoutMs = 2_000): Promise<void> {
    if (this.exited) return;
    try {
      await this.request({ kind: 'close' }, timeoutMs);
    } catch (error) {
      // Stuck, or already gone: terminate() below ends it when it comes back.
      if (error instanceof Error && error.name === 'TimeoutError' && !this.exited) {
        stuckThreads++;
        this.worker.once('exit', () => stuckThreads--);
      }
    }
    this.exited ??= new Error('the NVML thread is closed');
    // A thread stuck in the driver cannot end until the call returns; it must not hold the agent.
    this.worker.unref();
    void this.worker.terminate();
  }

  /** The call the thread is in right now, if any. */
  private runningCall(): NvmlFunction | undefined {
    const index = Atomics.load(this.progress, 0) - 1;
    return NVML_FUNCTIONS[index];
  }

  /** `signal`: stop waiting (the collector is closing); the thread's answer, when it comes, is dropped. */
  private request(
    body: { kind: 'poll'; nvlink: boolean } | { kind: 'nvlink' } | { kind: 'events' } | { kind: 'close' },
    timeoutMs: number,
    signal?: AbortSignal,
  ): Promise<unknown> {
    if (this.exited) return Promise.reject(this.exited);
    if (signal?.aborted) return Promise.reject(new Error('NVML request aborted'));
    const oldest = Math.min(...[...this.pending.values()].map((pending) => pending.since));
    if (Number.isFinite(oldest) && Date.now() - oldest > timeoutMs) {
      const call = this.runningCall();
      return Promise.reject(timeoutError(`NVML ${call ? `call ${call}` : 'request'} has not returned for ${Math.round((Date.now() - oldest) / 1000)} s`));
    }
    const id = this.nextId++;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        // The entry stays until the thread answers, so that later requests see it is stuck.
        const call = this.runningCall();
        reject(timeoutError(`NVML did not answer within ${timeoutMs} ms${call ? ` (stuck in ${call})` : ''}`));
      }, timeoutMs);
      timer.unref();
      const onAbort = (): void => reject(new Error('NVML request aborted'));
      signal?.addEventListener('abort', onAbort, { once: true });
      const settle = (action: () => void): void => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        action();
      };
      this.pending.set(id, {
        since: Date.now(),
        resolve: (value) => settle(() => resolve(value)),
        reject: (error) => settle(() => reject(error)),
        failures: (failures) => {
          if (failures.length > 0) this.emit('failures', failures);
        },
      });
      this.worker.postMessage({ id, ...body });
    });
  }

  private receive(message: NvmlMessage): void {
    if (message.kind === 'xid') {
      this.emit('xid', { pciBusId: message.pciBusId, index: message.index, xid: message.xid });
      return;
    }
    if (message.kind === 'failures') {
      this.emit('failures', message.failures);
      return;
    }
    if (message.kind === 'events') {
      this.emit('events', { state: message.state, code: message.code });
      return;
    }
    if (message.kind !== 'reply') return;
    const pending = this.pending.get(message.id);
    if (pending === undefined) return;
    this.pending.delete(message.id);
    pending.failures(message.failures);
    if (message.error === undefined) pending.resolve(message.value);
    else if (message.error.functionName !== undefined && message.error.code !== undefined) {
      pending.reject(new NvmlError(message.error.functionName, message.error.code, message.error.message.replace(/^.* returned \d+ \((.*)\)$/, '$1')));
    } else pending.reject(new Error(message.error.message));
  }

  private fail(error: Error): void {
    this.exited ??= error;
    for (const pending of this.pending.values()) pending.reject(error);
    this.pending.clear();
  }
}
