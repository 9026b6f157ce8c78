import { errorMessage } from '../../../core/errors.js';

/**
 * NVIDIA's management library (libnvidia-ml.so.1, the library nvidia-smi, DCGM and gpud read)
 * called in-process through koffi, an FFI library with prebuilt binaries, so a node needs no
 * compiler. Signatures and struct layouts are those of nvml.h (CUDA 12/13). Calls are
 * synchronous, a microsecond or two each on top of the driver's own time: this class is used on
 * the agent's NVML worker thread (worker.ts), never on the event loop, so a call that hangs in
 * the driver holds that thread alone and `/metrics` keeps answering.
 *
 * Structs go through Buffers laid out by hand (offsets noted beside each reader), not koffi type
 * registrations, so that several libraries may be loaded in one process (tests) and a field
 * added in a later nvml.h cannot shift what is read.
 */

/** The nvmlReturn_t codes steadfast tells apart; the rest are named by nvmlErrorString. */
export const NVML = {
  SUCCESS: 0,
  ERROR_INVALID_ARGUMENT: 2,
  ERROR_NOT_SUPPORTED: 3,
  ERROR_INSUFFICIENT_SIZE: 7,
  ERROR_NOT_FOUND: 6,
  ERROR_TIMEOUT: 10,
  ERROR_FUNCTION_NOT_FOUND: 13,
  ERROR_GPU_IS_LOST: 15,
  ERROR_ARGUMENT_VERSION_MISMATCH: 25,
  ERROR_UNKNOWN: 999,
} as const;

/** Label-safe names for nvmlReturn_t codes (the `error` label of steadfast_gpu_nvml_errors_total). */
const ERROR_NAMES: Readonly<Record<number, string>> = {
  1: 'uninitialized',
  2: 'invalid_argument',
  3: 'not_supported',
  4: 'no_permission',
  5: 'already_initialized',
  6: 'not_found',
  7: 'insufficient_size',
  8: 'insufficient_power',
  9: 'driver_not_loaded',
  10: 'timeout',
  11: 'irq_issue',
  12: 'library_not_found',
  13: 'function_not_found',
  14: 'corrupted_inforom',
  15: 'gpu_is_lost',
  16: 'reset_required',
  17: 'operating_system',
  18: 'lib_rm_version_mismatch',
  19: 'in_use',
  20: 'memory',
  21: 'no_data',
  22: 'vgpu_ecc_not_supported',
  23: 'insufficient_resources',
  24: 'freq_not_supported',
  25: 'argument_version_mismatch',
  26: 'deprecated',
  27: 'not_ready',
  28: 'gpu_not_found',
  29: 'invalid_state',
  30: 'reset_type_not_supported',
  999: 'unknown',
};

export function nvmlErrorName(code: number): string {
  return ERROR_NAMES[code] ?? 'other';
}

/** An NVML call that answered something other than success. */
export class NvmlError extends Error {
  constructor(
    readonly functionName: string,
    readonly code: number,
    description: string,
  ) {
    super(`${functionName} returned ${code} (${description})`);
    this.name = 'NvmlError';
  }
}

/** The library could not be loaded or initialised; `reason` says why, for the log and `check`. */
export class NvmlUnavailableError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'NvmlUnavailableError';
  }
}

/** A device handle: the nvmlDevice_t pointer, as koffi gives pointers (a BigInt address). */
export type NvmlDevice = bigint;

/** The C declarations steadfast calls. Versioned names first: older drivers lack some (bound as absent). */
const DECLARATIONS = {
  nvmlInit_v2: 'int nvmlInit_v2()',
  nvmlShutdown: 'int nvmlShutdown()',
  nvmlErrorString: 'const char *nvmlErrorString(int result)',
  nvmlSystemGetDriverVersion: 'int nvmlSystemGetDriverVersion(uint8_t *version, unsigned int length)',
  nvmlSystemGetNVMLVersion: 'int nvmlSystemGetNVMLVersion(uint8_t *version, unsigned int length)',
  nvmlSystemGetProcessName: 'int nvmlSystemGetProcessName(unsigned int pid, uint8_t *name, unsigned int length)',
  nvmlDeviceGetCount_v2: 'int nvmlDeviceGetCount_v2(_Out_ unsigned int *count)',
  nvmlDeviceGetHandleByIndex_v2: 'int nvmlDeviceGetHandleByIndex_v2(unsigned int index, _Out_ void **device)',
  nvmlDeviceGetPciInfo_v3: 'int nvmlDeviceGetPciInfo_v3(void *device, uint8_t *pci)',
  nvmlDeviceGetUUID: 'int nvmlDeviceGetUUID(void *device, uint8_t *uuid, unsigned int length)',
  nvmlDeviceGetName: 'int nvmlDeviceGetName(void *device, uint8_t *name, unsigned int length)',
  nvmlDeviceGetMinorNumber: 'int nvmlDeviceGetMinorNumber(void *device, _Out_ unsigned int *minor)',
  nvmlDeviceGetMigMode: 'int nvmlDeviceGetMigMode(void *device, _Out_ unsigned int *current, _Out_ unsigned int *pending)',
  nvmlDeviceGetArchitecture: 'int nvmlDeviceGetArchitecture(void *device, _Out_ unsigned int *arch)',
  nvmlDeviceGetMaxMigDeviceCount: 'int nvmlDeviceGetMaxMigDeviceCount(void *device, _Out_ unsigned int *count)',
  nvmlDeviceGetMigDeviceHandleByIndex: 'int nvmlDeviceGetMigDeviceHandleByIndex(void *device, unsigned int index, _Out_ void **migDevice)',
  nvmlDeviceGetGpuInstanceId: 'int nvmlDeviceGetGpuInstanceId(void *device, _Out_ unsigned int *id)',
  nvmlDeviceGetComputeInstanceId: 'int nvmlDeviceGetComputeInstanceId(void *device, _Out_ unsigned int *id)',
  // Versioned (driver 550 and later) before the deprecated call.
  nvmlDeviceGetTemperatureV: 'int nvmlDeviceGetTemperatureV(void *device, uint8_t *temperature)',
  nvmlDeviceGetTemperature: 'int nvmlDeviceGetTemperature(void *device, int sensor, _Out_ unsigned int *temp)',
  nvmlDeviceGetFieldValues: 'int nvmlDeviceGetFieldValues(void *device, int count, uint8_t *values)',
  nvmlDeviceGetPowerUsage: 'int nvmlDeviceGetPowerUsage(void *device, _Out_ unsigned int *milliwatts)',
  nvmlDeviceGetEnforcedPowerLimit: 'int nvmlDeviceGetEnforcedPowerLimit(void *device, _Out_ unsigned int *milliwatts)',
  nvmlDeviceGetUtilizationRates: 'int nvmlDeviceGetUtilizationRates(void *device, uint8_t *utilization)',
  nvmlDeviceGetMemoryInfo_v2: 'int nvmlDeviceGetMemoryInfo_v2(void *device, uint8_t *memory)',
  nvmlDeviceGetMemoryInfo: 'int nvmlDeviceGetMemoryInfo(void *device, uint8_t *memory)',
  nvmlDeviceGetMemoryErrorCounter:
    'int nvmlDeviceGetMemoryErrorCounter(void *device, int errorType, int counterType, int location, _Out_ unsigned long long *count)',
  nvmlDeviceGetRemappedRows:
    'int nvmlDeviceGetRemappedRows(void *device, _Out_ unsigned int *corrected, _Out_ unsigned int *uncorrected, _Out_ unsigned int *pending, _Out_ unsigned int *failure)',
  nvmlDeviceGetRetiredPages: 'int nvmlDeviceGetRetiredPages(void *device, int cause, _Inout_ unsigned int *count, void *addresses)',
  nvmlDeviceGetRetiredPagesPendingStatus: 'int nvmlDeviceGetRetiredPagesPendingStatus(void *device, _Out_ unsigned int *pending)',
  nvmlDeviceGetCurrPcieLinkGeneration: 'int nvmlDeviceGetCurrPcieLinkGeneration(void *device, _Out_ unsigned int *generation)',
  nvmlDeviceGetCurrPcieLinkWidth: 'int nvmlDeviceGetCurrPcieLinkWidth(void *device, _Out_ unsigned int *width)',
  nvmlDeviceGetPcieReplayCounter: 'int nvmlDeviceGetPcieReplayCounter(void *device, _Out_ unsigned int *count)',
  nvmlDeviceGetClockInfo: 'int nvmlDeviceGetClockInfo(void *device, int type, _Out_ unsigned int *mhz)',
  nvmlDeviceGetMaxClockInfo: 'int nvmlDeviceGetMaxClockInfo(void *device, int type, _Out_ unsigned int *mhz)',
  // Renamed in driver 535 ("clock events"); the older name stays exported by newer drivers.
  nvmlDeviceGetCurrentClocksEventReasons: 'int nvmlDeviceGetCurrentClocksEventReasons(void *device, _Out_ unsigned long long *reasons)',
  nvmlDeviceGetCurrentClocksThrottleReasons: 'int nvmlDeviceGetCurrentClocksThrottleReasons(void *device, _Out_ unsigned long long *reasons)',
  nvmlDeviceGetSupportedClocksEventReasons: 'int nvmlDeviceGetSupportedClocksEventReasons(void *device, _Out_ unsigned long long *reasons)',
  nvmlDeviceGetSupportedClocksThrottleReasons: 'int nvmlDeviceGetSupportedClocksThrottleReasons(void *device, _Out_ unsigned long long *reasons)',
  nvmlDeviceGetGpuFabricInfoV: 'int nvmlDeviceGetGpuFabricInfoV(void *device, uint8_t *info)',
  nvmlDeviceGetGpuFabricInfo: 'int nvmlDeviceGetGpuFabricInfo(void *device, uint8_t *info)',
  // The process lists: _v3 since R510, _v2 (the same 24-byte struct) on R460/R470, v1 (16 bytes) before.
  nvmlDeviceGetComputeRunningProcesses_v3: 'int nvmlDeviceGetComputeRunningProcesses_v3(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetGraphicsRunningProcesses_v3: 'int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetComputeRunningProcesses_v2: 'int nvmlDeviceGetComputeRunningProcesses_v2(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetGraphicsRunningProcesses_v2: 'int nvmlDeviceGetGraphicsRunningProcesses_v2(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetComputeRunningProcesses: 'int nvmlDeviceGetComputeRunningProcesses(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetGraphicsRunningProcesses: 'int nvmlDeviceGetGraphicsRunningProcesses(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetNvLinkState: 'int nvmlDeviceGetNvLinkState(void *device, unsigned int link, _Out_ unsigned int *active)',
  nvmlDeviceGetNvLinkErrorCounter: 'int nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter, _Out_ unsigned long long *value)',
  nvmlEventSetCreate: 'int nvmlEventSetCreate(_Out_ void **set)',
  nvmlEventSetFree: 'int nvmlEventSetFree(void *set)',
  nvmlDeviceGetSupportedEventTypes: 'int nvmlDeviceGetSupportedEventTypes(void *device, _Out_ unsigned long long *types)',
  nvmlDeviceRegisterEvents: 'int nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set)',
  nvmlEventSetWait_v2: 'int nvmlEventSetWait_v2(void *set, uint8_t *data, unsigned int timeoutms)',
} as const;

export type NvmlFunction = keyof typeof DECLARATIONS;

type Bound = (...args: unknown[]) => unknown;

export interface KoffiModule {
  load(path: string): { func(declaration: string): Bound; unload(): void };
}

/** koffi, loaded on first use: a node without its prebuilt binary still runs on nvidia-smi. */
export async function loadKoffi(): Promise<KoffiModule> {
  try {
    const module = (await import('koffi')) as unknown as { default?: KoffiModule } & KoffiModule;
    return module.default ?? module;
  } catch (error) {
    throw new NvmlUnavailableError(`the FFI library koffi cannot be loaded on ${process.platform}-${process.arch}: ${errorMessage(error)}`, { cause: error });
  }
}

/** A string NVML wrote into a buffer, up to its NUL. */
export function cString(buffer: Buffer): string {
  const end = buffer.indexOf(0);
  return buffer.toString('utf8', 0, end === -1 ? buffer.length : end);
}

/** The functions in a fixed order, so that a call in progress can be named by its index (worker.ts). */
export const NVML_FUNCTIONS = Object.keys(DECLARATIONS) as NvmlFunction[];
const FUNCTION_INDEX = new Map(NVML_FUNCTIONS.map((name, index) => [name, index]));

/**
 * Which entry point this library gives for each reading that has several across driver
 * versions (the first it exports, newest first), or undefined where it has none: reported at
 * start (the log and steadfast_gpu_nvml_function_info), so that a value missing on an old driver
 * says why.
 */
export const NVML_ENTRY_POINTS = {
  processes: ['nvmlDeviceGetComputeRunningProcesses_v3', 'nvmlDeviceGetComputeRunningProcesses_v2', 'nvmlDeviceGetComputeRunningProcesses'],
  memory: ['nvmlDeviceGetMemoryInfo_v2', 'nvmlDeviceGetMemoryInfo'],
  temperature: ['nvmlDeviceGetTemperatureV', 'nvmlDeviceGetTemperature'],
  fabric: ['nvmlDeviceGetGpuFabricInfoV', 'nvmlDeviceGetGpuFabricInfo'],
  clock_reasons: ['nvmlDeviceGetCurrentClocksEventReasons', 'nvmlDeviceGetCurrentClocksThrottleReasons'],
  architecture: ['nvmlDeviceGetArchitecture'],
  mig_devices: ['nvmlDeviceGetMigDeviceHandleByIndex'],
  xid_events: ['nvmlEventSetWait_v2'],
} as const satisfies Record<string, readonly NvmlFunction[]>;

export type NvmlReading = keyof typeof NVML_ENTRY_POINTS;
export type NvmlEntryPoints = Readonly<Record<NvmlReading, NvmlFunction | undefined>>;

/** A loaded NVML. */
export class NvmlLibrary {
  private closed = false;
  private initialized = false;
  /** Told the index (in NVML_FUNCTIONS) of each call before it is made, and -1 after. */
  onCall: ((index: number) => void) | undefined;

  private constructor(
    readonly path: string,
    private readonly library: ReturnType<KoffiModule['load']>,
    private readonly functions: Partial<Record<NvmlFunction, Bound>>,
  ) {}

  /**
   * Loads koffi and the library and binds its functions; no NVML call yet. Throws
   * NvmlUnavailableError with the reason: no koffi binary for this platform, no such library,
   * or a library that is not NVML.
   */
  static async load(path: string): Promise<NvmlLibrary> {
    const koffi = await loadKoffi();
    let library: ReturnType<KoffiModule['load']>;
    try {
      library = koffi.load(path);
    } catch (error) {
      throw new NvmlUnavailableError(`cannot load ${path}: ${errorMessage(error)}`, { cause: error });
    }
    const functions: Partial<Record<NvmlFunction, Bound>> = {};
    for (const [name, declaration] of Object.entries(DECLARATIONS) as [NvmlFunction, string][]) {
      try {
        functions[name] = library.func(declaration);
      } catch {
        // An older driver without this entry point: the values it gives are not supported there.
      }
    }
    if (functions.nvmlInit_v2 === undefined || functions.nvmlDeviceGetCount_v2 === undefined) {
      library.unload();
      throw new NvmlUnavailableError(`${path} has no nvmlInit_v2: not an NVIDIA management library`);
    }
    return new NvmlLibrary(path, library, functions);
  }

  /**
   * nvmlInit_v2 (it can take a second on a node with eight GPUs and persistence mode off), until
   * it has once succeeded. Throws NvmlError (driver not loaded, no permission) so that a poll
   * fails and the next one tries again.
   */
  init(): void {
    if (this.initialized) return;
    const code = this.call('nvmlInit_v2');
    if (code !== NVML.SUCCESS) throw this.error('nvmlInit_v2', code);
    this.initialized = true;
  }

  /** Whether the library exports this function. */
  has(name: NvmlFunction): boolean {
    return this.functions[name] !== undefined;
  }

  /** The first of `names` the library exports. */
  first<N extends NvmlFunction>(names: readonly N[]): N | undefined {
    return names.find((name) => this.has(name));
  }

  /** The entry point in use for each reading (NVML_ENTRY_POINTS). */
  entryPoints(): NvmlEntryPoints {
    const entries = Object.entries(NVML_ENTRY_POINTS).map(([reading, names]) => [reading, this.first(names)]);
    return Object.fromEntries(entries) as NvmlEntryPoints;
  }

  /**
   * Calls a function; answers its nvmlReturn_t. A function the library lacks answers
   * ERROR_FUNCTION_NOT_FOUND without a call.
   */
  call(name: NvmlFunction, ...args: unknown[]): number {
    const bound = this.functions[name];
    if (bound === undefined) return NVML.ERROR_FUNCTION_NOT_FOUND;
    if (this.closed) throw new Error(`NVML ${this.path} is shut down`);
    this.onCall?.(FUNCTION_INDEX.get(name) ?? -1);
    try {
      return Number(bound(...args));
    } finally {
      this.onCall?.(-1);
    }
  }

  /** nvmlErrorString's text for a code. */
  describe(code: number): string {
    const bound = this.functions.nvmlErrorString;
    try {
      return bound === undefined ? nvmlErrorName(code) : String(bound(code));
    } catch {
      return nvmlErrorName(code);
    }
  }

  /** An NvmlError for a failed call, with the library's words for its code. */
  error(name: NvmlFunction, code: number): NvmlError {
    return new NvmlError(name, code, this.describe(code));
  }

  /** nvmlShutdown (after a successful init) and unload. */
  close(): void {
    if (this.closed) return;
    if (this.initialized) this.call('nvmlShutdown');
    this.closed = true;
    this.library.unload();
  }
}
