import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector } from '../../core/promql.js';
import { alert, humanDuration, type DomainRules } from '../spec.js';
import { gpuNodeGroup } from './gpu-node.js';

/**
 * GPU health from the agent's gpu collector (nvidia-smi or dcgm-exporter as the source): a GPU
 * gone from the bus, memory errors the hardware could not correct or repair, and heat or
 * hardware slowdowns that cost a synchronous job its throughput. Series carry `gpu` and
 * `pci_bus_id`; the scrape adds `node`.
 */

/**
 * The clock-event reasons that mean the hardware is protecting itself (over temperature, power
 * brake, an external slowdown signal). The others (idle, sw_power_cap, application clocks,
 * sync boost) follow configuration or load and say nothing about the GPU's health.
 */
const HARDWARE_SLOWDOWN_REASONS = ['hw_slowdown', 'hw_thermal_slowdown', 'hw_power_brake_slowdown', 'sw_thermal_slowdown'] as const;

export const rules: DomainRules = {
  domain: 'gpu',
  groups: (t) => [
    {
      name: 'steadfast-gpu',
      rules: [
        // `steadfast_gpu_present` is 0 once a GPU the source listed before is gone (fell off the
        // bus, lost by the driver). One bad listing is not enough; two scrapes apart are
        // (ByteRobust §4.1 detects a lost GPU within 10 s).
        alert({
          alert: 'SteadfastGpuLost',
          expr: `steadfast_gpu_present${agentSelector({}, t.selectors.agentJob)} == 0`,
          for: t.gpu.lostFor,
          severity: 'critical',
          summary: 'A GPU disappeared from its node.',
          description:
            'GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} is no longer listed by nvidia-smi (present = {{ $value }}). steadfast drains the node.',
          runbook: 'steadfast-gpu-lost.md',
          meaning: { role: 'fault', faultClass: 'machine', signal: 'gpu_lost', citation: FAULT_CITATIONS.machine, route: 'controller' },
        }),
        // Volatile counts run since the driver loaded; only a rise is news. The location (SRAM,
        // DRAM, ...) and, with MIG on, the MIG device (whose own counts are the GPU's volatile
        // ones) are summed away: one alert per GPU, the runbook says where to look.
        alert({
          alert: 'SteadfastGpuEccUncorrectable',
          expr: `sum without (location, scope, type, GPU_I_ID, compute_instance_id) (increase(steadfast_gpu_ecc_errors_total${agentSelector({ scope: 'volatile', type: 'uncorrectable' }, t.selectors.agentJob)}[${t.gpu.eccWindow}])) > 0`,
          for: '0s',
          severity: 'critical',
          summary: 'A GPU counted uncorrectable ECC errors.',
          description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} counted {{ printf "%.0f" $value }} new uncorrectable ECC error(s) in the last ${humanDuration(t.gpu.eccWindow)}. Data on this GPU may be corrupt.`,
          runbook: 'steadfast-gpu-ecc-uncorrectable.md',
          meaning: { role: 'fault', faultClass: 'machine', signal: 'alert', citation: FAULT_CITATIONS.machine, route: 'controller' },
        }),
        // The driver sets the failure flag when it ran out of spare rows; it stays set until
        // the GPU is repaired, so one evaluation is enough.
        alert({
          alert: 'SteadfastGpuRowRemapFailed',
          expr: `steadfast_gpu_remapped_rows_failure${agentSelector({}, t.selectors.agentJob)} == 1`,
          for: '0s',
          severity: 'critical',
          summary: 'A GPU failed to remap a faulty memory row.',
          description:
            'GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} could not remap a faulty memory row; the GPU needs repair or replacement.',
          runbook: 'steadfast-gpu-row-remap-failed.md',
          meaning: { role: 'fault', faultClass: 'machine', signal: 'alert', citation: FAULT_CITATIONS.machine, route: 'controller' },
        }),
        alert({
          alert: 'SteadfastGpuRowRemapPending',
          expr: `steadfast_gpu_remapped_rows_pending${agentSelector({}, t.selectors.agentJob)} == 1`,
          for: t.gpu.remapPendingFor,
          severity: 'warning',
          summary: 'A GPU has a memory row remap waiting for a GPU reset.',
          description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} has had a row remap pending for ${humanDuration(t.gpu.remapPendingFor)}; it takes effect at the next GPU reset.`,
          runbook: 'steadfast-gpu-row-remap-pending.md',
          // A pending remap takes effect at the next GPU reset; nothing is broken yet.
          meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: FAULT_CITATIONS.transient, route: 'controller' },
        }),
        alert({
          alert: 'SteadfastGpuTemperatureHigh',
          expr: `steadfast_gpu_temperature_celsius${agentSelector({}, t.selectors.agentJob)} > ${t.gpu.temperatureCelsius}`,
          for: t.gpu.temperatureFor,
          severity: 'warning',
          summary: 'A GPU has run hot for several minutes.',
          description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} has been above ${t.gpu.temperatureCelsius} °C for ${humanDuration(t.gpu.temperatureFor)} (now {{ printf "%.0f" $value }} °C).`,
          runbook: 'steadfast-gpu-temperature-high.md',
          meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
        }),
        alert({
          alert: 'SteadfastGpuHardwareSlowdown',
          expr: `steadfast_gpu_throttle_reason${agentSelector({ reason: { oneOf: HARDWARE_SLOWDOWN_REASONS } }, t.selectors.agentJob)} == 1`,
          for: t.gpu.throttleFor,
          severity: 'warning',
          summary: 'A GPU has been slowed down by its hardware protection.',
          description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} has had its clocks held down by {{ $labels.reason }} for ${humanDuration(t.gpu.throttleFor)}; every rank waits for it.`,
          runbook: 'steadfast-gpu-hardware-slowdown.md',
          meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
        }),
      ],
    },
    gpuNodeGroup(t),
  ],
};
