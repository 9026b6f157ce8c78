import { normalizePciBusId } from '../../../core/pci.js';
import { CLOCK_EVENT_BITS, XML_REASON_ORDER } from '../clock-event-reasons.js';
import type { NvlinkErrorCount } from '../nvlink-errors.js';
import type { ClockDomain, ClockReadings, FabricState, GpuSample, RemappedRows, RetiredPages } from '../nvidia-smi-xml.js';
import { DeviceReads, structVersion, type NvmlReadOptions } from './device-reads.js';
import { cString, NVML, NvmlError, type NvmlDevice, type NvmlLibrary } from './library.js';
import { readEcc } from './read-ecc.js';
import { readProcesses } from './read-processes.js';

export type { NvmlReadOptions } from './device-reads.js';

/**
 * Reads through NVML what `nvidia-smi -q -x` reports, into the same GpuSample the XML parser
 * makes, in the same units and under the same names: nvidia-smi is itself an NVML client, so each
 * value below is the one it prints (nvml.h names the call; the XML element is noted where the
 * mapping is not plain). A value the GPU does not support (NVML_ERROR_NOT_SUPPORTED, or an entry
 * point the driver lacks) is undefined, as `N/A` is in the XML; any other failure is undefined too
 * and is handed to `failed`, which counts it. A GPU that answers NVML_ERROR_GPU_IS_LOST to any call
 * is not read further (GpuLostError).
 */

/** NVML_FI_DEV_MEMORY_TEMP: HBM temperature, `<temperature><memory_temp>`. */
const FIELD_MEMORY_TEMP = 82;
/** NVML_NVLINK_MAX_LINKS in nvml.h 13 (18 in 12, 12 in 11). */
const NVLINK_MAX_LINKS = 36;

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

/** nvmlGpuFabricState_t 1..3, as `<fabric><state>` spells them in snake case. */
const FABRIC_STATES: Readonly<Record<number, string>> = { 1: 'not_started', 2: 'in_progress', 3: 'completed' };

/** nvmlNvLinkErrorCounter_t, under the names `nvidia-smi nvlink -e` prints (Replay, Recovery, CRC). */
const NVLINK_COUNTERS: readonly { readonly counter: number; readonly type: string }[] = [
  { counter: 0, type: 'replay' },
  { counter: 1, type: 'recovery' },
  { counter: 2, type: 'crc' },
];

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

/**
 * The GPU's NVLink fabric registration (NVSwitch systems). nvmlDeviceGetGpuFabricInfoV where the
 * driver has it, version 3 then 2: version @0, clusterUuid[16] @4, status (nvmlReturn_t) @20,
 * cliqueId @24, state (uint8) @28, healthMask @32 (v2: 36 bytes), healthSummary @36 (v3: 40);
 * else the deprecated nvmlDeviceGetGpuFabricInfo: clusterUuid[16] @0, status @16, cliqueId @20,
 * state @24; 28 bytes.
 */
function readFabric(reads: DeviceReads): FabricState | undefined {
  if (reads.nvml.has('nvmlDeviceGetGpuFabricInfoV')) {
    for (const [version, size] of [
      [3, 40],
      [2, 36],
    ] as const) {
      const info = Buffer.alloc(40);
      info.writeUInt32LE(structVersion(size, version), 0);
      const code = reads.attempt('nvmlDeviceGetGpuFabricInfoV', info);
      if (code === NVML.SUCCESS) return fabricState(info.readUInt8(28), info.readInt32LE(20));
      if (code !== NVML.ERROR_ARGUMENT_VERSION_MISMATCH) {
        reads.count('nvmlDeviceGetGpuFabricInfoV', code);
        return undefined;
      }
    }
  }
  const info = Buffer.alloc(32);
  if (!reads.ok('nvmlDeviceGetGpuFabricInfo', info)) return undefined;
  return fabricState(info.readUInt8(24), info.readInt32LE(16));
}

function fabricState(code: number, status: number): FabricState | undefined {
  const state = FABRIC_STATES[code];
  if (state === undefined) return undefined;
  // The status is the fabric manager's verdict once registration has ended.
  return { state, success: state === 'completed' ? status === NVML.SUCCESS : undefined };
}

/**
 * The GPU's core temperature: nvmlDeviceGetTemperatureV (nvmlTemperature_v1_t: version @0,
 * sensorType @4, temperature (int) @8; 12 bytes) where the driver has it, else the deprecated
 * nvmlDeviceGetTemperature.
 */
function readTemperature(reads: DeviceReads): number | undefined {
  if (reads.nvml.has('nvmlDeviceGetTemperatureV')) {
    const reading = Buffer.alloc(12);
    reading.writeUInt32LE(structVersion(12, 1), 0);
    reading.writeInt32LE(0, 4); // NVML_TEMPERATURE_GPU
    const code = reads.attempt('nvmlDeviceGetTemperatureV', reading);
    if (code === NVML.SUCCESS) return reading.readInt32LE(8);
    if (code !== NVML.ERROR_ARGUMENT_VERSION_MISMATCH) {
      reads.count('nvmlDeviceGetTemperatureV', code);
      return undefined;
    }
  }
  return reads.uint('nvmlDeviceGetTemperature', 0);
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
 * One device. Throws an NvmlError naming the call when the GPU cannot be told apart (no PCI bus
 * id) or is lost (GpuLostError, at its first call that says so): such a GPU is left out of the
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
  const pciCode = reads.attempt('nvmlDeviceGetPciInfo_v3', pci);
  if (pciCode !== NVML.SUCCESS) throw nvml.error('nvmlDeviceGetPciInfo_v3', pciCode);
  const pciBusId = normalizePciBusId(cString(pci.subarray(36, 68)));
  if (pciBusId === undefined)
    throw new NvmlError('nvmlDeviceGetPciInfo_v3', NVML.ERROR_UNKNOWN, `device #${position} has no valid PCI bus id ("${cString(pci.subarray(36, 68))}")`);
  const minor = reads.uint('nvmlDeviceGetMinorNumber');
  const uuid = reads.text('nvmlDeviceGetUUID', 96);
  const migCurrent = [0];
  const migKnown = reads.ok('nvmlDeviceGetMigMode', migCurrent, [0]);
  const memoryTemp = readField(reads, FIELD_MEMORY_TEMP);
  const power = reads.uint('nvmlDeviceGetPowerUsage');
  const powerLimit = reads.uint('nvmlDeviceGetEnforcedPowerLimit');
  const utilization = Buffer.alloc(8);
  const utilizationKnown = reads.ok('nvmlDeviceGetUtilizationRates', utilization);
  const memory = readMemory(reads);
  const migEnabled = migKnown ? migCurrent[0] === 1 : undefined;
  const sample: GpuSample = {
    index: minor ?? position,
    pciBusId,
    uuid,
    productName: reads.text('nvmlDeviceGetName', 96),
    driverVersion,
    migEnabled,
    temperatureCelsius: readTemperature(reads),
    memoryTemperatureCelsius: memoryTemp,
    powerDrawWatts: power === undefined ? undefined : power / 1000,
    powerLimitWatts: powerLimit === undefined ? undefined : powerLimit / 1000,
    utilizationRatio: utilizationKnown ? utilization.readUInt32LE(0) / 100 : undefined,
    memoryUsedBytes: memory?.used,
    memoryTotalBytes: memory?.total,
    ecc: readEcc(reads, migEnabled),
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
 * Drivers without it, or where it fails: nvmlMemory_t (total @0, free @8, used @16), whose used
 * includes it. The v2 call's failure is counted only when v1 fails too.
 */
function readMemory(reads: DeviceReads): { total: number; used: number } | undefined {
  let v2Code: number = NVML.ERROR_FUNCTION_NOT_FOUND;
  if (reads.nvml.has('nvmlDeviceGetMemoryInfo_v2')) {
    const memory = Buffer.alloc(40);
    memory.writeUInt32LE(structVersion(40, 2), 0);
    v2Code = reads.attempt('nvmlDeviceGetMemoryInfo_v2', memory);
    if (v2Code === NVML.SUCCESS) return { total: Number(memory.readBigUInt64LE(8)), used: Number(memory.readBigUInt64LE(32)) };
  }
  const memory = Buffer.alloc(24);
  if (reads.ok('nvmlDeviceGetMemoryInfo', memory)) return { total: Number(memory.readBigUInt64LE(0)), used: Number(memory.readBigUInt64LE(16)) };
  reads.count('nvmlDeviceGetMemoryInfo_v2', v2Code);
  return undefined;
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
