import type { Counter, Registry } from 'prom-client';
import { sharedCounter } from '../../shared-metrics.js';

/**
 * The monitor's own health: every GPU query (nvidia-smi, dcgm-exporter) that times out or fails
 * is counted, so a hung driver shows as a rising counter instead of a silent gap in the GPU
 * series. Shared by the collectors that query the GPU; the one counter lives on the agent's
 * registry, made by whichever collector asks first.
 */

export const GPU_QUERY_FAILURES = 'steadfast_gpu_query_failures_total';

export type GpuQueryFailure = 'timeout' | 'error';

export function gpuQueryFailures(registry: Registry): Counter<'command' | 'reason'> {
  return sharedCounter(registry, {
    name: GPU_QUERY_FAILURES,
    help: 'GPU queries that did not answer, by command (nvidia-smi -q -x, nvidia-smi nvlink -e, nvml, dcgm-exporter) and reason: timeout (past its time limit; a hung driver) or error.',
    labelNames: ['command', 'reason'],
  });
}

/** Whether an execFile / fetch failure was its time limit rather than an error of the command. */
export function isTimeout(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  // execFile kills at `timeout` and reports `killed`; AbortSignal.timeout() rejects with a TimeoutError.
  if ('killed' in error && error.killed === true) return true;
  return error.name === 'TimeoutError';
}
