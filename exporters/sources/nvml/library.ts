import { errorMessage } from '../../../core/errors.js';

/**
 * NVIDIA's management library (libnvidia-ml.so.1, the library nvidia-smi, DCGM and gpud read)
 * called in-process through koffi, an FFI library with prebuilt binaries, so a node needs no
 * compiler. Signatures and struct layouts are those of nvml.h (CUDA 12/13). Every call is a koffi
 * asynchronous call, run on a thread of Node's libuv pool, never on the event loop, and one at a
 * time per lane: a call that hangs in the driver holds its lane's one pool thread (of four, shared
 * with file reads) and nothing else, so `/metrics` keeps answering while the poll that made it is
 * counted as timed out.
 *
 * Structs go through Buffers laid out by hand (offsets noted beside each reader), not koffi type
 * registrations, so that several libraries may be loaded in one process (tests) and a field
 * added in a later nvml.h cannot shift what is read.
 */

/** The nvmlReturn_t codes steadfast tells apart; the rest are named by nvmlErrorString. */
export const NVML = {
  SUCCESS: 0,
  ERROR_UNINITIALIZED: 1,
  ERROR_INVALID_ARGUMENT: 2,
  ERROR_NOT_SUPPORTED: 3,
  ERROR_NO_PERMISSION: 4,
  ERROR_NOT_FOUND: 6,
  ERROR_INSUFFICIENT_SIZE: 7,
  ERROR_DRIVER_NOT_LOADED: 9,
  ERROR_TIMEOUT: 10,
  ERROR_GPU_IS_LOST: 15,
  ERROR_FUNCTION_NOT_FOUND: 13,
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
  25: 'argument_version_mismatch',
  26: 'deprecated',
  27: 'not_ready',
  28: 'gpu_not_found',
  29: 'invalid_state',
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
  nvmlDeviceGetGpuFabricInfo: 'int nvmlDeviceGetGpuFabricInfo(void *device, uint8_t *info)',
  nvmlDeviceGetComputeRunningProcesses_v3: 'int nvmlDeviceGetComputeRunningProcesses_v3(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetGraphicsRunningProcesses_v3: 'int nvmlDeviceGetGraphicsRunningProcesses_v3(void *device, _Inout_ unsigned int *count, uint8_t *infos)',
  nvmlDeviceGetNvLinkState: 'int nvmlDeviceGetNvLinkState(void *device, unsigned int link, _Out_ unsigned int *active)',
  nvmlDeviceGetNvLinkErrorCounter: 'int nvmlDeviceGetNvLinkErrorCounter(void *device, unsigned int link, int counter, _Out_ unsigned long long *value)',
  nvmlEventSetCreate: 'int nvmlEventSetCreate(_Out_ void **set)',
  nvmlEventSetFree: 'int nvmlEventSetFree(void *set)',
  nvmlDeviceGetSupportedEventTypes: 'int nvmlDeviceGetSupportedEventTypes(void *device, _Out_ unsigned long long *types)',
  nvmlDeviceRegisterEvents: 'int nvmlDeviceRegisterEvents(void *device, unsigned long long types, void *set)',
  nvmlEventSetWait_v2: 'int nvmlEventSetWait_v2(void *set, uint8_t *data, unsigned int timeoutms)',
} as const;

export type NvmlFunction = keyof typeof DECLARATIONS;

type Bound = ((...args: unknown[]) => unknown) & { async: (...args: unknown[]) => void };

interface KoffiModule {
  load(path: string): { func(declaration: string): Bound; unload(): void };
  decode(pointer: unknown, type: string): unknown;
}

/** koffi, loaded on first use: a node without its prebuilt binary still runs on nvidia-smi. */
async function loadKoffi(): Promise<KoffiModule> {
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

/**
 * One call at a time, in order. Holds what runs now and since when, so that a poll can tell a
 * call stuck in the driver from a slow one and not queue more behind it.
 */
class Lane {
  private tail: Promise<unknown> = Promise.resolve();
  private current: { name: string; since: number } | undefined;

  /** The call running now, if any, and since when (ms, performance-free wall clock). */
  get running(): { readonly name: string; readonly since: number } | undefined {
    return this.current;
  }

  run<T>(name: string, work: () => Promise<T>): Promise<T> {
    const next = this.tail.then(async () => {
      this.current = { name, since: Date.now() };
      try {
        return await work();
      } finally {
        this.current = undefined;
      }
    });
    this.tail = next.catch(() => undefined);
    return next;
  }

  /** Resolves when every call queued so far has returned. */
  drained(): Promise<void> {
    return this.tail.then(() => undefined);
  }
}

export type NvmlLaneName = 'reads' | 'events';

/** An initialised NVML. */
export class NvmlLibrary {
  private readonly lanes: Record<NvmlLaneName, Lane> = { reads: new Lane(), events: new Lane() };
  private closed = false;
  private initialized = false;

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
   * nvmlInit_v2, off the event loop (it can take a second on a node with eight GPUs and
   * persistence mode off), until it has once succeeded. Throws NvmlError (driver not loaded, no
   * permission) so that a poll fails and the next one tries again.
   */
  async init(): Promise<void> {
    if (this.initialized) return;
    const code = await this.call('reads', 'nvmlInit_v2');
    if (code !== NVML.SUCCESS) throw this.error('nvmlInit_v2', code);
    this.initialized = true;
  }

  /** Whether the library exports this function. */
  has(name: NvmlFunction): boolean {
    return this.functions[name] !== undefined;
  }

  /** The call a lane is in right now, and since when (Unix ms). */
  running(lane: NvmlLaneName): { readonly name: string; readonly since: number } | undefined {
    return this.lanes[lane].running;
  }

  /**
   * Calls a function on a libuv pool thread, in the lane's turn; resolves with its nvmlReturn_t.
   * A function the library lacks answers ERROR_FUNCTION_NOT_FOUND without a call.
   */
  call(lane: NvmlLaneName, name: NvmlFunction, ...args: unknown[]): Promise<number> {
    const bound = this.functions[name];
    if (bound === undefined) return Promise.resolve(NVML.ERROR_FUNCTION_NOT_FOUND);
    if (this.closed) return Promise.reject(new Error(`NVML ${this.path} is shut down`));
    return this.lanes[lane].run(
      name,
      () =>
        new Promise<number>((resolve, reject) => {
          bound.async(...args, (error: unknown, result: unknown) => {
            if (error) reject(error instanceof Error ? error : new Error(String(error)));
            else resolve(Number(result));
          });
        }),
    );
  }

  /** nvmlErrorString's text for a code (a static string in the library: read on the main thread). */
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

  /**
   * Waits for the calls in flight (at most `waitMs`), then nvmlShutdown and unload. A call stuck
   * in the driver is left behind: the library then stays loaded, which is harmless.
   */
  async close(waitMs = 2_000): Promise<void> {
    if (this.closed) return;
    const drained = Promise.all([this.lanes.reads.drained(), this.lanes.events.drained()]).then(() => true);
    let timer: NodeJS.Timeout | undefined;
    const gaveUp = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => resolve(false), waitMs);
      timer.unref();
    });
    const done = await Promise.race([drained, gaveUp]);
    clearTimeout(timer);
    if (!done) {
      this.closed = true;
      return;
    }
    if (this.initialized) await this.call('reads', 'nvmlShutdown').catch(() => undefined);
    this.closed = true;
    this.library.unload();
  }
}
