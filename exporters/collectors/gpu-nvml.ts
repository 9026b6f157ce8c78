import type { CollectorContext } from '../collector.js';
import type { GpuSourceChoice } from '../gpu-source.js';
import { cString, NVML, NvmlError, type NvmlDevice, type NvmlLibrary } from '../sources/nvml/library.js';
import { nvmlDeviceHandles, readNvmlDevice, type NvmlReadOptions } from '../sources/nvml/read.js';
import type { NvlinkErrorCount } from '../sources/nvlink-errors.js';
import type { GpuSample } from '../sources/nvidia-smi-xml.js';
import { NvmlXidEvents } from './gpu-nvml-events.js';

/**
 * The gpu collector's NVML source: one poll reads every GPU through the library in-process (a
 * few hundred calls of microseconds each, against nvidia-smi's 0.1 s and 70 ms of CPU per run),
 * under a time limit. A call stuck in the driver fails the poll as a timeout and holds no more
 * than its own pool thread; later polls fail at once, without queueing behind it, until it
 * returns. After the first good poll the source also listens for Xid events (gpu-nvml-events.ts).
 */

export interface NvmlPollResult {
  readonly driverVersion: string | undefined;
  readonly gpus: readonly GpuSample[];
  readonly nvlink: readonly NvlinkErrorCount[];
  /** Each GPU read this time, with its handle (handles stay valid while the library is loaded). */
  readonly devices: readonly { readonly device: NvmlDevice; readonly sample: GpuSample }[];
}

function timeoutError(message: string): Error {
  const error = new Error(message);
  error.name = 'TimeoutError';
  return error;
}

/**
 * Reads every GPU, or throws: a TimeoutError past `timeoutMs` or while an earlier call is still
 * stuck, an NvmlError when the library cannot be initialised or the GPUs cannot be counted. A
 * GPU whose handle or PCI bus id cannot be read is left out (it shows as not present).
 */
export async function pollNvml(
  nvml: NvmlLibrary,
  choice: GpuSourceChoice | undefined,
  timeoutMs: number,
  read: Omit<NvmlReadOptions, 'failed'>,
  processNames: Map<number, string | undefined>,
): Promise<NvmlPollResult> {
  const failed = (name: Parameters<NvmlReadOptions['failed']>[0], code: number): void => choice?.nvmlFailed(name, code);
  const work = async (): Promise<NvmlPollResult> => {
    const handles = await nvmlDeviceHandles(nvml, failed);
    const buffer = Buffer.alloc(81);
    const driverCode = await nvml.call('reads', 'nvmlSystemGetDriverVersion', buffer, 80);
    const driverVersion = driverCode === NVML.SUCCESS ? cString(buffer) : undefined;
    const devices: { device: NvmlDevice; sample: GpuSample }[] = [];
    const nvlink: NvlinkErrorCount[] = [];
    for (const { index, device } of handles) {
      try {
        const reading = await readNvmlDevice(nvml, device, index, driverVersion, { ...read, failed }, processNames);
        devices.push({ device, sample: reading.sample });
        nvlink.push(...reading.nvlink);
      } catch (error) {
        // Its PCI bus id cannot be read (or is not one): the GPU cannot be told apart, so it is left out.
        failed('nvmlDeviceGetPciInfo_v3', error instanceof NvmlError ? error.code : NVML.ERROR_UNKNOWN);
      }
    }
    return { driverVersion, gpus: devices.map(({ sample }) => sample), nvlink, devices };
  };
  return withNvmlDeadline(nvml, timeoutMs, work);
}

/**
 * Runs `work` (NVML calls in the reads lane) under a time limit: a TimeoutError past
 * `timeoutMs`, or at once while an earlier call has been stuck longer than that.
 */
export async function withNvmlDeadline<T>(nvml: NvmlLibrary, timeoutMs: number, work: () => Promise<T>): Promise<T> {
  const stuck = nvml.running('reads');
  if (stuck !== undefined && Date.now() - stuck.since > timeoutMs) {
    throw timeoutError(`NVML call ${stuck.name} has not returned for ${Math.round((Date.now() - stuck.since) / 1000)} s`);
  }
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const running = nvml.running('reads');
      reject(timeoutError(`NVML poll did not finish within ${timeoutMs} ms${running ? ` (stuck in ${running.name})` : ''}`));
    }, timeoutMs);
    timer.unref();
  });
  try {
    return await Promise.race([(async () => { await nvml.init(); return work(); })(), deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** What the gpu collector needs of a source (see gpu.ts), for NVML. */
export interface NvmlGpuSource {
  readonly description: string;
  readonly command: string;
  read(): Promise<{ gpus: readonly GpuSample[] }>;
  close(): Promise<void>;
}

export function nvmlGpuSource(context: CollectorContext, nvml: NvmlLibrary, choice: GpuSourceChoice, timeoutMs: number): NvmlGpuSource {
  // Process names by pid, kept while the pid holds a GPU (a name is one more call per process).
  let names = new Map<number, string | undefined>();
  let events: NvmlXidEvents | undefined;
  let closed = false;
  return {
    description: `NVML (${nvml.path})`,
    command: 'nvml',
    async read() {
      const fresh = new Map<number, string | undefined>();
      const previous = names;
      const result = await pollNvml(nvml, choice, timeoutMs, { processes: true }, previous);
      for (const sample of result.gpus) for (const process of sample.processes ?? []) fresh.set(process.pid, previous.get(process.pid) ?? process.name);
      names = fresh;
      if (events === undefined && !closed && result.devices.length > 0) {
        events = new NvmlXidEvents(context, nvml, choice);
        events.start(result.devices);
      }
      return { gpus: result.gpus };
    },
    async close() {
      closed = true;
      await events?.close();
    },
  };
}
