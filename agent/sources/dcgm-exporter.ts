import { z } from 'zod';
import { CLOCK_EVENT_BITS } from './clock-event-reasons.js';
import { InputError } from '../../core/errors.js';
import { normalizePciBusId } from '../../core/names.js';
import { parseExpositionText, type ExpositionLineError, type ExpositionText } from './exposition-text.js';
import type { ClockDomain, EccCount, GpuSample, RemappedRows, RetiredPages } from './nvidia-smi-xml.js';

/**
 * dcgm-exporter as a source for the `gpu` collector: its /metrics read with the Prometheus text
 * parser (exposition-text.ts), and the mapping of DCGM fields (`DCGM_FI_DEV_*`) onto the same
 * GpuSample that `nvidia-smi -q -x` gives, so that both sources export the same steadfast_gpu_*
 * series. Field names and units: NVIDIA/DCGM `dcgmlib/dcgm_fields.h` and dcgm-exporter's
 * `etc/default-counters.csv` (test/fixtures/realworld/dcgm-exporter/).
 */

// ---------------------------------------------------------------------------------------------
// DCGM fields → GpuSample
// ---------------------------------------------------------------------------------------------

/** A GPU as dcgm-exporter reports it: the nvidia-smi sample plus what only DCGM has. */
export interface DcgmGpuSample extends GpuSample {
  /**
   * DCGM_FI_DEV_XID_ERRORS: the code of the last Xid DCGM saw on this GPU (0: none since it
   * started). It is a last-value gauge sampled at dcgm-exporter's own interval, so it cannot be
   * turned into a count: two Xids between samples show as the second only, the same Xid twice
   * shows as no change, and a restart of DCGM puts it back to 0. Steadfast exports it as is and
   * still needs the xid collector, which counts every `NVRM: Xid` line of the kernel log per GPU
   * and code and sends the fatal ones on the fast path within a second.
   */
  readonly lastXid?: number | undefined;
}

export interface DcgmReport {
  readonly driverVersion?: string | undefined;
  readonly gpus: readonly DcgmGpuSample[];
  /**
   * Series with a `gpu` label but neither a usable `pci_bus_id` nor a `UUID`. Without
   * `pci_bus_id` (dcgm-exporter before mid-2024, NVIDIA/dcgm-exporter#326, and its default
   * example output) a GPU is known by its UUID.
   */
  readonly unidentifiedSeries: number;
  readonly lineErrors: readonly ExpositionLineError[];
  readonly lineErrorCount: number;
}

/** The DCGM fields the mapping reads, by what they mean. */
const FIELD = {
  gpuTemp: 'DCGM_FI_DEV_GPU_TEMP',
  memoryTemp: 'DCGM_FI_DEV_MEMORY_TEMP',
  power: 'DCGM_FI_DEV_POWER_USAGE',
  enforcedPowerLimit: 'DCGM_FI_DEV_ENFORCED_POWER_LIMIT',
  powerLimit: 'DCGM_FI_DEV_POWER_MGMT_LIMIT',
  gpuUtil: 'DCGM_FI_DEV_GPU_UTIL',
  fbUsed: 'DCGM_FI_DEV_FB_USED',
  fbFree: 'DCGM_FI_DEV_FB_FREE',
  fbReserved: 'DCGM_FI_DEV_FB_RESERVED',
  fbTotal: 'DCGM_FI_DEV_FB_TOTAL',
  smClock: 'DCGM_FI_DEV_SM_CLOCK',
  memClock: 'DCGM_FI_DEV_MEM_CLOCK',
  videoClock: 'DCGM_FI_DEV_VIDEO_CLOCK',
  maxSmClock: 'DCGM_FI_DEV_MAX_SM_CLOCK',
  maxMemClock: 'DCGM_FI_DEV_MAX_MEM_CLOCK',
  maxVideoClock: 'DCGM_FI_DEV_MAX_VIDEO_CLOCK',
  clockEvents: 'DCGM_FI_DEV_CLOCKS_EVENT_REASONS',
  // The same field (112) under its pre-DCGM-3.2 name; dcgm-exporter names the series after its CSV.
  clockThrottle: 'DCGM_FI_DEV_CLOCK_THROTTLE_REASONS',
  sbeVolatile: 'DCGM_FI_DEV_ECC_SBE_VOL_TOTAL',
  dbeVolatile: 'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL',
  sbeAggregate: 'DCGM_FI_DEV_ECC_SBE_AGG_TOTAL',
  dbeAggregate: 'DCGM_FI_DEV_ECC_DBE_AGG_TOTAL',
  rowsCorrectable: 'DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS',
  rowsUncorrectable: 'DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS',
  rowRemapPending: 'DCGM_FI_DEV_ROW_REMAP_PENDING',
  rowRemapFailure: 'DCGM_FI_DEV_ROW_REMAP_FAILURE',
  retiredSbe: 'DCGM_FI_DEV_RETIRED_SBE',
  retiredDbe: 'DCGM_FI_DEV_RETIRED_DBE',
  retiredPending: 'DCGM_FI_DEV_RETIRED_PENDING',
  pcieReplay: 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER',
  pcieLinkGen: 'DCGM_FI_DEV_PCIE_LINK_GEN',
  pcieLinkWidth: 'DCGM_FI_DEV_PCIE_LINK_WIDTH',
  xid: 'DCGM_FI_DEV_XID_ERRORS',
} as const;

type FieldName = (typeof FIELD)[keyof typeof FIELD];
const KNOWN_FIELDS: ReadonlySet<string> = new Set<string>(Object.values(FIELD));

/**
 * Under MIG dcgm-exporter writes one series per GPU instance (`GPU_I_ID`). Device-wide fields
 * repeat the device's value there, but the frame buffer fields are the instance's own share,
 * so they are only taken from a series of the whole GPU.
 */
const WHOLE_GPU_ONLY: ReadonlySet<string> = new Set<string>([FIELD.fbUsed, FIELD.fbFree, FIELD.fbReserved, FIELD.fbTotal]);

/**
 * DCGM writes "blank" sentinels where it has no value: 2^47 and up for doubles, 0x7ffffffffffffff0
 * and up for integers (`DCGM_FP64_BLANK`, `DCGM_INT64_BLANK` in dcgm_structs.h). No field read
 * here can legitimately reach 2^47, nor be negative.
 */
const DCGM_FP64_BLANK = 2 ** 47;

function reported(value: number): boolean {
  return Number.isFinite(value) && value >= 0 && value < DCGM_FP64_BLANK;
}

const MIB = 1024 ** 2;
const MHZ = 1e6;

interface GpuSeries {
  readonly index: number;
  readonly pciBusId: string | undefined;
  readonly uuid?: string | undefined;
  readonly productName?: string | undefined;
  readonly driverVersion?: string | undefined;
  readonly values: Map<string, number>;
}

function label(labels: Readonly<Record<string, string>>, name: string): string | undefined {
  const value = Object.hasOwn(labels, name) ? labels[name]?.trim() : undefined;
  return value === undefined || value === '' ? undefined : value;
}

function defined<T extends object>(record: T): T | undefined {
  return Object.values(record).every((value) => value === undefined) ? undefined : record;
}

function toSample(series: GpuSeries): DcgmGpuSample {
  const get = (field: FieldName): number | undefined => series.values.get(field);
  const scaled = (field: FieldName, scale: number): number | undefined => {
    const value = get(field);
    return value === undefined ? undefined : value * scale;
  };
  const flag = (field: FieldName): boolean | undefined => {
    const value = get(field);
    return value === undefined ? undefined : value !== 0;
  };

  const used = get(FIELD.fbUsed);
  const free = get(FIELD.fbFree);
  const reserved = get(FIELD.fbReserved);
  const total = get(FIELD.fbTotal) ?? (used !== undefined && free !== undefined ? used + free + (reserved ?? 0) : undefined);

  const ecc: EccCount[] = [];
  const eccFields = [
    { field: FIELD.sbeVolatile, scope: 'volatile', type: 'correctable' },
    { field: FIELD.dbeVolatile, scope: 'volatile', type: 'uncorrectable' },
    { field: FIELD.sbeAggregate, scope: 'aggregate', type: 'correctable' },
    { field: FIELD.dbeAggregate, scope: 'aggregate', type: 'uncorrectable' },
  ] as const;
  for (const { field, scope, type } of eccFields) {
    const count = get(field);
    // DCGM has only totals over every memory unit; `location="total"` says so.
    if (count !== undefined) ecc.push({ scope, type, location: 'total', count });
  }

  const clocks: Partial<Record<ClockDomain, number>> = {
    sm: scaled(FIELD.smClock, MHZ),
    memory: scaled(FIELD.memClock, MHZ),
    video: scaled(FIELD.videoClock, MHZ),
  };
  const maxClocks: Partial<Record<ClockDomain, number>> = {
    sm: scaled(FIELD.maxSmClock, MHZ),
    memory: scaled(FIELD.maxMemClock, MHZ),
    video: scaled(FIELD.maxVideoClock, MHZ),
  };
  const mask = get(FIELD.clockEvents) ?? get(FIELD.clockThrottle);
  const throttleReasons =
    mask === undefined || !Number.isInteger(mask) ? undefined : Object.fromEntries(CLOCK_EVENT_BITS.map(({ bit, reason }) => [reason, (mask & bit) !== 0]));
  const pendingPages = get(FIELD.retiredPending);
  const memoryTemperature = get(FIELD.memoryTemp);
  const utilization = get(FIELD.gpuUtil);

  const rows: RemappedRows = {
    correctable: get(FIELD.rowsCorrectable),
    uncorrectable: get(FIELD.rowsUncorrectable),
    pending: flag(FIELD.rowRemapPending),
    failure: flag(FIELD.rowRemapFailure),
  };
  const pages: RetiredPages = {
    singleBit: get(FIELD.retiredSbe),
    doubleBit: get(FIELD.retiredDbe),
    // A count of pages in DCGM; nvidia-smi (and so steadfast) says only whether any are pending.
    pending: pendingPages === undefined ? undefined : pendingPages > 0,
  };
  return {
    index: series.index,
    pciBusId: series.pciBusId,
    uuid: series.uuid,
    productName: series.productName,
    driverVersion: series.driverVersion,
    temperatureCelsius: get(FIELD.gpuTemp),
    // GPUs without a memory sensor (L4, L40S, T4, vGPUs in the samples) read 0, not "blank".
    memoryTemperatureCelsius: memoryTemperature === 0 ? undefined : memoryTemperature,
    powerDrawWatts: get(FIELD.power),
    powerLimitWatts: get(FIELD.enforcedPowerLimit) ?? get(FIELD.powerLimit),
    utilizationRatio: utilization === undefined ? undefined : utilization / 100,
    memoryUsedBytes: used === undefined ? undefined : used * MIB,
    memoryTotalBytes: total === undefined ? undefined : total * MIB,
    ecc,
    remappedRows: defined(rows),
    retiredPages: defined(pages),
    pcieLinkGeneration: get(FIELD.pcieLinkGen),
    pcieLinkWidth: get(FIELD.pcieLinkWidth),
    pcieReplayErrors: get(FIELD.pcieReplay),
    clocks: defined(clocks),
    maxClocks: defined(maxClocks),
    throttleReasons,
    lastXid: get(FIELD.xid),
  };
}

/**
 * Maps parsed dcgm-exporter samples onto one GpuSample per GPU, keyed by PCI bus id (the id the
 * xid collector and nvidia-smi use too), or by UUID where the scrape has no `pci_bus_id`. Series
 * without a `gpu` label (NVLink, NVSwitch, CPU families) are not GPU series and are left out;
 * the first series of a field for a GPU wins.
 */
export function mapDcgmSamples(text: ExpositionText): DcgmReport {
  const byKey = new Map<string, GpuSeries>();
  let unidentifiedSeries = 0;
  let driverVersion: string | undefined;
  for (const sample of text.samples) {
    const gpu = label(sample.labels, 'gpu');
    if (gpu === undefined || !/^\d{1,6}$/.test(gpu)) continue;
    const rawPci = label(sample.labels, 'pci_bus_id');
    const pciBusId = rawPci === undefined ? undefined : normalizePciBusId(rawPci);
    const uuid = label(sample.labels, 'UUID');
    const key = pciBusId ?? (uuid === undefined ? undefined : `uuid:${uuid}`);
    if (key === undefined) {
      unidentifiedSeries += 1;
      continue;
    }
    let series = byKey.get(key);
    if (series === undefined) {
      series = {
        index: Number(gpu),
        pciBusId,
        uuid,
        productName: label(sample.labels, 'modelName'),
        driverVersion: label(sample.labels, 'DCGM_FI_DRIVER_VERSION'),
        values: new Map(),
      };
      byKey.set(key, series);
    }
    driverVersion ??= series.driverVersion;
    if (!KNOWN_FIELDS.has(sample.name) || series.values.has(sample.name) || !reported(sample.value)) continue;
    if (WHOLE_GPU_ONLY.has(sample.name) && label(sample.labels, 'GPU_I_ID') !== undefined) continue;
    series.values.set(sample.name, sample.value);
  }
  const gpus = [...byKey.values()].map(toSample).sort((a, b) => a.index - b.index || gpuKey(a).localeCompare(gpuKey(b)));
  return { driverVersion, gpus, unidentifiedSeries, lineErrors: text.errors, lineErrorCount: text.errorCount };
}

/** What tells one GPU from another in a report: its PCI bus id, or its UUID where there is none. */
export function gpuKey(sample: { readonly pciBusId: string | undefined; readonly uuid?: string | undefined }): string {
  return sample.pciBusId ?? `uuid:${sample.uuid ?? ''}`;
}

/** Parses one dcgm-exporter /metrics body. Never throws. */
export function parseDcgmExporterText(text: string): DcgmReport {
  return mapDcgmSamples(parseExpositionText(text));
}

// ---------------------------------------------------------------------------------------------
// The endpoint
// ---------------------------------------------------------------------------------------------

/** The flag naming the endpoint; the gpu collector declares it. */
export const DCGM_EXPORTER_URL_FLAG = 'gpu.dcgm-exporter-url';

const urlSchema = z.url({ protocol: /^https?$/, message: 'must be an http:// or https:// URL' });

/** The dcgm-exporter URL from the collector settings; undefined when not given. Throws InputError naming the flag. */
export function dcgmExporterUrl(value: string | undefined): URL | undefined {
  if (value === undefined) return undefined;
  const parsed = urlSchema.safeParse(value);
  if (!parsed.success)
    throw new InputError(`--${DCGM_EXPORTER_URL_FLAG}: ${parsed.error.issues[0]?.message ?? 'invalid'}, got "${value}"`, `--${DCGM_EXPORTER_URL_FLAG}`);
  return new URL(parsed.data);
}

/** A full dcgm-exporter scrape is tens of KB per GPU; anything far larger is not one. */
const MAX_BODY_BYTES = 32 * 1024 * 1024;

/** Fetches the endpoint's text. Throws on a transport error, a non-2xx status, a timeout or an oversized body. */
export async function fetchDcgmExporterText(url: URL, timeoutMs: number, signal: AbortSignal): Promise<string> {
  const response = await fetch(url, { signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs)]), headers: { accept: 'text/plain' } });
  if (!response.ok || response.body === null) {
    await response.body?.cancel();
    throw new Error(`HTTP ${response.status} from ${url.href}`);
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  let bytes = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    bytes += value.byteLength;
    if (bytes > MAX_BODY_BYTES) {
      await reader.cancel();
      throw new Error(`${url.href} sent more than ${MAX_BODY_BYTES} bytes`);
    }
    text += decoder.decode(value, { stream: true });
  }
  return text + decoder.decode();
}
