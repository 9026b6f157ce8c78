import { classifyXid } from '../../core/xid.js';
import type { CollectorContext } from '../collector.js';
import type { GpuSourceChoice } from '../gpu-source.js';
import { NVML, nvmlErrorName, type NvmlDevice, type NvmlLibrary } from '../sources/nvml/library.js';
import type { GpuSample } from '../sources/nvidia-smi-xml.js';
import { XidLedger } from '../xid-ledger.js';

/**
 * Xid events from NVML: an event set with nvmlEventTypeXidCriticalError registered on every GPU
 * that supports it, checked every 100 ms (the kernel log's follow interval) with
 * nvmlEventSetWait_v2 and no timeout, on a libuv pool thread in the library's `events` lane (never on
 * the event loop, never behind a poll). A wait that blocked would hold one of libuv's four pool
 * threads, which the agent's file reads share, for as long as it waited; a check that returns at
 * once holds it for microseconds.
 * Each Xid goes to the ledger shared with the kernel log (xid-ledger.ts): counted once in
 * steadfast_xid_errors_total and, when fatal, sent on the fast path once, whichever source
 * reports it first. NVML gives the code and the GPU, not the driver's message: a code whose
 * severity depends on the message (NVLink5 errors, Xid 154) is judged without it, and the kernel
 * log's line, where the agent can read it, still sends it when it turns out fatal.
 */

/** nvmlEventTypeXidCriticalError. */
const XID_CRITICAL_ERROR = 0x8n;
/** Between checks that found no event; events that did arrive are drained at once. */
const CHECK_EVERY_MS = 100;
/** After a failed wait, the loop pauses this long before the next (a lost GPU fails every wait). */
const RETRY_MS = 1_000;

/** nvmlEventData_t: device (pointer) @0, eventType (u64) @8, eventData (u64) @16, gpuInstanceId @24, computeInstanceId @28; 32 bytes. */
const EVENT_DATA_SIZE = 32;

export class NvmlXidEvents {
  private readonly ledger: XidLedger;
  private set: unknown;
  private loop: Promise<void> | undefined;
  private stopped = false;
  private lastFailure: string | undefined;
  private wake: (() => void) | undefined;

  constructor(
    private readonly context: CollectorContext,
    private readonly nvml: NvmlLibrary,
    private readonly choice: GpuSourceChoice,
  ) {
    this.ledger = context.xids ?? new XidLedger(context.registry);
  }

  /** Registers the GPUs read by the first poll, then waits for events until close(). */
  start(devices: readonly { readonly device: NvmlDevice; readonly sample: GpuSample }[]): void {
    this.loop = this.run(devices).catch((error: unknown) => {
      this.context.logger.warn({ collector: 'gpu', err: error }, 'NVML Xid events stopped');
    });
  }

  async close(): Promise<void> {
    this.stopped = true;
    this.wake?.();
    await this.loop;
  }

  private async run(devices: readonly { readonly device: NvmlDevice; readonly sample: GpuSample }[]): Promise<void> {
    const out: unknown[] = [null];
    const created = await this.nvml.call('events', 'nvmlEventSetCreate', out);
    if (created !== NVML.SUCCESS) {
      this.failed('nvmlEventSetCreate', created, 'no NVML Xid events: the event set cannot be made');
      return;
    }
    this.set = out[0];
    const byHandle = new Map<bigint, GpuSample>();
    try {
      for (const { device, sample } of devices) {
        const supported: unknown[] = [0n];
        const code = await this.nvml.call('events', 'nvmlDeviceGetSupportedEventTypes', device, supported);
        if (code !== NVML.SUCCESS || (BigInt(supported[0] as bigint) & XID_CRITICAL_ERROR) === 0n) continue;
        const registered = await this.nvml.call('events', 'nvmlDeviceRegisterEvents', device, XID_CRITICAL_ERROR, this.set);
        if (registered === NVML.SUCCESS) byHandle.set(BigInt(device), sample);
        else this.failed('nvmlDeviceRegisterEvents', registered, `no NVML Xid events for GPU ${sample.index}`);
      }
      if (byHandle.size === 0) {
        this.context.logger.info({ collector: 'gpu' }, 'no GPU offers NVML Xid events; Xids come from the kernel log only');
        return;
      }
      this.context.logger.info({ collector: 'gpu', gpus: byHandle.size }, 'listening for NVML Xid events');
      // Counted from the start: a node without Xids exports zeros only where the kernel log adds them.
      void this.ledger.counter;
      const data = Buffer.alloc(EVENT_DATA_SIZE);
      while (!this.stopped) {
        const code = await this.nvml.call('events', 'nvmlEventSetWait_v2', this.set, data, 0);
        if (code === NVML.SUCCESS) {
          this.lastFailure = undefined;
          this.handle(data, byHandle);
        } else if (code === NVML.ERROR_TIMEOUT) {
          await this.pause(CHECK_EVERY_MS);
        } else {
          this.failed('nvmlEventSetWait_v2', code, 'NVML event wait failed');
          await this.pause(RETRY_MS);
        }
      }
    } finally {
      await this.nvml.call('events', 'nvmlEventSetFree', this.set).catch(() => undefined);
    }
  }

  private handle(data: Buffer, byHandle: ReadonlyMap<bigint, GpuSample>): void {
    if ((data.readBigUInt64LE(8) & XID_CRITICAL_ERROR) === 0n) return;
    const sample = byHandle.get(data.readBigUInt64LE(0));
    const xid = Number(data.readBigUInt64LE(16));
    if (sample?.pciBusId === undefined || !Number.isSafeInteger(xid)) return;
    const { severity, meaning } = classifyXid(xid);
    const report = { pciBusId: sample.pciBusId, xid, severity };
    const { news, occurrence } = this.ledger.observe('nvml', report);
    if (!news || severity !== 'fatal') return;
    // NVML gives no driver text: the catalogue's words for the code, and where the report came from.
    const message = `${meaning} (NVML event, GPU ${sample.index})`;
    this.context.logger.error({ gpu: sample.pciBusId, xid, source: 'nvml' }, 'fatal Xid');
    occurrence.sentAs = 'fatal';
    this.context.fastPath({ kind: 'xid', node: this.context.node, gpu: sample.pciBusId, xid, message, time: new Date().toISOString() }, (outcome) => {
      if (outcome === 'delivered') occurrence.markDelivered();
    });
  }

  private failed(name: 'nvmlEventSetCreate' | 'nvmlDeviceRegisterEvents' | 'nvmlEventSetWait_v2', code: number, message: string): void {
    this.choice.nvmlFailed(name, code);
    const key = `${name}/${code}`;
    if (this.lastFailure === key) return;
    this.lastFailure = key;
    this.context.logger.warn({ collector: 'gpu', function: name, error: nvmlErrorName(code), detail: this.nvml.describe(code) }, message);
  }

  /** Waits `ms`, or until close(): the timer keeps nothing alive, and close() never waits on it. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wake = undefined;
        resolve();
      }, ms);
      timer.unref();
      this.wake = () => {
        clearTimeout(timer);
        this.wake = undefined;
        resolve();
      };
    });
  }
}
