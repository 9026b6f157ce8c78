import { PCI_BUS_ID_PATTERN } from '../../core/names.js';
import type { RemedyAction, RemediationEntry } from '../../core/remedy.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import type { Signal } from '../../core/signal.js';
import { NODE_LADDER_CITATION, type NodeVerb, type Step } from '../../core/steps.js';
import { alertMeaning, type Classification, type FaultVerdict } from './fault-class.js';

/**
 * The node ladder: what is done about a fault on a node that runs no registered job. A pure
 * function of the fault's classification (fault-class.ts, the one table), the node's remediation
 * history and the config. A machine fault takes the node out of service (ByteRobust §4.1:
 * high-confidence machine faults are isolated at once); any other is only observed, as a node
 * outside a job has no training to recover. The rung (docs/remedies.md) climbs from the catalogue's
 * remedy for the fault — reset the GPU, or reboot the node — as the rungs spent on the node within
 * the escalation window are used up: resets to a reboot, reboots to a hand-off to people. With
 * every rung off (the default) every such fault drains the node.
 */

export interface NodeRung {
  readonly verb: NodeVerb;
  readonly reason: string;
  /** The GPU to reset (PCI bus id), for `reset_gpu`. */
  readonly gpu?: string | undefined;
}

export type NodeChoice = { readonly observe: string } | { readonly node: string; readonly rung: NodeRung };

/** The node ladder's one step for a rung. */
export function nodeStep(node: string, rung: NodeRung): Step {
  return {
    verb: rung.verb,
    nodes: [node],
    ...(rung.gpu === undefined ? {} : { gpu: rung.gpu }),
    reason: rung.reason.slice(0, 512),
    citation: NODE_LADDER_CITATION,
  };
}

/** Why the node must come out of service, in the words its drain reason and audit carry. */
function outOfServiceReason(signal: Signal, verdict: FaultVerdict): string {
  const gpu = signal.gpu ?? 'unknown';
  if (signal.kind === 'gpu_lost') return `GPU ${gpu} is lost (no longer listed by nvidia-smi)`;
  // A code a configured policy acts on, fatal or not: the reason names the code and who decided.
  const policy = verdict.policy;
  if (policy !== undefined) {
    const where = policy.kind === 'sxid' ? `NVSwitch ${String(signal.evidence.nvswitch ?? signal.evidence['label.nvswitch'] ?? 'unknown')}` : `GPU ${gpu}`;
    return `${policy.kind === 'xid' ? 'Xid' : 'SXid'} ${policy.code} (${policy.meaning}) on ${where}: ${policy.source} says ${policy.action}`;
  }
  const alertname = signal.kind === 'alert' ? String(signal.evidence.alertname ?? '') : '';
  // An Xid, reported as one or named by the alert that counts it (the Xid remedy alerts).
  if (verdict.xid !== undefined) {
    const known = typeof signal.evidence.meaning === 'string' ? signal.evidence.meaning : verdict.xid.meaning;
    const meaning = known === 'unclassified' || known === 'Xid not in the catalogue' ? '' : ` (${known})`;
    return `fatal Xid ${verdict.xid.code}${meaning} on GPU ${gpu}${alertname ? `: ${alertname}` : ''}`;
  }
  if (alertname) return `${alertMeaning(alertname) ?? verdict.reason}: ${alertname}${signal.gpu ? ` on GPU ${signal.gpu}` : ''}`;
  return verdict.reason;
}

/** The rung for a machine fault on `node`, past the history (see climbNodeLadder). */
export function nodeRung(signal: Signal, verdict: FaultVerdict, history: readonly RemediationEntry[], config: RemediesConfig, now: number): NodeRung {
  const drainReason = outOfServiceReason(signal, verdict);
  const since = now - config.escalation.windowSeconds * 1000;
  const windowText = `${config.escalation.windowSeconds} s`;
  const reboots = spent(history, 'reboot', since).length;

  const rebootRung = (why: string): NodeRung => {
    if (reboots >= config.escalation.rebootsBeforeHandOff) {
      return { verb: 'hand_off', reason: `${drainReason}; ${reboots} reboots within ${windowText} did not hold: needs hands` };
    }
    return { verb: 'reboot', reason: `${drainReason}; ${why}` };
  };

  // A configured hand-off needs no rung below it: people are asked at once.
  if (verdict.policy?.action === 'hand_off') return { verb: 'hand_off', reason: `${drainReason}: needs hands` };
  const decidedBy = verdict.policy === undefined ? "the catalogue's remedy" : `the ${verdict.policy.source}'s action`;

  if (resetApplies(signal, verdict, config)) {
    const resets = spent(history, 'reset_gpu', since);
    if (resets.length >= config.escalation.resetsBeforeReboot) {
      const why = `${resets.length} GPU resets within ${windowText}`;
      if (config.reboot.enabled) return rebootRung(`${why}: reboot`);
      return { verb: 'hand_off', reason: `${drainReason}; ${why} did not hold: needs hands` };
    }
    const other = resets.find((entry) => entry.gpu !== undefined && entry.gpu !== signal.gpu);
    if (other?.gpu !== undefined)
      return { verb: 'drain', reason: `${drainReason}; GPU ${other.gpu} of this node needed a reset too within ${windowText}: not one GPU's fault` };
    return { verb: 'reset_gpu', gpu: signal.gpu, reason: `${drainReason}; ${decidedBy} is a GPU reset` };
  }
  if (verdict.remedy === 'reboot_node' && config.reboot.enabled) return rebootRung(`${decidedBy} is a node reboot`);
  // A configured remedy that cannot be taken says why it drains instead; the catalogue's, as ever, drains quietly.
  if (verdict.policy?.action === 'reset') {
    const blocker = config.gpuReset.enabled ? 'the signal names no GPU by PCI bus id' : 'GPU resets are off (remedies.gpuReset.enabled)';
    return { verb: 'drain', reason: `${drainReason}; ${blocker}: drain` };
  }
  if (verdict.policy?.action === 'reboot') return { verb: 'drain', reason: `${drainReason}; node reboots are off (remedies.reboot.enabled): drain` };
  return { verb: 'drain', reason: drainReason };
}

/**
 * Where a node outside any job goes for this fault: observe it, or the rung to take. `history` is
 * the node's remediation history, read only when the rung depends on it (nodeLadderNeedsHistory).
 */
export function climbNodeLadder(
  signal: Signal,
  verdict: Classification,
  history: readonly RemediationEntry[],
  config: RemediesConfig,
  now: number,
): NodeChoice {
  if (signal.evidence.status === 'resolved') return { observe: 'alert resolved; a drained node stays drained until an operator resumes it' };
  if (verdict.verdict === 'ignore') return { observe: verdict.reason };
  if (verdict.faultClass !== 'machine' || verdict.node === undefined) {
    return {
      observe: `no automatic action for ${signal.kind} signals of severity ${signal.severity} outside a job (${verdict.faultClass} fault: ${verdict.reason})`,
    };
  }
  return { node: verdict.node, rung: nodeRung(signal, verdict, history, config, now) };
}

/**
 * Whether the rung depends on the node's history: only when the rung the catalogue names for
 * the fault is on. Otherwise (every rung off, the default) the answer is a drain whatever the
 * history holds, and the fault's way to its drain need not wait for a read of it.
 */
export function nodeLadderNeedsHistory(signal: Signal, verdict: Classification, config: RemediesConfig): boolean {
  if (verdict.verdict === 'ignore' || verdict.faultClass !== 'machine') return false;
  return resetApplies(signal, verdict, config) || (verdict.remedy === 'reboot_node' && config.reboot.enabled);
}

/** climbNodeLadder, reading the node's history only when the choice depends on it. */
export async function climbNodeLadderReading(
  signal: Signal,
  verdict: Classification,
  readHistory: () => Promise<readonly RemediationEntry[]>,
  config: RemediesConfig,
  now: () => number = Date.now,
): Promise<NodeChoice> {
  const history = nodeLadderNeedsHistory(signal, verdict, config) ? await readHistory() : [];
  return climbNodeLadder(signal, verdict, history, config, now());
}

function resetApplies(signal: Signal, verdict: FaultVerdict, config: RemediesConfig): boolean {
  return verdict.remedy === 'reset_gpu' && config.gpuReset.enabled && signal.gpu !== undefined && PCI_BUS_ID_PATTERN.test(signal.gpu);
}

function spent(history: readonly RemediationEntry[], action: RemedyAction, sinceMs: number): RemediationEntry[] {
  return history.filter((entry) => entry.action === action && entry.outcome !== 'refused' && Date.parse(entry.time) >= sinceMs);
}
