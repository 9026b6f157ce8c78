import { normalizePciBusId } from '../../../core/pci.js';
import { CLOCK_EVENT_BITS, XML_REASON_ORDER } from '../clock-event-reasons.js';
import type { NvlinkErrorCount } from '../nvlink-errors.js';
import type {
  ClockDomain,
  ClockReadings,
  EccCount,
  EccScope,
  EccType,
  FabricState,
  GpuProcess,
  GpuSample,
  RemappedRows,
  RetiredPages,
} from '../nvidia-smi-xml.js';
import { cString, NVML, type NvmlDevice, type NvmlFunction, type NvmlLibrary } from './library.js';

/**
 * Reads through NVML what `nvidia-smi -q -x` reports, into the same GpuSample the XML parser
 * makes, in the same units and under the same names: nvidia-smi is itself an NVML client, so each
 * value below is the one it prints (nvml.h names the call; the XML element is noted where the
 * mapping is not plain). A value the GPU does not support (NVML_ERROR_NOT_SUPPORTED, or an entry
 * point the driver lacks) is undefined, as `N/A` is in the XML; any other failure is undefined too
 * and is handed to `failed`, which counts it.
 */

export interface NvmlReadOptions {
  /** Reads the NVLink error counters too (the nvlink collector's series). */
  readonly nvlink?: boolean | undefined;
  /** Reads the processes on each GPU, and their names. */
  readonly processes?: boolean | undefined;
  /** A call that failed for another reason than "not supported". */
  readonly failed: (name: NvmlFunction, code: number) => void;
}

/** NVML_FI_DEV_MEMORY_TEMP: HBM temperature, `<temperature><memory_temp>`. */
const FIELD_MEMORY_TEMP = 82;
/** NVML_VALUE_NOT_AVAILABLE in nvmlProcessInfo_t.usedGpuMemory (no permission, or MIG). */
const NOT_AVAILABLE_64 = 0xffff_ffff_ffff_ffffn;
const NOT_AVAILABLE_32 = 0xffff_ffff;
const NVLINK_MAX_LINKS = 18;

/** nvmlClockType_t, in the order of `<clocks>`. */
const CLOCKS: readonly { readonly type: number; readonly domain: ClockDomain }[] = [
  { type: 0, domain: 'graphics' },
  { type: 1, domain: 'sm' },
  { type: 2, domain: 'memory' },
  { type: 3, domain: 'video' },
];

/** The reasons by bit, in the order the XML lists them. */
const CLOCK_REASONS = XML_REASON_ORDER.map((reason) => {
  const entry = CLOCK_EVENT_BITS.find((candidate) => candidate.reason === reason);
  return { bit: BigInt(entry?.bit ?? 0), name: reason };
});

/** nvmlMemoryLocation_t. Ampere and later count ECC in two places, SRAM and DRAM, as the v12+ XML does. */
const LOCATION_SRAM = 7;
const LOCATION_DRAM = 2;
/** Before SRAM was a location (pre-Ampere): each memory unit, under the name the old XML schema gives it. */
const OLD_LOCATIONS: readonly { readonly location: number; readonly name: string }[] = [
  { location: 2, name: 'device_memory' },
  { location: 3, name: 'register_file' },
  { location: 0, name: 'l1_cache' },
  { location: 1, name: 'l2_cache' },
  { location: 4, name: 'texture_memory' },
  { location: 5, name: 'texture_shm' },
  { location: 6, name: 'cbu' },
];

/** nvmlGpuFabricState_t 1..3, as `<fabric><state>` spells them in snake case. */
const FABRIC_STATES: Readonly<Record<number, string>> = { 1: 'not_started', 2: 'in_progress', 3: 'completed' };

/** nvmlNvLinkErrorCounter_t, under the names `nvidia-smi nvlink -e` prints (Replay, Recovery, CRC). */
const NVLINK_COUNTERS: readonly { readonly counter: number; readonly type: string }[] = [
  { counter: 0, type: 'replay' },
  { counter: 1, type: 'recovery' },
  { counter: 2, type: 'crc' },
];

/** The calls for one device, each turned into a value or undefined. */
class DeviceReads {
  constructor(
    private readonly nvml: NvmlLibrary,
    private readonly device: NvmlDevice,
    private readonly options: NvmlReadOptions,
  ) {}

  /** Calls `name`; whether it succeeded (a failure other than "not supported" is counted). */
  ok(name: NvmlFunction, ...args: unknown[]): boolean {
    return this.nvmlCode(name, [], ...args) === NVML.SUCCESS;
  }

  /** Calls `name` and answers its code; codes other than success, "not supported" and `usual` are counted. */
  nvmlCode(name: NvmlFunction, usual: readonly number[], ...args: unknown[]): number {
    const code = this.nvml.call(name, this.device, ...args);
    if (code !== NVML.SUCCESS && code !== NVML.ERROR_NOT_SUPPORTED && code !== NVML.ERROR_FUNCTION_NOT_FOUND && !usual.includes(code))
      this.options.failed(name, code);
    return code;
  }

  uint(name: NvmlFunction, ...args: unknown[]): number | undefined {
    const out = [0];
    return this.ok(name, ...args, out) ? Number(out[0]) : undefined;
  }

  ull(name: NvmlFunction, ...args: unknown[]): bigint | undefined {
    const out: unknown[] = [0n];
    return this.ok(name, ...args, out) ? BigInt(out[0] as bigint | number) : undefined;
  }

  text(name: NvmlFunction, length: number): string | undefined {
    const buffer = Buffer.alloc(length);
    return this.ok(name, buffer, length) ? cString(buffer) : undefined;
  }
}

function readEcc(reads: DeviceReads): EccCount[] {
  const counts: EccCount[] = [];
  // Each counter read once: the probe below is the first of the loop's reads on a modern GPU.
  const read = new Map<string, number | undefined>();
  const count = (type: EccType, scope: EccScope, location: number): number | undefined => {
    const key = `${type}/${scope}/${location}`;
    if (!read.has(key)) {
      const value = reads.ull('nvmlDeviceGetMemoryErrorCounter', type === 'correctable' ? 0 : 1, scope === 'volatile' ? 0 : 1, location);
      read.set(key, value === undefined ? undefined : Number(value));
    }
    return read.get(key);
  };
  // A GPU that knows SRAM as a location reports the v12 pair; an older one its memory units.
  const modern = count('correctable', 'volatile', LOCATION_SRAM) !== undefined;
  // In the XML's order: modern GPUs by location then type (sram_correctable, sram_uncorrectable,
  // dram_…), older ones by type then memory unit (single_bit/<unit>, double_bit/<unit>).
  for (const scope of ['volatile', 'aggregate'] as const) {
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
  return counts;
}

function readRemappedRows(reads: DeviceReads): RemappedRows | undefined {
  const corrected = [0];
  const uncorrected = [0];
  const pending = [0];
  const failure = [0];
  if (!reads.ok('nvmlDeviceGetRemappedRows', corrected, uncorrected, pending, failure)) return undefined;
  return { correctable: Number(corrected[0]), uncorrectable: Number(uncorrected[0]), pending: pending[0] !== 0, failure: failure[0] !== 0 };
}

function readRetiredPages(reads: DeviceReads): RetiredPages | undefined {
  const retired = (cause: number): number | undefined => {
    // A zero-sized query: the count comes back with INSUFFICIENT_SIZE when there are pages.
    const count = [0];
    const code = reads.nvmlCode('nvmlDeviceGetRetiredPages', [NVML.ERROR_INSUFFICIENT_SIZE], cause, count, null);
    return code === NVML.SUCCESS || code === NVML.ERROR_INSUFFICIENT_SIZE ? Number(count[0]) : undefined;
  };
  const pendingFlag = reads.uint('nvmlDeviceGetRetiredPagesPendingStatus');
  const pages: RetiredPages = {
    singleBit: retired(0),
    doubleBit: retired(1),
    pending: pendingFlag === undefined ? undefined : pendingFlag !== 0,
  };
  return Object.values(pages).every((value) => value === undefined) ? undefined : pages;
}

function readClocks(reads: DeviceReads, name: 'nvmlDeviceGetClockInfo' | 'nvmlDeviceGetMaxClockInfo'): ClockReadings | undefined {
  const readings: Partial<Record<ClockDomain, number>> = {};
  for (const { type, domain } of CLOCKS) {
    const mhz = reads.uint(name, type);
    if (mhz !== undefined) readings[domain] = mhz * 1e6;
  }
  return Object.keys(readings).length === 0 ? undefined : readings;
}

/** The reasons the GPU supports, each active or not; nvidia-smi prints N/A for the rest. */
function readClockReasons(reads: DeviceReads, nvml: NvmlLibrary): Record<string, boolean> | undefined {
  const newNames = nvml.has('nvmlDeviceGetCurrentClocksEventReasons');
  const current = reads.ull(newNames ? 'nvmlDeviceGetCurrentClocksEventReasons' : 'nvmlDeviceGetCurrentClocksThrottleReasons');
  if (current === undefined) return undefined;
  const supported = reads.ull(newNames ? 'nvmlDeviceGetSupportedClocksEventReasons' : 'nvmlDeviceGetSupportedClocksThrottleReasons');
  const reasons: Record<string, boolean> = {};
  for (const { bit, name } of CLOCK_REASONS) {
    if (supported === undefined || (supported & bit) !== 0n) reasons[name] = (current & bit) !== 0n;
  }
  return reasons;
}

/** nvmlGpuFabricInfo_t: clusterUuid[16] @0, status (nvmlReturn_t) @16, cliqueId @20, state (uint8) @24; 28 bytes. */
function readFabric(reads: DeviceReads): FabricState | undefined {
  const info = Buffer.alloc(32);
  if (!reads.ok('nvmlDeviceGetGpuFabricInfo', info)) return undefined;
  const state = FABRIC_STATES[info.readUInt8(24)];
  if (state === undefined) return undefined;
  // The status is the fabric manager's verdict once registration has ended.
  return { state, success: state === 'completed' ? info.readInt32LE(16) === NVML.SUCCESS : undefined };
}

/** nvmlProcessInfo_t: pid @0, usedGpuMemory (u64) @8, gpuInstanceId @16, computeInstanceId @20; 24 bytes. */
const PROCESS_INFO_SIZE = 24;

function readProcessList(
  reads: DeviceReads,
  name: 'nvmlDeviceGetComputeRunningProcesses_v3' | 'nvmlDeviceGetGraphicsRunningProcesses_v3',
): GpuProcess[] | undefined {
  let room = 64;
  for (let attempt = 0; attempt < 3; attempt++) {
    const count = [room];
    const infos = Buffer.alloc(room * PROCESS_INFO_SIZE);
    const code = reads.nvmlCode(name, [NVML.ERROR_INSUFFICIENT_SIZE], count, infos);
    if (code === NVML.ERROR_INSUFFICIENT_SIZE) {
      // Processes started between the calls: make room for them and a few more.
      room = Number(count[0]) + 16;
      continue;
    }
    if (code !== NVML.SUCCESS) return undefined;
    const processes: GpuProcess[] = [];
    for (let index = 0; index < Math.min(Number(count[0]), room); index++) {
      const at = index * PROCESS_INFO_SIZE;
      const used = infos.readBigUInt64LE(at + 8);
      const gpuInstance = infos.readUInt32LE(at + 16);
      const computeInstance = infos.readUInt32LE(at + 20);
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
function readProcesses(reads: DeviceReads, nvml: NvmlLibrary, names: Map<number, string | undefined>): GpuProcess[] | undefined {
  const compute = readProcessList(reads, 'nvmlDeviceGetComputeRunningProcesses_v3');
  const graphics = readProcessList(reads, 'nvmlDeviceGetGraphicsRunningProcesses_v3');
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

/** NVLink error counters of the active links. */
function readNvlink(reads: DeviceReads, gpu: number, uuid: string | undefined): NvlinkErrorCount[] {
  const counts: NvlinkErrorCount[] = [];
  for (let link = 0; link < NVLINK_MAX_LINKS; link++) {
    const active = [0];
    const code = reads.nvmlCode('nvmlDeviceGetNvLinkState', [NVML.ERROR_INVALID_ARGUMENT], link, active);
    // INVALID_ARGUMENT: past the GPU's last link; NOT_SUPPORTED: no NVLink at all.
    if (code === NVML.ERROR_INVALID_ARGUMENT || code === NVML.ERROR_NOT_SUPPORTED) break;
    if (code !== NVML.SUCCESS || active[0] === 0) continue;
    for (const { counter, type } of NVLINK_COUNTERS) {
      const value = reads.ull('nvmlDeviceGetNvLinkErrorCounter', link, counter);
      if (value !== undefined) counts.push({ gpu, uuid, link, type, count: Number(value) });
    }
  }
  return counts;
}

export interface NvmlDeviceReading {
  readonly sample: GpuSample;
  readonly nvlink: readonly NvlinkErrorCount[];
}

/**
 * One device. Throws when it cannot be told apart (no PCI bus id): such a GPU is left out of the
 * poll, as nvidia-smi leaves out a GPU it cannot reach, and shows as not present.
 */
export function readNvmlDevice(
  nvml: NvmlLibrary,
  device: NvmlDevice,
  position: number,
  driverVersion: string | undefined,
  options: NvmlReadOptions,
  processNames: Map<number, string | undefined>,
): NvmlDeviceReading {
  const reads = new DeviceReads(nvml, device, options);
  const pci = Buffer.alloc(68); // nvmlPciInfo_t: busIdLegacy[16], domain, bus, device, pciDeviceId, pciSubSystemId, busId[32] @36
  const pciCode = nvml.call('nvmlDeviceGetPciInfo_v3', device, pci);
  if (pciCode !== NVML.SUCCESS) throw nvml.error('nvmlDeviceGetPciInfo_v3', pciCode);
  const pciBusId = normalizePciBusId(cString(pci.subarray(36, 68)));
  if (pciBusId === undefined) throw new Error(`NVML device #${position} has no valid PCI bus id ("${cString(pci.subarray(36, 68))}")`);
  const minor = reads.uint('nvmlDeviceGetMinorNumber');
  const uuid = reads.text('nvmlDeviceGetUUID', 96);
  const migCurrent = [0];
  const migKnown = reads.ok('nvmlDeviceGetMigMode', migCurrent, [0]);
  const memoryTemp = readField(reads, FIELD_MEMORY_TEMP);
  const power = reads.uint('nvmlDeviceGetPowerUsage');
  const powerLimit = reads.uint('nvmlDeviceGetEnforcedPowerLimit');
  const utilization = Buffer.alloc(8);
  const utilizationKnown = reads.ok('nvmlDeviceGetUtilizationRates', utilization);
  const memory = readMemory(reads, nvml);
  const sample: GpuSample = {
    index: minor ?? position,
    pciBusId,
    uuid,
    productName: reads.text('nvmlDeviceGetName', 96),
    driverVersion,
    migEnabled: migKnown ? migCurrent[0] === 1 : undefined,
    temperatureCelsius: reads.uint('nvmlDeviceGetTemperature', 0),
    memoryTemperatureCelsius: memoryTemp,
    powerDrawWatts: power === undefined ? undefined : power / 1000,
    powerLimitWatts: powerLimit === undefined ? undefined : powerLimit / 1000,
    utilizationRatio: utilizationKnown ? utilization.readUInt32LE(0) / 100 : undefined,
    memoryUsedBytes: memory?.used,
    memoryTotalBytes: memory?.total,
    ecc: readEcc(reads),
    remappedRows: readRemappedRows(reads),
    retiredPages: readRetiredPages(reads),
    pcieLinkGeneration: reads.uint('nvmlDeviceGetCurrPcieLinkGeneration'),
    pcieLinkWidth: reads.uint('nvmlDeviceGetCurrPcieLinkWidth'),
    pcieReplayErrors: reads.uint('nvmlDeviceGetPcieReplayCounter'),
    clocks: readClocks(reads, 'nvmlDeviceGetClockInfo'),
    maxClocks: readClocks(reads, 'nvmlDeviceGetMaxClockInfo'),
    throttleReasons: readClockReasons(reads, nvml),
    fabric: readFabric(reads),
    processes: options.processes ? readProcesses(reads, nvml, processNames) : undefined,
  };
  const nvlink = options.nvlink ? readNvlink(reads, sample.index, uuid) : [];
  return { sample, nvlink };
}

/** nvmlFieldValue_t: fieldId @0, scopeId @4, timestamp @8, latencyUsec @16, valueType @24, nvmlReturn @28, value @32; 40 bytes. */
function readField(reads: DeviceReads, fieldId: number): number | undefined {
  const field = Buffer.alloc(40);
  field.writeUInt32LE(fieldId, 0);
  if (!reads.ok('nvmlDeviceGetFieldValues', 1, field)) return undefined;
  if (field.readInt32LE(28) !== NVML.SUCCESS) return undefined;
  // nvmlValueType_t: 0 double, 1 uint, 2 ulong, 3 ulonglong, 4 longlong, 5 int, 6 ushort.
  switch (field.readInt32LE(24)) {
    case 0:
      return field.readDoubleLE(32);
    case 1:
      return field.readUInt32LE(32);
    case 2:
    case 3:
      return Number(field.readBigUInt64LE(32));
    case 4:
      return Number(field.readBigInt64LE(32));
    case 5:
      return field.readInt32LE(32);
    case 6:
      return field.readUInt16LE(32);
    default:
      return undefined;
  }
}

/**
 * nvmlMemory_v2_t (version @0, total @8, reserved @16, free @24, used @32; 40 bytes): `used`
 * without the driver's reservation, as `<fb_memory_usage><used>` shows it since driver 510.
 * Drivers without it: nvmlMemory_t (total @0, free @8, used @16), whose used includes it.
 */
function readMemory(reads: DeviceReads, nvml: NvmlLibrary): { total: number; used: number } | undefined {
  if (nvml.has('nvmlDeviceGetMemoryInfo_v2')) {
    const memory = Buffer.alloc(40);
    memory.writeUInt32LE(40 | (2 << 24), 0);
    if (reads.ok('nvmlDeviceGetMemoryInfo_v2', memory)) {
      return { total: Number(memory.readBigUInt64LE(8)), used: Number(memory.readBigUInt64LE(32)) };
    }
    return undefined;
  }
  const memory = Buffer.alloc(24);
  if (!reads.ok('nvmlDeviceGetMemoryInfo', memory)) return undefined;
  return { total: Number(memory.readBigUInt64LE(0)), used: Number(memory.readBigUInt64LE(16)) };
}

/**
 * One GPU's NVLink error counters, alone (the nvlink collector): the GPU's index is its minor
 * number, as `nvidia-smi nvlink -e` numbers GPUs, and its UUID.
 */
export function readDeviceNvlink(nvml: NvmlLibrary, device: NvmlDevice, position: number, failed: NvmlReadOptions['failed']): NvlinkErrorCount[] {
  const reads = new DeviceReads(nvml, device, { failed });
  const minor = reads.uint('nvmlDeviceGetMinorNumber');
  return readNvlink(reads, minor ?? position, reads.text('nvmlDeviceGetUUID', 96));
}
