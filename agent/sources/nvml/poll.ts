import type { NvlinkErrorCount } from '../nvlink-errors.js';
import type { GpuSample } from '../nvidia-smi-xml.js';
import { cString, NVML, NvmlError, type NvmlDevice, type NvmlFunction, type NvmlLibrary } from './library.js';
import { readDeviceNvlink, readNvmlDevice, type NvmlReadOptions } from './read.js';

/** What one NVML poll reads of every GPU (read.ts reads one), as the NVML thread runs it. */

export interface NvmlPollValue {
  readonly driverVersion: string | undefined;
  readonly gpus: readonly GpuSample[];
  readonly nvlink: readonly NvlinkErrorCount[];
}

/**
 * Every GPU's handle, by index. Throws when the GPUs cannot be counted; a handle NVML cannot
 * give (a GPU lost, `gpu_is_lost`) is counted and left out, so that GPU shows as not present.
 */
export function nvmlDeviceHandles(nvml: NvmlLibrary, failed: NvmlReadOptions['failed']): { index: number; device: NvmlDevice }[] {
  const count = [0];
  const code = nvml.call('nvmlDeviceGetCount_v2', count);
  if (code !== NVML.SUCCESS) throw nvml.error('nvmlDeviceGetCount_v2', code);
  const handles: { index: number; device: NvmlDevice }[] = [];
  for (let index = 0; index < Number(count[0]); index++) {
    const handle: unknown[] = [null];
    const handleCode = nvml.call('nvmlDeviceGetHandleByIndex_v2', index, handle);
    if (handleCode === NVML.SUCCESS) handles.push({ index, device: handle[0] as NvmlDevice });
    else failed('nvmlDeviceGetHandleByIndex_v2', handleCode);
  }
  return handles;
}

/**
 * One poll: every GPU that can be told apart, and the handles of those read (for the Xid
 * events). `names` keeps process names across polls; it is left holding the current pids' only.
 */
export function readNvmlPoll(
  nvml: NvmlLibrary,
  options: NvmlReadOptions,
  names: Map<number, string | undefined>,
): NvmlPollValue & { devices: Map<bigint, GpuSample> } {
  const handles = nvmlDeviceHandles(nvml, options.failed);
  const buffer = Buffer.alloc(81);
  const driverVersion = nvml.call('nvmlSystemGetDriverVersion', buffer, 80) === NVML.SUCCESS ? cString(buffer) : undefined;
  const gpus: GpuSample[] = [];
  const counts: NvlinkErrorCount[] = [];
  const devices = new Map<bigint, GpuSample>();
  const current = new Set<number>();
  for (const { index, device } of handles) {
    try {
      const reading = readNvmlDevice(nvml, device, index, driverVersion, { processes: true, ...options }, names);
      gpus.push(reading.sample);
      counts.push(...reading.nvlink);
      devices.set(BigInt(device), reading.sample);
      for (const process of reading.sample.processes ?? []) current.add(process.pid);
    } catch (error) {
      // Lost, or its PCI bus id cannot be read (or is not one): left out, counted once under the
      // call that said so. Anything else is not NVML's answer but a fault here: the poll fails.
      if (!(error instanceof NvmlError)) throw error;
      options.failed(error.functionName as NvmlFunction, error.code);
    }
  }
  for (const pid of names.keys()) if (!current.has(pid)) names.delete(pid);
  return { driverVersion, gpus, nvlink: counts, devices };
}

/** The NVLink error counters of every GPU, alone (the nvlink collector). */
export function readNvmlNvlink(nvml: NvmlLibrary, failed: NvmlReadOptions['failed']): NvlinkErrorCount[] {
  const counts: NvlinkErrorCount[] = [];
  for (const { index, device } of nvmlDeviceHandles(nvml, failed)) {
    try {
      counts.push(...readDeviceNvlink(nvml, device, index, failed));
    } catch (error) {
      // A lost GPU has no links to count; the gpu collector shows it as not present.
      if (!(error instanceof NvmlError)) throw error;
      failed(error.functionName as NvmlFunction, error.code);
    }
  }
  return counts;
}
