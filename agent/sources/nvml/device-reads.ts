import { cString, NVML, NvmlError, type NvmlDevice, type NvmlFunction, type NvmlLibrary } from './library.js';

/** The NVML calls of one device (a GPU, or one of its MIG devices), each turned into a value or undefined. */

export interface NvmlReadOptions {
  /** Reads the NVLink error counters too (the nvlink collector's series). */
  readonly nvlink?: boolean | undefined;
  /** Reads the processes on each GPU, and their names. */
  readonly processes?: boolean | undefined;
  /** A call that failed for another reason than "not supported". */
  readonly failed: (name: NvmlFunction, code: number) => void;
}

/**
 * A call answered NVML_ERROR_GPU_IS_LOST (the GPU fell off the bus): the device's other reads are
 * not made, and the GPU is left out of the poll, so that it shows as not present.
 */
export class GpuLostError extends NvmlError {}

export class DeviceReads {
  constructor(
    readonly nvml: NvmlLibrary,
    readonly device: NvmlDevice,
    readonly options: NvmlReadOptions,
  ) {}

  /** The same reads on another handle (a MIG device of this GPU). */
  on(device: NvmlDevice): DeviceReads {
    return new DeviceReads(this.nvml, device, this.options);
  }

  /** Calls `name` on the device and answers its code, counting nothing; throws GpuLostError when the GPU is lost. */
  attempt(name: NvmlFunction, ...args: unknown[]): number {
    const code = this.nvml.call(name, this.device, ...args);
    if (code === NVML.ERROR_GPU_IS_LOST) throw new GpuLostError(name, code, this.nvml.describe(code));
    return code;
  }

  /** Counts `code` as a failure of `name` unless it is success, "not supported", a missing entry point or one of `usual`. */
  count(name: NvmlFunction, code: number, usual: readonly number[] = []): number {
    if (code !== NVML.SUCCESS && code !== NVML.ERROR_NOT_SUPPORTED && code !== NVML.ERROR_FUNCTION_NOT_FOUND && !usual.includes(code))
      this.options.failed(name, code);
    return code;
  }

  /** Calls `name` and answers its code; codes other than success, "not supported" and `usual` are counted. */
  nvmlCode(name: NvmlFunction, usual: readonly number[], ...args: unknown[]): number {
    return this.count(name, this.attempt(name, ...args), usual);
  }

  /** Calls `name`; whether it succeeded (a failure other than "not supported" is counted). */
  ok(name: NvmlFunction, ...args: unknown[]): boolean {
    return this.nvmlCode(name, [], ...args) === NVML.SUCCESS;
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

/** NVML_STRUCT_VERSION: a versioned struct's size with its version in the top byte. */
export function structVersion(size: number, version: number): number {
  return (size | (version << 24)) >>> 0;
}
