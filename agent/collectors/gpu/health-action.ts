import type { GpuSample } from '../../sources/nvidia-smi-xml.js';

/**
 * What a GPU's memory and clock state asks for, in the order that matters: a GPU that could not
 * remap a failed row has no spare left and must leave service now; a remap or a page retirement
 * waiting for a reset takes effect at the next GPU reset, so the GPU should be reset when it is
 * next idle (NVIDIA's memory error management guide: pending remaps apply at reset, and Xid 63 /
 * 64 name the same two states); a clock held down by hardware protection is worth watching. The
 * rates and counts over time (correctable errors, retired pages) are judged by the rules.
 */

export type GpuHealthActionName = 'drain' | 'reset_gpu' | 'watch' | 'none';

export interface GpuHealthAction {
  readonly action: GpuHealthActionName;
  /** Short, fixed label values: row_remap_failed, row_remap_pending, page_retirement_pending, hardware_slowdown, healthy. */
  readonly reason: string;
}

/** Clock-event reasons that mean the hardware is protecting itself (the same set the slowdown alert uses). */
const HARDWARE_SLOWDOWN_REASONS = ['hw_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown'];

export function gpuHealthAction(sample: GpuSample): GpuHealthAction {
  if (sample.remappedRows?.failure === true) return { action: 'drain', reason: 'row_remap_failed' };
  if (sample.remappedRows?.pending === true) return { action: 'reset_gpu', reason: 'row_remap_pending' };
  if (sample.retiredPages?.pending === true) return { action: 'reset_gpu', reason: 'page_retirement_pending' };
  if (HARDWARE_SLOWDOWN_REASONS.some((reason) => sample.throttleReasons?.[reason] === true)) return { action: 'watch', reason: 'hardware_slowdown' };
  return { action: 'none', reason: 'healthy' };
}
