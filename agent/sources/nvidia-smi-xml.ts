import { InputError, errorMessage } from '../../core/errors.js';
import { normalizePciBusId } from '../../core/names.js';
import { readXmlRoot, type XmlNode } from './nvidia-smi-xml-tree.js';

/**
 * Pure parser of `nvidia-smi -q -x` output into typed per-GPU samples. The element names come
 * from NVIDIA's DTDs nvsmi_device_v11/v12/v13 as seen in the captures under
 * test/fixtures/realworld/nvidia-smi-xml/ (see its SOURCE.md for what each file pins). A value the
 * hardware does not report (`N/A`, `[Not Supported]`, `Requested functionality has been
 * deprecated`, an absent element) is undefined, never 0.
 */

export type EccScope = 'volatile' | 'aggregate';
export type EccType = 'correctable' | 'uncorrectable';

export interface EccCount {
  readonly scope: EccScope;
  readonly type: EccType;
  /** `sram`, `dram`, or on pre-Volta schemas the memory unit (`device_memory`, `l2_cache`, …). */
  readonly location: string;
  readonly count: number;
  /**
   * Set on a MIG device's own count (MIG on: volatile uncorrectable SRAM is counted per MIG
   * device, not for the whole GPU): its GPU instance and compute instance.
   */
  readonly gpuInstance?: number | undefined;
  readonly computeInstance?: number | undefined;
}

export interface RemappedRows {
  readonly correctable?: number | undefined;
  readonly uncorrectable?: number | undefined;
  readonly pending?: boolean | undefined;
  readonly failure?: boolean | undefined;
}

export interface RetiredPages {
  /** Pages retired after repeated single-bit errors. */
  readonly singleBit?: number | undefined;
  readonly doubleBit?: number | undefined;
  /** Pages waiting for the next driver reload to be retired. */
  readonly pending?: boolean | undefined;
}

/** Clock domains as nvidia-smi names them (`graphics_clock`, `sm_clock`, `mem_clock`, `video_clock`). */
export type ClockDomain = 'graphics' | 'sm' | 'memory' | 'video';

/** Clock frequencies in Hz, by domain; a domain the GPU does not report is absent. */
export type ClockReadings = Readonly<Partial<Record<ClockDomain, number>>>;

/** Why the clocks are held below their maximum right now: reason name → active. */
export type ThrottleReasons = Readonly<Record<string, boolean>>;

/**
 * NVLink fabric registration (NVSwitch systems, driven by the fabric manager): `<fabric><state>`
 * and `<status>` in the XML, "Fabric / State : Completed, Status : Success" in `nvidia-smi -q`.
 * `N/A` on GPUs without a fabric.
 */
export interface FabricState {
  /** `not_started`, `in_progress`, `completed`, … (the text in snake case). */
  readonly state?: string | undefined;
  /** Whether the status is `Success`; undefined where it is N/A. */
  readonly success?: boolean | undefined;
}

export interface GpuSample {
  /** The minor number (`/dev/nvidiaN`); the position in the report where the driver gives none. */
  readonly index: number;
  /**
   * `dddd:bb:dd` from `<gpu id="00000000:3B:00.0">`. nvidia-smi always gives it; a dcgm-exporter
   * without the `pci_bus_id` label does not, and its GPUs are known by UUID alone.
   */
  readonly pciBusId: string | undefined;
  readonly uuid?: string | undefined;
  readonly productName?: string | undefined;
  readonly driverVersion?: string | undefined;
  readonly migEnabled?: boolean | undefined;
  readonly temperatureCelsius?: number | undefined;
  readonly memoryTemperatureCelsius?: number | undefined;
  readonly powerDrawWatts?: number | undefined;
  readonly powerLimitWatts?: number | undefined;
  /** 0..1. */
  readonly utilizationRatio?: number | undefined;
  readonly memoryUsedBytes?: number | undefined;
  readonly memoryTotalBytes?: number | undefined;
  readonly ecc: readonly EccCount[];
  /** Undefined where the GPU has no row remapper (pre-Ampere, MIG, VMs: `<remapped_rows>N/A`). */
  readonly remappedRows?: RemappedRows | undefined;
  readonly retiredPages?: RetiredPages | undefined;
  readonly pcieLinkGeneration?: number | undefined;
  readonly pcieLinkWidth?: number | undefined;
  readonly pcieReplayErrors?: number | undefined;
  /** Current clocks (Hz). */
  readonly clocks?: ClockReadings | undefined;
  /** Highest clocks the GPU can run at (Hz). */
  readonly maxClocks?: ClockReadings | undefined;
  /**
   * Clock throttle ("clock event" since driver 535) reasons, by the name NVML gives them:
   * `gpu_idle`, `sw_power_cap`, `hw_slowdown`, `sw_thermal_slowdown`, ….
   */
  readonly throttleReasons?: ThrottleReasons | undefined;
  readonly fabric?: FabricState | undefined;
  /** Processes with a context on the GPU (`<processes>`); undefined where the report has no list. */
  readonly processes?: readonly GpuProcess[] | undefined;
}

/**
 * A process holding a context on a GPU, as nvidia-smi lists it: the pid in the pid namespace
 * nvidia-smi runs in, `C` compute (CUDA), `G` graphics, `C+G` both.
 */
export interface GpuProcess {
  readonly pid: number;
  readonly type?: string | undefined;
  readonly name?: string | undefined;
  readonly usedMemoryBytes?: number | undefined;
  /** MIG attribution, where the GPU is partitioned. */
  readonly gpuInstance?: number | undefined;
  readonly computeInstance?: number | undefined;
}

/** Whether a GPU process runs CUDA work (a compute context), as training ranks do. */
export function isComputeProcess(process: GpuProcess): boolean {
  return process.type === undefined || process.type.includes('C');
}

export interface NvidiaSmiReport {
  readonly driverVersion?: string | undefined;
  readonly cudaVersion?: string | undefined;
  /** As nvidia-smi states it; may differ from `gpus.length` in trimmed captures. */
  readonly attachedGpus?: number | undefined;
  readonly gpus: readonly GpuSample[];
}

function isNode(value: unknown): value is XmlNode {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function child(node: unknown, ...path: string[]): unknown {
  let cursor = node;
  for (const key of path) {
    if (!isNode(cursor)) return undefined;
    cursor = cursor[key];
  }
  return cursor;
}

/** The text of an element, or undefined where nvidia-smi printed a placeholder for "no value". */
function text(node: unknown, ...path: string[]): string | undefined {
  const value = child(node, ...path);
  if (typeof value !== 'string') return undefined;
  const trimmed = value.trim();
  if (trimmed === '' || /^\[?(N\/A|Not Supported|Unknown Error|Requested functionality has been deprecated|Insufficient Permissions)\]?$/i.test(trimmed)) {
    return undefined;
  }
  return trimmed;
}

/** Multipliers for the units nvidia-smi prints inside values (`23034 MiB`, `27.22 W`, `45 C`, `0 %`, `16x`). */
const UNIT_SCALE: Readonly<Record<string, number>> = {
  '': 1,
  C: 1,
  W: 1,
  x: 1,
  '%': 0.01,
  B: 1,
  KiB: 1024,
  MiB: 1024 ** 2,
  GiB: 1024 ** 3,
  MHz: 1e6,
};

/** A number with an optional unit, scaled to the base unit; undefined for placeholders and unknown units. */
function quantity(node: unknown, ...path: string[]): number | undefined {
  const raw = text(node, ...path);
  if (raw === undefined) return undefined;
  const match = /^(-?\d+(?:\.\d+)?)\s*([A-Za-z%]*)$/.exec(raw);
  if (!match) return undefined;
  const scale = UNIT_SCALE[match[2] ?? ''];
  return scale === undefined ? undefined : Number(match[1]) * scale;
}

function firstQuantity(node: unknown, paths: readonly (readonly string[])[]): number | undefined {
  for (const path of paths) {
    const value = quantity(node, ...path);
    if (value !== undefined) return value;
  }
  return undefined;
}

function flag(node: unknown, ...path: string[]): boolean | undefined {
  const raw = text(node, ...path);
  if (raw === undefined) return undefined;
  if (/^(yes|enabled|active)$/i.test(raw)) return true;
  if (/^(no|disabled|not active)$/i.test(raw)) return false;
  return undefined;
}

/** v11/v12 name the type after the location (`sram_correctable`); v13 splits SRAM uncorrectable by detector. */
const NEW_SCHEMA_ECC: readonly { readonly element: string; readonly location: string; readonly type: EccType }[] = [
  { element: 'sram_correctable', location: 'sram', type: 'correctable' },
  { element: 'sram_uncorrectable', location: 'sram', type: 'uncorrectable' },
  // v13: parity and SEC-DED detected uncorrectable SRAM errors; together they are v12's sram_uncorrectable.
  { element: 'sram_uncorrectable_parity', location: 'sram', type: 'uncorrectable' },
  { element: 'sram_uncorrectable_secded', location: 'sram', type: 'uncorrectable' },
  { element: 'dram_correctable', location: 'dram', type: 'correctable' },
  { element: 'dram_uncorrectable', location: 'dram', type: 'uncorrectable' },
];

/** Pre-Volta schema (P100 sample): single-bit errors are the corrected ones, double-bit the uncorrected. */
const OLD_SCHEMA_ECC_TYPES: readonly { readonly element: string; readonly type: EccType }[] = [
  { element: 'single_bit', type: 'correctable' },
  { element: 'double_bit', type: 'uncorrectable' },
];

function parseEcc(gpu: XmlNode): EccCount[] {
  const counts = new Map<string, EccCount>();
  const add = (scope: EccScope, type: EccType, location: string, count: number | undefined): void => {
    if (count === undefined) return;
    const key = `${scope}/${type}/${location}`;
    const previous = counts.get(key)?.count ?? 0;
    counts.set(key, { scope, type, location, count: previous + count });
  };
  for (const scope of ['volatile', 'aggregate'] as const) {
    const block = child(gpu, 'ecc_errors', scope);
    if (!isNode(block)) continue;
    for (const { element, location, type } of NEW_SCHEMA_ECC) add(scope, type, location, quantity(block, element));
    for (const { element, type } of OLD_SCHEMA_ECC_TYPES) {
      const units = block[element];
      if (!isNode(units)) continue;
      for (const location of Object.keys(units)) {
        // `total` repeats the sum of the units listed beside it.
        if (location !== 'total') add(scope, type, location, quantity(units, location));
      }
    }
  }
  // With MIG on, drivers before 535 print no volatile counts for the GPU, only each MIG device's;
  // later ones print both, and the GPU's already holds its MIG devices' errors.
  const gpuVolatile = [...counts.values()].some((count) => count.scope === 'volatile');
  return [...counts.values(), ...(gpuVolatile ? [] : parseMigDeviceEcc(gpu))];
}

/** `<mig_devices><mig_device>…<ecc_error_count><volatile_count><sram_uncorrectable>`: each MIG device's own count. */
function parseMigDeviceEcc(gpu: XmlNode): EccCount[] {
  const entries = child(gpu, 'mig_devices', 'mig_device');
  const list = Array.isArray(entries) ? entries : entries === undefined ? [] : [entries];
  const counts: EccCount[] = [];
  for (const entry of list) {
    const count = quantity(entry, 'ecc_error_count', 'volatile_count', 'sram_uncorrectable');
    if (count === undefined) continue;
    const gpuInstance = quantity(entry, 'gpu_instance_id');
    const computeInstance = quantity(entry, 'compute_instance_id');
    counts.push({ scope: 'volatile', type: 'uncorrectable', location: 'sram', count, gpuInstance, computeInstance });
  }
  return counts;
}

function parseRemappedRows(gpu: XmlNode): RemappedRows | undefined {
  const block = gpu.remapped_rows;
  if (!isNode(block)) return undefined;
  const rows: RemappedRows = {
    correctable: quantity(block, 'remapped_row_corr'),
    uncorrectable: quantity(block, 'remapped_row_unc'),
    pending: flag(block, 'remapped_row_pending'),
    failure: flag(block, 'remapped_row_failure'),
  };
  return Object.values(rows).every((value) => value === undefined) ? undefined : rows;
}

function parseRetiredPages(gpu: XmlNode): RetiredPages | undefined {
  const block = gpu.retired_pages;
  if (!isNode(block)) return undefined;
  const pages: RetiredPages = {
    singleBit: quantity(block, 'multiple_single_bit_retirement', 'retired_count'),
    doubleBit: quantity(block, 'double_bit_retirement', 'retired_count'),
    // Older drivers call the pending list `pending_blacklist`.
    pending: flag(block, 'pending_retirement') ?? flag(block, 'pending_blacklist'),
  };
  return Object.values(pages).every((value) => value === undefined) ? undefined : pages;
}

const CLOCK_ELEMENTS: readonly { readonly element: string; readonly domain: ClockDomain }[] = [
  { element: 'graphics_clock', domain: 'graphics' },
  { element: 'sm_clock', domain: 'sm' },
  { element: 'mem_clock', domain: 'memory' },
  { element: 'video_clock', domain: 'video' },
];

/** `<clocks>` / `<max_clocks>`: the same four children in every schema seen (v11 to v13, P100). */
function parseClocks(gpu: XmlNode, block: 'clocks' | 'max_clocks'): ClockReadings | undefined {
  const readings: Partial<Record<ClockDomain, number>> = {};
  for (const { element, domain } of CLOCK_ELEMENTS) {
    const hertz = quantity(gpu, block, element);
    if (hertz !== undefined) readings[domain] = hertz;
  }
  return Object.keys(readings).length === 0 ? undefined : readings;
}

/**
 * v11 calls the block `<clocks_throttle_reasons>` and its children `clocks_throttle_reason_<name>`;
 * v12 and later (driver 535+) `<clocks_event_reasons>` and `clocks_event_reason_<name>`. Both
 * spellings map to the bare `<name>`, so a fleet on mixed drivers has one set of reasons.
 */
const THROTTLE_BLOCKS: readonly { readonly block: string; readonly prefix: string }[] = [
  { block: 'clocks_event_reasons', prefix: 'clocks_event_reason_' },
  { block: 'clocks_throttle_reasons', prefix: 'clocks_throttle_reason_' },
];

function parseThrottleReasons(gpu: XmlNode): ThrottleReasons | undefined {
  const reasons: Record<string, boolean> = {};
  for (const { block, prefix } of THROTTLE_BLOCKS) {
    const node = gpu[block];
    if (!isNode(node)) continue;
    for (const element of Object.keys(node)) {
      const reason = element.startsWith(prefix) ? element.slice(prefix.length) : undefined;
      // Label values must stay a small, known-shaped set; anything else in the block is not a reason.
      if (reason === undefined || !/^[a-z][a-z0-9_]{0,63}$/.test(reason)) continue;
      const active = flag(node, element);
      if (active !== undefined) reasons[reason] = active;
    }
  }
  return Object.keys(reasons).length === 0 ? undefined : reasons;
}

function parseFabric(gpu: XmlNode): FabricState | undefined {
  const rawState = text(gpu, 'fabric', 'state');
  const rawStatus = text(gpu, 'fabric', 'status');
  // Label values must stay a small, known-shaped set: anything else is left out.
  const state = rawState !== undefined && /^[A-Za-z][A-Za-z ]{0,31}$/.test(rawState) ? rawState.toLowerCase().replace(/ +/g, '_') : undefined;
  const success = rawStatus === undefined ? undefined : rawStatus === 'Success';
  return state === undefined && success === undefined ? undefined : { state, success };
}

/** `<processes><process_info>…</process_info></processes>`: one entry or a list; `N/A` or empty: none. */
function parseProcesses(gpu: XmlNode): GpuProcess[] | undefined {
  const block = gpu.processes;
  if (block === undefined) return undefined;
  const entries = child(block, 'process_info');
  const list = Array.isArray(entries) ? entries : entries === undefined ? [] : [entries];
  const processes: GpuProcess[] = [];
  for (const entry of list) {
    const pid = quantity(entry, 'pid');
    if (pid === undefined || !Number.isSafeInteger(pid) || pid <= 0) continue;
    processes.push({
      pid,
      type: text(entry, 'type'),
      name: text(entry, 'process_name'),
      usedMemoryBytes: quantity(entry, 'used_memory'),
      gpuInstance: quantity(entry, 'gpu_instance_id'),
      computeInstance: quantity(entry, 'compute_instance_id'),
    });
  }
  return processes;
}

function parseGpu(gpu: XmlNode, position: number, driverVersion: string | undefined): GpuSample {
  const id = typeof gpu['@_id'] === 'string' ? gpu['@_id'] : text(gpu, 'pci', 'pci_bus_id');
  const pciBusId = id === undefined ? undefined : normalizePciBusId(id);
  if (pciBusId === undefined) throw new InputError(`nvidia-smi XML: gpu #${position} has no valid PCI bus id (${String(id)})`, 'gpu.id');
  const minor = quantity(gpu, 'minor_number');
  return {
    index: minor !== undefined && Number.isInteger(minor) ? minor : position,
    pciBusId,
    uuid: text(gpu, 'uuid'),
    productName: text(gpu, 'product_name'),
    driverVersion,
    migEnabled: flag(gpu, 'mig_mode', 'current_mig'),
    temperatureCelsius: quantity(gpu, 'temperature', 'gpu_temp'),
    memoryTemperatureCelsius: quantity(gpu, 'temperature', 'memory_temp'),
    // v11 `power_readings`, v12+ `gpu_power_readings`; v13 splits the reading into average
    // (what power_draw reported on Ampere and newer, per `nvidia-smi --help-query-gpu`) and instant.
    powerDrawWatts: firstQuantity(gpu, [
      ['power_readings', 'power_draw'],
      ['gpu_power_readings', 'power_draw'],
      ['gpu_power_readings', 'average_power_draw'],
      ['gpu_power_readings', 'instant_power_draw'],
    ]),
    // The limit in force: `enforced_power_limit` (v11), `current_power_limit` (v12+).
    powerLimitWatts: firstQuantity(gpu, [
      ['power_readings', 'enforced_power_limit'],
      ['power_readings', 'power_limit'],
      ['gpu_power_readings', 'current_power_limit'],
    ]),
    utilizationRatio: quantity(gpu, 'utilization', 'gpu_util'),
    memoryUsedBytes: quantity(gpu, 'fb_memory_usage', 'used'),
    memoryTotalBytes: quantity(gpu, 'fb_memory_usage', 'total'),
    ecc: parseEcc(gpu),
    remappedRows: parseRemappedRows(gpu),
    retiredPages: parseRetiredPages(gpu),
    pcieLinkGeneration: quantity(gpu, 'pci', 'pci_gpu_link_info', 'pcie_gen', 'current_link_gen'),
    pcieLinkWidth: quantity(gpu, 'pci', 'pci_gpu_link_info', 'link_widths', 'current_link_width'),
    pcieReplayErrors: quantity(gpu, 'pci', 'replay_counter'),
    clocks: parseClocks(gpu, 'clocks'),
    maxClocks: parseClocks(gpu, 'max_clocks'),
    throttleReasons: parseThrottleReasons(gpu),
    fabric: parseFabric(gpu),
    processes: parseProcesses(gpu),
  };
}

export type NvidiaSmiXmlResult = { readonly ok: true; readonly report: NvidiaSmiReport } | { readonly ok: false; readonly error: InputError };

/**
 * Parses one `nvidia-smi -q -x` document. Never throws: whatever the input (a half-written file,
 * nvidia-smi's "failed to communicate" message, random bytes), a bad document is an error result.
 */
export function readNvidiaSmiXml(xml: string): NvidiaSmiXmlResult {
  try {
    return { ok: true, report: parseDocument(xml) };
  } catch (error) {
    if (error instanceof InputError) return { ok: false, error };
    throw error;
  }
}

/** Parses one `nvidia-smi -q -x` document. Throws InputError when it is not one. */
export function parseNvidiaSmiXml(xml: string): NvidiaSmiReport {
  const result = readNvidiaSmiXml(xml);
  if (!result.ok) throw result.error;
  return result.report;
}

function parseDocument(xml: string): NvidiaSmiReport {
  // A half-written capture (a simulator rewriting the file, nvidia-smi killed by its timeout)
  // would read as fewer GPUs, which looks exactly like a lost GPU; refuse it instead.
  if (!/<\/nvidia_smi_log>\s*$/.test(xml)) throw new InputError('nvidia-smi XML is incomplete: no closing </nvidia_smi_log>');
  let root: unknown;
  try {
    root = readXmlRoot(xml, 'nvidia_smi_log');
  } catch (error) {
    // Mismatched tags and the like; nesting too deep to follow ends here too.
    throw new InputError(`nvidia-smi XML does not parse: ${errorMessage(error).replace(/\s*\n\s*/g, '; ')}`);
  }
  if (!isNode(root)) throw new InputError('nvidia-smi XML: no <nvidia_smi_log> element');
  const driverVersion = text(root, 'driver_version');
  // Every <gpu> is a list entry, one GPU or eight.
  const gpuNodes = (Array.isArray(root.gpu) ? root.gpu : [root.gpu]).filter(isNode);
  return {
    driverVersion,
    cudaVersion: text(root, 'cuda_version'),
    attachedGpus: quantity(root, 'attached_gpus'),
    gpus: gpuNodes.map((gpu, position) => parseGpu(gpu, position, driverVersion)),
  };
}
