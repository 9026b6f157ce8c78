import type { Signal } from '../../core/signal.js';

/**
 * The policy for a signal about a node that runs no registered training job: what to do about
 * it. A pure function; claiming, enqueueing and auditing happen in the worker around it. It
 * follows ByteRobust's real-time checks (§4.1): a fault with an explicit, high-confidence machine
 * signal — a fatal Xid, a GPU gone from the bus — drains the node at once; anything else is only
 * observed. Signals about a registered job's nodes go to that job's recovery ladder instead
 * (controller/policy/ladder/), which has every rung.
 */

export type PolicyOutcome =
  | { readonly verb: 'drain'; readonly node: string; readonly reason: string }
  | { readonly verb: 'observe'; readonly reason: string };

/**
 * Alerts from the node-health rules (rules/domains/gpu-node.ts) that name hardware which cannot
 * carry work: the node is drained as for a fatal Xid.
 */
const DRAIN_ALERTS: Readonly<Record<string, string>> = {
  SteadfastGpuDrainRequired: 'GPU memory cannot be repaired in place (row remap failed)',
  SteadfastNvswitchFatal: 'fatal NVSwitch error (SXid)',
  SteadfastNvlinkLinkFailing: 'NVLink link failing (error counters past the threshold)',
  SteadfastGpuFabricNotReady: 'GPU fabric not ready (fabric manager registration)',
  SteadfastGpuDriverHung: 'NVIDIA driver hung (tasks blocked in the driver)',
  SteadfastPcieAerFatal: 'fatal PCIe AER error',
};

export function decide(signal: Signal): PolicyOutcome {
  if (signal.evidence.status === 'resolved') {
    return { verb: 'observe', reason: 'alert resolved; a drained node stays drained until an operator resumes it' };
  }
  if (!signal.node) return { verb: 'observe', reason: 'signal names no node' };
  if (signal.kind === 'xid' && signal.severity === 'critical') {
    const xid = signal.evidence.xid ?? '?';
    const meaning = typeof signal.evidence.meaning === 'string' ? ` (${signal.evidence.meaning})` : '';
    return {
      verb: 'drain',
      node: signal.node,
      reason: `fatal Xid ${xid}${meaning} on GPU ${signal.gpu ?? 'unknown'}`,
    };
  }
  const alertname = signal.kind === 'alert' ? String(signal.evidence.alertname ?? '') : '';
  const drainAlert = DRAIN_ALERTS[alertname];
  if (drainAlert !== undefined) {
    return { verb: 'drain', node: signal.node, reason: `${drainAlert}: ${alertname}${signal.gpu ? ` on GPU ${signal.gpu}` : ''}` };
  }
  if (signal.kind === 'gpu_lost') {
    return { verb: 'drain', node: signal.node, reason: `GPU ${signal.gpu ?? 'unknown'} is lost (no longer listed by nvidia-smi)` };
  }
  return { verb: 'observe', reason: `no automatic action for ${signal.kind} signals of severity ${signal.severity}` };
}
