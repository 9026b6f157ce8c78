/**
 * Why the clocks are held down: the clocks-event-reason bits shared by NVML
 * (nvmlClocksEventReason*, nvml.h) and DCGM (DCGM_CLOCKS_EVENT_REASON_*, dcgm_fields.h), each
 * named as nvidia-smi's XML names the reason (`clocks_event_reason_<name>`).
 */
export const CLOCK_EVENT_BITS: readonly { readonly bit: number; readonly reason: string }[] = [
  { bit: 0x1, reason: 'gpu_idle' },
  { bit: 0x2, reason: 'applications_clocks_setting' },
  { bit: 0x4, reason: 'sw_power_cap' },
  { bit: 0x8, reason: 'hw_slowdown' },
  { bit: 0x10, reason: 'sync_boost' },
  { bit: 0x20, reason: 'sw_thermal_slowdown' },
  { bit: 0x40, reason: 'hw_thermal_slowdown' },
  { bit: 0x80, reason: 'hw_power_brake_slowdown' },
  { bit: 0x100, reason: 'display_clocks_setting' },
];

/** The order `<clocks_event_reasons>` lists them in (v11 to v13), which the NVML source keeps. */
export const XML_REASON_ORDER: readonly string[] = [
  'gpu_idle',
  'applications_clocks_setting',
  'sw_power_cap',
  'hw_slowdown',
  'hw_thermal_slowdown',
  'hw_power_brake_slowdown',
  'sync_boost',
  'sw_thermal_slowdown',
  'display_clocks_setting',
];
