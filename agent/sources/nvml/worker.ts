import { isMainThread, parentPort, workerData } from 'node:worker_threads';
import { errorMessage } from '../../../core/errors.js';
import type { NvlinkErrorCount } from '../nvlink-errors.js';
import type { GpuSample } from '../nvidia-smi-xml.js';
import { NVML, NvmlError, NvmlLibrary, type NvmlEntryPoints, type NvmlFunction } from './library.js';
import { readNvmlNvlink, readNvmlPoll, type NvmlPollValue } from './poll.js';

/**
 * The agent's NVML thread: a worker thread that loads the library and makes every NVML call,
 * synchronously (a microsecond or two of overhead each, against some fifteen for a call handed
 * to libuv's pool and back), so that one poll of eight GPUs is one message each way. A call that
 * hangs in the driver holds this thread alone: the agent's event loop keeps serving `/metrics`,
 * and the client (client.ts) counts the poll as timed out, naming the call from the shared
 * progress cell this thread writes before each call.
 *
 * It also watches for Xid events (nvmlEventTypeXidCriticalError), checking every 100 ms without
 * blocking, and posts each one to the client. Every GPU a poll has read is registered, the first
 * poll's at the start and any later one's (a GPU missing then) when it is first read, and stays
 * registered, under the identity it was last read with, for the event set's life: an Xid 79 from a
 * GPU that the last poll could not read, because it fell off the bus, still names it. A wait that
 * fails is reported once per run of failures (the client shows the events as down and polls the
 * GPUs at once, so that a lost GPU shows as not present), and once when it answers again.
 */

export const NVML_WORKER_ROLE = 'steadfast-nvml';

export interface NvmlWorkerData {
  readonly role: typeof NVML_WORKER_ROLE;
  readonly library: string;
  /** Int32[0]: 1 + the index in NVML_FUNCTIONS of the call in progress, 0 between calls. */
  readonly progress: SharedArrayBuffer;
}

export type NvmlRequest =
  | { readonly id: number; readonly kind: 'poll'; readonly nvlink: boolean }
  | { readonly id: number; readonly kind: 'nvlink' }
  | { readonly id: number; readonly kind: 'events' }
  | { readonly id: number; readonly kind: 'close' };

export type { NvmlPollValue } from './poll.js';

/** A failed call (not "not supported"), for steadfast_gpu_nvml_errors_total. */
export type NvmlFailure = readonly [name: NvmlFunction, code: number];

export type NvmlMessage =
  | { readonly kind: 'ready'; readonly entryPoints: NvmlEntryPoints }
  | { readonly kind: 'unavailable'; readonly message: string }
  | {
      readonly kind: 'reply';
      readonly id: number;
      readonly value?: unknown;
      readonly error?: { readonly message: string; readonly functionName?: string; readonly code?: number };
      readonly failures: readonly NvmlFailure[];
    }
  | { readonly kind: 'xid'; readonly pciBusId: string; readonly index: number; readonly xid: number }
  /** Calls that failed outside a request (the Xid event checks). */
  | { readonly kind: 'failures'; readonly failures: readonly NvmlFailure[] }
  /** The event wait started failing (with `code`), or answers again. */
  | { readonly kind: 'events'; readonly state: 'failing' | 'ok'; readonly code?: number };

/** nvmlEventTypeXidCriticalError. */
const XID_CRITICAL_ERROR = 0x8n;
const CHECK_EVERY_MS = 100;
/** nvmlEventData_t: device (pointer) @0, eventType (u64) @8, eventData (u64) @16, gpuInstanceId @24, computeInstanceId @28; 32 bytes. */
const EVENT_DATA_SIZE = 32;

class NvmlThread {
  /** Process names by pid, kept while the pid holds a GPU (a name is one more call per process). */
  private readonly names = new Map<number, string | undefined>();
  /** The GPUs of the last poll, by handle: the first ones registered for Xid events. */
  private devices = new Map<bigint, GpuSample>();
  /** Every GPU registered for Xid events, by handle, with the identity it was last read under; kept for the event set's life. */
  private readonly watched = new Map<bigint, { pciBusId: string; index: number }>();
  /** GPUs that offer no Xid events (or refused the registration): not asked again. */
  private readonly unwatchable = new Set<bigint>();
  private eventSet: unknown;
  private eventTimer: NodeJS.Timeout | undefined;
  /** The code of the run of failed event waits in progress; undefined while the wait answers. */
  private waitFailing: number | undefined;

  constructor(
    private readonly nvml: NvmlLibrary,
    private readonly post: (message: NvmlMessage) => void,
  ) {}

  handle(request: NvmlRequest): void {
    const failures: NvmlFailure[] = [];
    const failed = (name: NvmlFunction, code: number): void => {
      failures.push([name, code]);
    };
    try {
      let value: unknown;
      if (request.kind === 'poll') value = this.poll(request.nvlink, failed);
      else if (request.kind === 'nvlink') value = this.nvlink(failed);
      else if (request.kind === 'events') value = this.watchEvents(failed);
      else value = this.close();
      this.post({ kind: 'reply', id: request.id, value, failures });
    } catch (error) {
      const detail = error instanceof NvmlError ? { functionName: error.functionName, code: error.code } : {};
      this.post({ kind: 'reply', id: request.id, error: { message: errorMessage(error), ...detail }, failures });
    }
  }

  private poll(nvlink: boolean, failed: (name: NvmlFunction, code: number) => void): NvmlPollValue {
    this.nvml.init();
    const { devices, ...value } = readNvmlPoll(this.nvml, { nvlink, failed }, this.names);
    this.devices = devices;
    for (const [handle, sample] of devices) {
      if (this.watched.has(handle) && sample.pciBusId !== undefined) this.watched.set(handle, { pciBusId: sample.pciBusId, index: sample.index });
    }
    if (this.eventSet !== undefined) this.register(failed);
    return value;
  }

  private nvlink(failed: (name: NvmlFunction, code: number) => void): NvlinkErrorCount[] {
    this.nvml.init();
    return readNvmlNvlink(this.nvml, failed);
  }

  /** Makes the event set, registers the last poll's GPUs and starts checking; answers how many are registered. */
  private watchEvents(failed: (name: NvmlFunction, code: number) => void): number {
    if (this.eventSet !== undefined) return -1;
    const out: unknown[] = [null];
    const created = this.nvml.call('nvmlEventSetCreate', out);
    if (created !== NVML.SUCCESS) {
      failed('nvmlEventSetCreate', created);
      return 0;
    }
    this.eventSet = out[0];
    this.register(failed);
    this.eventTimer = setInterval(() => this.checkEvents(), CHECK_EVERY_MS);
    return this.watched.size;
  }

  /** Registers the GPUs of the last poll not yet registered (nor known to offer no Xid events). */
  private register(failed: (name: NvmlFunction, code: number) => void): void {
    for (const [device, sample] of this.devices) {
      if (this.watched.has(device) || this.unwatchable.has(device) || sample.pciBusId === undefined) continue;
      const supported: unknown[] = [0n];
      const code = this.nvml.call('nvmlDeviceGetSupportedEventTypes', device, supported);
      // Not supported, or a GPU lost since the poll read it: tried again at the next poll.
      if (code !== NVML.SUCCESS) continue;
      if ((BigInt(supported[0] as bigint) & XID_CRITICAL_ERROR) === 0n) {
        this.unwatchable.add(device);
        continue;
      }
      const result = this.nvml.call('nvmlDeviceRegisterEvents', device, XID_CRITICAL_ERROR, this.eventSet);
      if (result === NVML.SUCCESS) this.watched.set(device, { pciBusId: sample.pciBusId, index: sample.index });
      else failed('nvmlDeviceRegisterEvents', result);
    }
  }

  /**
   * Drains the events that arrived since the last check. A failed wait is reported once per run of
   * failures with one code (counted, and an `events` message), and its end once.
   */
  private checkEvents(): void {
    const data = Buffer.alloc(EVENT_DATA_SIZE);
    for (;;) {
      const code = this.nvml.call('nvmlEventSetWait_v2', this.eventSet, data, 0);
      if (code !== NVML.SUCCESS && code !== NVML.ERROR_TIMEOUT) {
        if (code !== this.waitFailing) {
          this.waitFailing = code;
          this.post({ kind: 'failures', failures: [['nvmlEventSetWait_v2', code]] });
          this.post({ kind: 'events', state: 'failing', code });
        }
        return;
      }
      if (this.waitFailing !== undefined) {
        this.waitFailing = undefined;
        this.post({ kind: 'events', state: 'ok' });
      }
      if (code === NVML.ERROR_TIMEOUT) return;
      if ((data.readBigUInt64LE(8) & XID_CRITICAL_ERROR) === 0n) continue;
      const gpu = this.watched.get(data.readBigUInt64LE(0));
      const xid = Number(data.readBigUInt64LE(16));
      if (gpu !== undefined && Number.isSafeInteger(xid)) this.post({ kind: 'xid', pciBusId: gpu.pciBusId, index: gpu.index, xid });
    }
  }

  private close(): true {
    if (this.eventTimer) clearInterval(this.eventTimer);
    if (this.eventSet !== undefined) this.nvml.call('nvmlEventSetFree', this.eventSet);
    this.eventSet = undefined;
    this.nvml.close();
    return true;
  }
}

/** The thread's main: loads the library, says whether it could, then answers requests in order. */
async function runNvmlThread(data: NvmlWorkerData): Promise<void> {
  const port = parentPort;
  if (port === null) return;
  const post = (message: NvmlMessage): void => port.postMessage(message);
  let nvml: NvmlLibrary;
  try {
    nvml = await NvmlLibrary.load(data.library);
  } catch (error) {
    post({ kind: 'unavailable', message: errorMessage(error) });
    port.close();
    return;
  }
  const progress = new Int32Array(data.progress);
  nvml.onCall = (index) => Atomics.store(progress, 0, index + 1);
  const thread = new NvmlThread(nvml, post);
  // Each request is answered synchronously, so they are answered one at a time, in arrival order.
  port.on('message', (request: NvmlRequest) => {
    thread.handle(request);
    if (request.kind === 'close') port.close();
  });
  post({ kind: 'ready', entryPoints: nvml.entryPoints() });
}

function isNvmlWorkerData(value: unknown): value is NvmlWorkerData {
  return typeof value === 'object' && value !== null && (value as { role?: unknown }).role === NVML_WORKER_ROLE;
}

// In the agent's bundle this module runs in every thread that loads the bundle: only the NVML
// worker (started by client.ts with this role) does anything here.
if (!isMainThread && isNvmlWorkerData(workerData)) void runNvmlThread(workerData);
