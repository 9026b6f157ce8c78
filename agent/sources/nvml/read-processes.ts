import type { GpuProcess } from '../nvidia-smi-xml.js';
import { cString, NVML, type NvmlFunction, type NvmlLibrary } from './library.js';
import type { DeviceReads } from './device-reads.js';

/**
 * The processes on a GPU, as nvidia-smi lists them. Three generations of the call: _v3 (R510
 * and later) and _v2 (R460, R470) fill nvmlProcessInfo_v2_t (pid @0, usedGpuMemory (u64) @8,
 * gpuInstanceId @16, computeInstanceId @20; 24 bytes), the unsuffixed v1 (older) fills
 * nvmlProcessInfo_v1_t (pid @0, usedGpuMemory @8; 16 bytes). The newest the library exports is
 * used; which one is reported at start (NVML_ENTRY_POINTS in library.ts).
 */

const COMPUTE = [
  { name: 'nvmlDeviceGetComputeRunningProcesses_v3', size: 24 },
  { name: 'nvmlDeviceGetComputeRunningProcesses_v2', size: 24 },
  { name: 'nvmlDeviceGetComputeRunningProcesses', size: 16 },
] as const;
const GRAPHICS = [
  { name: 'nvmlDeviceGetGraphicsRunningProcesses_v3', size: 24 },
  { name: 'nvmlDeviceGetGraphicsRunningProcesses_v2', size: 24 },
  { name: 'nvmlDeviceGetGraphicsRunningProcesses', size: 16 },
] as const;

/** NVML_VALUE_NOT_AVAILABLE in usedGpuMemory (no permission, or MIG) and in the instance ids (MIG off). */
const NOT_AVAILABLE_64 = 0xffff_ffff_ffff_ffffn;
const NOT_AVAILABLE_32 = 0xffff_ffff;

function readProcessList(reads: DeviceReads, generations: readonly { readonly name: NvmlFunction; readonly size: number }[]): GpuProcess[] | undefined {
  const call = generations.find(({ name }) => reads.nvml.has(name));
  if (call === undefined) return undefined;
  const { name, size } = call;
  let room = 64;
  for (let attempt = 0; attempt < 3; attempt++) {
    const count = [room];
    const infos = Buffer.alloc(room * size);
    const code = reads.nvmlCode(name, [NVML.ERROR_INSUFFICIENT_SIZE], count, infos);
    if (code === NVML.ERROR_INSUFFICIENT_SIZE) {
      // Processes started between the calls: make room for them and a few more.
      room = Number(count[0]) + 16;
      continue;
    }
    if (code !== NVML.SUCCESS) return undefined;
    const processes: GpuProcess[] = [];
    for (let index = 0; index < Math.min(Number(count[0]), room); index++) {
      const at = index * size;
      const used = infos.readBigUInt64LE(at + 8);
      const gpuInstance = size === 24 ? infos.readUInt32LE(at + 16) : NOT_AVAILABLE_32;
      const computeInstance = size === 24 ? infos.readUInt32LE(at + 20) : NOT_AVAILABLE_32;
      processes.push({
        pid: infos.readUInt32LE(at),
        usedMemoryBytes: used === NOT_AVAILABLE_64 ? undefined : Number(used),
        gpuInstance: gpuInstance === NOT_AVAILABLE_32 ? undefined : gpuInstance,
        computeInstance: computeInstance === NOT_AVAILABLE_32 ? undefined : computeInstance,
      });
    }
    return processes;
  }
  return undefined;
}

/** Compute (C) and graphics (G) processes merged by pid (C+G), named as nvidia-smi names them. */
export function readProcesses(reads: DeviceReads, nvml: NvmlLibrary, names: Map<number, string | undefined>): GpuProcess[] | undefined {
  const compute = readProcessList(reads, COMPUTE);
  const graphics = readProcessList(reads, GRAPHICS);
  if (compute === undefined && graphics === undefined) return undefined;
  const byPid = new Map<number, GpuProcess>();
  for (const [list, type] of [
    [compute ?? [], 'C'],
    [graphics ?? [], 'G'],
  ] as const) {
    for (const process of list) {
      const seen = byPid.get(process.pid);
      byPid.set(process.pid, seen === undefined ? { ...process, type } : { ...seen, type: 'C+G' });
    }
  }
  const processes: GpuProcess[] = [];
  for (const process of byPid.values()) {
    if (!names.has(process.pid)) {
      const buffer = Buffer.alloc(256);
      const code = nvml.call('nvmlSystemGetProcessName', process.pid, buffer, buffer.length);
      names.set(process.pid, code === NVML.SUCCESS ? cString(buffer) : undefined);
    }
    processes.push({ ...process, name: names.get(process.pid) });
  }
  return processes;
}
