import type { Counter, Registry } from 'prom-client';
import { InputError, errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import { readFlag, type CollectorSettings } from './flags.js';
import type { CollectorPaths } from './paths.js';
import { DCGM_EXPORTER_URL_FLAG, dcgmExporterUrl } from './sources/dcgm-exporter.js';
import { NvmlUnavailableError, nvmlErrorName, type NvmlFunction } from './sources/nvml/library.js';
import { NvmlClient } from './sources/nvml/client.js';
import { sharedCounter, sharedGauge } from './shared-metrics.js';

/**
 * Where the agent reads its GPUs, chosen once per agent and shared by the collectors that read
 * them (gpu, nvlink): `--gpu.source auto|nvml|nvidia-smi|dcgm-exporter`. `auto` reads NVML
 * in-process when libnvidia-ml.so.1 loads (through koffi), else runs nvidia-smi; a
 * `--gpu.dcgm-exporter-url`, `--nvidia-smi.xml` or `--nvidia-smi.path` other than the default
 * given with `auto` picks that source, as before the flag existed. The library is loaded once, initialised at the first poll that can (a driver
 * loaded after the agent started is picked up), and shut down when the last collector using it
 * closes.
 */

export const GPU_SOURCE_FLAG = 'gpu.source';
export const NVML_LIBRARY_FLAG = 'gpu.nvml-library';
export const DEFAULT_NVML_LIBRARY = 'libnvidia-ml.so.1';
/** `--nvidia-smi.path`'s default: any other path, given with `auto`, is an nvidia-smi the operator chose. */
export const DEFAULT_NVIDIA_SMI = 'nvidia-smi';
export const GPU_SOURCES = ['auto', 'nvml', 'nvidia-smi', 'dcgm-exporter'] as const;
export type GpuSourceSetting = (typeof GPU_SOURCES)[number];

export type ResolvedGpuSource =
  | { readonly kind: 'nvml'; readonly nvml: NvmlClient }
  /** `nvml` asked for and the library cannot be loaded: every poll fails with this reason. */
  | { readonly kind: 'nvml-unavailable'; readonly reason: string }
  | { readonly kind: 'nvidia-smi' }
  | { readonly kind: 'dcgm-exporter'; readonly url: URL };

/** The settings' choice, checked: an unknown source, or dcgm-exporter without its URL, is an InputError naming the flag. */
export function gpuSourceSetting(settings: CollectorSettings): { source: GpuSourceSetting; url: URL | undefined; library: string } {
  const raw = readFlag(settings, GPU_SOURCE_FLAG, 'string', 'auto');
  if (!(GPU_SOURCES as readonly string[]).includes(raw)) {
    throw new InputError(`--${GPU_SOURCE_FLAG}: must be one of ${GPU_SOURCES.join(', ')}, got "${raw}"`, `--${GPU_SOURCE_FLAG}`);
  }
  const source = raw as GpuSourceSetting;
  const url = dcgmExporterUrl(readFlag(settings, DCGM_EXPORTER_URL_FLAG, 'string'));
  if (source === 'dcgm-exporter' && url === undefined) {
    throw new InputError(`--${GPU_SOURCE_FLAG}=dcgm-exporter needs --${DCGM_EXPORTER_URL_FLAG}`, `--${DCGM_EXPORTER_URL_FLAG}`);
  }
  const library = readFlag(settings, NVML_LIBRARY_FLAG, 'path', DEFAULT_NVML_LIBRARY);
  return { source, url, library };
}

export interface GpuSourceOptions {
  readonly settings: CollectorSettings;
  readonly paths: CollectorPaths;
  readonly logger: Logger;
  readonly registry: Registry;
}

/** Shared by the collectors of one agent (CollectorContext.gpuSource). */
export class GpuSourceChoice {
  private readonly setting;
  private resolved: Promise<ResolvedGpuSource> | undefined;
  private users = 0;
  private nvmlErrors: Counter<'function' | 'error'> | undefined;

  constructor(private readonly options: GpuSourceOptions) {
    this.setting = gpuSourceSetting(options.settings);
  }

  /** The source, resolved at the first call; each caller that gets NVML must release() it when it closes. */
  acquire(): Promise<ResolvedGpuSource> {
    this.users++;
    this.resolved ??= this.resolve();
    return this.resolved;
  }

  /** The last user's release shuts NVML down. */
  async release(): Promise<void> {
    this.users = Math.max(0, this.users - 1);
    if (this.users > 0 || this.resolved === undefined) return;
    const resolved = await this.resolved;
    if (resolved.kind === 'nvml') await resolved.nvml.close();
  }

  /** Counts an NVML call that failed (not "not supported"): steadfast_gpu_nvml_errors_total. */
  nvmlFailed(name: NvmlFunction, code: number): void {
    this.nvmlErrors ??= nvmlErrorCounter(this.options.registry);
    this.nvmlErrors.inc({ function: name, error: nvmlErrorName(code) });
  }

  private async resolve(): Promise<ResolvedGpuSource> {
    const { source, url, library } = this.setting;
    const { logger, paths } = this.options;
    let resolved: ResolvedGpuSource;
    if (source === 'dcgm-exporter' || (source === 'auto' && url !== undefined)) resolved = { kind: 'dcgm-exporter', url: url as URL };
    else if (source === 'nvidia-smi' || (source === 'auto' && (paths.nvidiaSmiXml !== undefined || paths.nvidiaSmi !== DEFAULT_NVIDIA_SMI)))
      resolved = { kind: 'nvidia-smi' };
    else {
      try {
        const nvml = await NvmlClient.start(library);
        nvml.on('failures', (failures) => {
          for (const [name, code] of failures) this.nvmlFailed(name, code);
        });
        resolved = { kind: 'nvml', nvml };
      } catch (error) {
        const reason = error instanceof NvmlUnavailableError ? error.message : `cannot load ${library}: ${errorMessage(error)}`;
        if (source === 'nvml') {
          logger.error(
            { collector: 'gpu', library, err: reason },
            'NVML cannot be loaded; GPU polls fail until the agent is restarted with a library that loads',
          );
          resolved = { kind: 'nvml-unavailable', reason };
        } else {
          logger.info({ collector: 'gpu', library, reason }, 'NVML not available; reading the GPUs with nvidia-smi');
          resolved = { kind: 'nvidia-smi' };
        }
      }
    }
    if (resolved.kind === 'nvml') this.reportEntryPoints(resolved.nvml);
    this.exportChoice(resolved);
    return resolved;
  }

  /**
   * Which entry point the library gives for each reading that has several across drivers, in the
   * log and as steadfast_gpu_nvml_function_info; a reading it has none for is said plainly
   * (an R450 library without a usable process list: no GPU processes, so no ranks found from them).
   */
  private reportEntryPoints(nvml: NvmlClient): void {
    const { logger, registry } = this.options;
    const gauge = sharedGauge(registry, {
      name: NVML_FUNCTION_INFO,
      help: 'The NVML entry point the agent uses for each reading that differs across driver versions (function "none": the library has none, the values are not read); always 1.',
      labelNames: ['reading', 'function'],
    });
    for (const [reading, name] of Object.entries(nvml.entryPoints)) gauge.set({ reading, function: name ?? 'none' }, 1);
    logger.info({ collector: 'gpu', library: nvml.library, entryPoints: nvml.entryPoints }, 'reading the GPUs through NVML');
    const missing = Object.entries(nvml.entryPoints).filter(([, name]) => name === undefined);
    if (missing.length > 0)
      logger.warn(
        { collector: 'gpu', library: nvml.library, readings: missing.map(([reading]) => reading) },
        'this NVML library lacks the calls for some readings (an older driver); their values are not read',
      );
  }

  private exportChoice(resolved: ResolvedGpuSource): void {
    const gauge = sharedGauge(this.options.registry, {
      name: GPU_SOURCE_INFO,
      help: 'Where the agent reads its GPUs (--gpu.source): nvml (in-process), nvidia-smi, or dcgm-exporter; always 1.',
      labelNames: ['source'],
    });
    gauge.set({ source: resolved.kind === 'nvml-unavailable' ? 'nvml' : resolved.kind }, 1);
  }
}

export const GPU_SOURCE_INFO = 'steadfast_gpu_source_info';
const NVML_FUNCTION_INFO = 'steadfast_gpu_nvml_function_info';

function nvmlErrorCounter(registry: Registry): Counter<'function' | 'error'> {
  return sharedCounter(registry, {
    name: 'steadfast_gpu_nvml_errors_total',
    help: 'NVML calls that failed, by function and error (gpu_is_lost, timeout, unknown, …); a value the GPU does not support is not counted.',
    labelNames: ['function', 'error'],
  });
}
