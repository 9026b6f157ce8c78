import type { EccCount, EccScope, EccType } from '../nvidia-smi-xml.js';
import { NVML } from './library.js';
import type { DeviceReads } from './device-reads.js';

/**
 * ECC counters through nvmlDeviceGetMemoryErrorCounter, in the layout and order of
 * `nvidia-smi -q -x`: Turing and later count errors in two places, SRAM and DRAM (the v12+ XML's
 * sram_/dram_ elements); earlier GPUs per memory unit (single_bit/double_bit per unit).
 *
 * The layout is decided by the GPU's architecture (nvmlDeviceGetArchitecture), not by probing a
 * counter: with MIG on, nvml.h says volatile counters cannot be read through the GPU's handle, so
 * a probe of one would take an A100 or H100 for a pre-Turing GPU. There the volatile counters are
 * left out (as nvidia-smi shows them N/A), the aggregate ones are read as usual, and each MIG
 * device's volatile uncorrectable SRAM count, the one counter nvml.h lets a MIG device handle
 * answer, is read through that handle, labelled with its GPU and compute instance.
 */

/** nvmlMemoryLocation_t. */
const LOCATION_SRAM = 7;
const LOCATION_DRAM = 2;
/** Before SRAM was a location (pre-Turing): each memory unit, under the name the old XML schema gives it. */
const OLD_LOCATIONS: readonly { readonly location: number; readonly name: string }[] = [
  { location: 2, name: 'device_memory' },
  { location: 3, name: 'register_file' },
  { location: 0, name: 'l1_cache' },
  { location: 1, name: 'l2_cache' },
  { location: 4, name: 'texture_memory' },
  { location: 5, name: 'texture_shm' },
  { location: 6, name: 'cbu' },
];
/** nvmlDeviceArchitecture_t: Turing is where SRAM and DRAM became locations (nvml.h: "Turing+"); 0xffffffff is "presumably something newer". */
const ARCH_TURING = 6;

type Counter = (type: EccType, scope: EccScope, location: number) => number | undefined;

export function readEcc(reads: DeviceReads, migEnabled: boolean | undefined): EccCount[] {
  // Each counter read once: a layout probe's read is the loop's first.
  const read = new Map<string, number | undefined>();
  const count: Counter = (type, scope, location) => {
    const key = `${type}/${scope}/${location}`;
    if (!read.has(key)) {
      const value = reads.ull('nvmlDeviceGetMemoryErrorCounter', type === 'correctable' ? 0 : 1, scope === 'volatile' ? 0 : 1, location);
      read.set(key, value === undefined ? undefined : Number(value));
    }
    return read.get(key);
  };
  const mig = migEnabled === true;
  const modern = splitsSramAndDram(reads, count, mig);
  const counts: EccCount[] = [];
  // In the XML's order: modern GPUs by location then type (sram_correctable, sram_uncorrectable,
  // dram_…), older ones by type then memory unit (single_bit/<unit>, double_bit/<unit>).
  for (const scope of mig ? (['aggregate'] as const) : (['volatile', 'aggregate'] as const)) {
    if (modern) {
      for (const [location, name] of [
        [LOCATION_SRAM, 'sram'],
        [LOCATION_DRAM, 'dram'],
      ] as const) {
        for (const type of ['correctable', 'uncorrectable'] as const) {
          const value = count(type, scope, location);
          if (value !== undefined) counts.push({ scope, type, location: name, count: value });
        }
      }
      continue;
    }
    for (const type of ['correctable', 'uncorrectable'] as const) {
      for (const { location, name } of OLD_LOCATIONS) {
        const value = count(type, scope, location);
        if (value !== undefined) counts.push({ scope, type, location: name, count: value });
      }
    }
  }
  if (mig) counts.push(...readMigDeviceEcc(reads));
  return counts;
}

/**
 * Whether the GPU counts by SRAM/DRAM: by its architecture, or where the driver cannot say (an
 * old driver without the call), by whether the aggregate SRAM counter answers (it does with MIG
 * on), then the volatile one (MIG off).
 */
function splitsSramAndDram(reads: DeviceReads, count: Counter, mig: boolean): boolean {
  const architecture = reads.uint('nvmlDeviceGetArchitecture');
  if (architecture !== undefined) return architecture >= ARCH_TURING;
  if (count('correctable', 'aggregate', LOCATION_SRAM) !== undefined) return true;
  return !mig && count('correctable', 'volatile', LOCATION_SRAM) !== undefined;
}

/** Each MIG device's volatile uncorrectable SRAM count, through its own handle. */
function readMigDeviceEcc(reads: DeviceReads): EccCount[] {
  const slots = reads.uint('nvmlDeviceGetMaxMigDeviceCount') ?? 0;
  const counts: EccCount[] = [];
  for (let slot = 0; slot < slots; slot++) {
    const handle: unknown[] = [null];
    // NOT_FOUND: no MIG device in this slot.
    if (reads.nvmlCode('nvmlDeviceGetMigDeviceHandleByIndex', [NVML.ERROR_NOT_FOUND], slot, handle) !== NVML.SUCCESS) continue;
    const mig = reads.on(handle[0] as bigint);
    const value = mig.ull('nvmlDeviceGetMemoryErrorCounter', 1, 0, LOCATION_SRAM);
    if (value === undefined) continue;
    counts.push({
      scope: 'volatile',
      type: 'uncorrectable',
      location: 'sram',
      count: Number(value),
      gpuInstance: mig.uint('nvmlDeviceGetGpuInstanceId'),
      computeInstance: mig.uint('nvmlDeviceGetComputeInstanceId'),
    });
  }
  return counts;
}
