import { FAULT_CITATIONS } from '../../core/ladder.js';
import { agentSelector, newEvents } from '../../core/promql.js';
import type { Thresholds } from '../thresholds.js';
import { alert, humanDuration, type RuleGroup } from '../spec.js';

/**
 * What the agent sees of a GPU node beyond the GPU's own readings: the NVLink fabric (per-link
 * error counters, NVSwitch SXids, fabric registration), the action the GPU's memory state asks
 * for (steadfast_gpu_health_action), the host kernel's verdicts that take GPUs with them (a
 * driver hung in the kernel, a fatal PCIe error), and the monitor's own GPU queries hanging.
 * Kernel-log counters start from the whole log at every agent start, so they are read with
 * newEvents (rules/README.md); the GPU's own counters (NVLink) with increase().
 */
export function gpuNodeGroup(t: Thresholds): RuleGroup {
  const agent = (labels: Parameters<typeof agentSelector>[0] = {}): string => agentSelector(labels, t.selectors.agentJob);
  const g = t.gpu;
  return {
    name: 'steadfast-gpu-node',
    rules: [
      // A link whose replay, recovery or CRC counts climb this fast is failing (NVIDIA's NVLink
      // troubleshooting: rising recovery and CRC counts mean a bad link or connector). Jobs using it
      // stall or die with NVLink Xids; take the node out before they do.
      alert({
        alert: 'SteadfastNvlinkLinkFailing',
        expr: `sum without (type) (increase(steadfast_gpu_nvlink_errors_total${agent()}[${g.nvlinkWindow}])) > ${g.nvlinkErrorIncrease}`,
        for: '0s',
        severity: 'critical',
        summary: 'An NVLink link is counting errors fast.',
        description: `Link {{ $labels.link }} of GPU {{ $labels.gpu }} on node {{ $labels.node }} counted more than ${g.nvlinkErrorIncrease} replay, recovery and CRC errors in the last ${humanDuration(g.nvlinkWindow)}. The node must be drained.`,
        runbook: 'steadfast-nvlink-link-failing.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'NVLink link failing (error counters past the threshold)',
        },
      }),
      alert({
        alert: 'SteadfastNvswitchFatal',
        expr: `${newEvents(`steadfast_nvswitch_sxid_errors_total${agent({ severity: 'fatal' })}`, g.kernelWindow)} > 0`,
        for: '0s',
        severity: 'critical',
        summary: 'An NVSwitch reported a fatal SXid error.',
        description: `NVSwitch {{ $labels.nvswitch }} on node {{ $labels.node }} logged fatal SXid {{ $labels.sxid }}; NVLink traffic through it stalls. The node must be drained.`,
        runbook: 'steadfast-nvswitch-fatal.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'fatal NVSwitch error (SXid)',
        },
      }),
      // Until the fabric manager has registered a GPU with the NVSwitch fabric, CUDA cannot use it.
      alert({
        alert: 'SteadfastGpuFabricNotReady',
        expr: `steadfast_gpu_fabric_state${agent()} == 1 unless steadfast_gpu_fabric_state${agent({ state: 'completed' })}`,
        for: g.fabricNotReadyFor,
        severity: 'critical',
        summary: 'A GPU is not registered with its NVLink fabric.',
        description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} has had fabric state {{ $labels.state }} for ${humanDuration(g.fabricNotReadyFor)}; is the fabric manager running? The node must be drained.`,
        runbook: 'steadfast-gpu-fabric-not-ready.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'GPU fabric not ready (fabric manager registration)',
        },
      }),
      alert({
        alert: 'SteadfastGpuDrainRequired',
        expr: `steadfast_gpu_health_action${agent({ action: 'drain' })} == 1`,
        for: '0s',
        severity: 'critical',
        summary: 'A GPU must leave service now.',
        description:
          'GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} needs a drain ({{ $labels.reason }}). The node must be drained.',
        runbook: 'steadfast-gpu-drain-required.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'GPU memory cannot be repaired in place (row remap failed)',
        },
      }),
      alert({
        alert: 'SteadfastGpuResetRequired',
        expr: `steadfast_gpu_health_action${agent({ action: 'reset_gpu' })} == 1`,
        for: g.remapPendingFor,
        severity: 'warning',
        labels: { remedy: 'reset_gpu' },
        summary: 'A GPU needs a reset at its next idle moment.',
        description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} has needed a reset ({{ $labels.reason }}) for ${humanDuration(g.remapPendingFor)}; reset it when no job uses it.`,
        runbook: 'steadfast-gpu-reset-required.md',
        // A reset is due at the next idle moment (a pending remap, retired pages); the GPU still works.
        meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: FAULT_CITATIONS.transient, route: 'controller' },
      }),
      alert({
        alert: 'SteadfastGpuCorrectableErrorsHigh',
        expr: `sum without (location) (increase(steadfast_gpu_ecc_errors_total${agent({ scope: 'volatile', type: 'correctable' })}[${g.correctableWindow}])) > ${g.correctableErrors}`,
        for: '0s',
        severity: 'warning',
        summary: 'A GPU is correcting many memory errors.',
        description: `GPU {{ $labels.gpu }} ({{ $labels.pci_bus_id }}) on node {{ $labels.node }} corrected more than ${g.correctableErrors} ECC errors in the last ${humanDuration(g.correctableWindow)}; watch it for row remaps and uncorrectable errors.`,
        runbook: 'steadfast-gpu-correctable-errors-high.md',
        // A precursor to watch: the multi-signal detector weighs it; alone it moves no job.
        meaning: { role: 'fault', faultClass: 'transient', signal: 'alert', citation: FAULT_CITATIONS.transient, route: 'controller' },
      }),
      alert({
        alert: 'SteadfastGpuDriverHung',
        expr: `${newEvents(`steadfast_kernel_events_total${agent({ kind: 'hung_task_nvidia' })}`, g.kernelWindow)} > 0`,
        for: '0s',
        severity: 'critical',
        summary: 'A task is stuck inside the NVIDIA driver.',
        description:
          'The kernel on node {{ $labels.node }} reported a task blocked in an NVIDIA kernel module; GPU work on the node hangs. The node must be drained.',
        runbook: 'steadfast-gpu-driver-hung.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'NVIDIA driver hung (tasks blocked in the driver)',
        },
      }),
      alert({
        alert: 'SteadfastPcieAerFatal',
        expr: `${newEvents(`steadfast_pcie_aer_errors_total${agent({ severity: 'fatal' })}`, g.kernelWindow)} > 0`,
        for: '0s',
        severity: 'critical',
        summary: 'A PCIe device reported a fatal error.',
        description:
          'PCIe device {{ $labels.pci_address }} on node {{ $labels.node }} reported an uncorrectable fatal AER error; devices behind it (GPUs, NICs) may be gone. The node must be drained.',
        runbook: 'steadfast-pcie-aer-fatal.md',
        meaning: {
          role: 'fault',
          faultClass: 'machine',
          signal: 'alert',
          citation: FAULT_CITATIONS.machine,
          route: 'controller',
          drainReason: 'fatal PCIe AER error',
        },
      }),
      // The monitor itself: an nvidia-smi or dcgm-exporter query killed at its time limit is
      // what a hung driver looks like from user space (NVIDIA/gpu-monitoring-tools#46).
      alert({
        alert: 'SteadfastGpuQueryStuck',
        expr: `${newEvents(`steadfast_gpu_query_failures_total${agent({ reason: 'timeout' })}`, g.queryStuckWindow)} > 0`,
        for: '0s',
        severity: 'warning',
        summary: 'A GPU query on a node hung until it was killed.',
        description: `{{ $labels.command }} on node {{ $labels.node }} did not answer within its time limit ({{ printf "%.0f" $value }} in the last ${humanDuration(g.queryStuckWindow)}); the GPU driver may be hung.`,
        runbook: 'steadfast-gpu-query-stuck.md',
        // The agent cannot read the GPUs: a wedged driver or an overloaded node; look before moving.
        meaning: { role: 'fault', faultClass: 'performance', signal: 'alert', citation: FAULT_CITATIONS.performance, route: 'controller' },
      }),
    ],
  };
}
