import type { DecisionVerb } from '../../core/action.js';
import { PCI_BUS_ID_PATTERN } from '../../core/names.js';
import type { RemedyAction, RemediationEntry } from '../../core/remedy.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import type { Signal } from '../../core/signal.js';
import { classifyXid } from '../../core/xid.js';

/**
 * Which remedy a fault that would drain a node gets instead (docs/remedies.md). A pure function
 * of the signal, the node's remediation history and the config: the catalogue's remedy for the
 * Xid picks the first rung (reset the GPU, or reboot the node), and the rungs spent on the node
 * within the escalation window move it up — resets to a reboot, reboots to a hand-off to people.
 * With every rung off (the default) every such fault drains the node, as the plain policy says.
 */

export interface RemedyChoice {
  readonly verb: DecisionVerb;
  readonly reason: string;
  /** The GPU to reset (PCI bus id), for `reset_gpu`. */
  readonly gpu?: string | undefined;
}

function spent(history: readonly RemediationEntry[], action: RemedyAction, sinceMs: number): RemediationEntry[] {
  return history.filter((entry) => entry.action === action && entry.outcome !== 'refused' && Date.parse(entry.time) >= sinceMs);
}

/** The catalogue's remedy for the fault: `reset_gpu`, `reboot_node`, or undefined when it names neither. */
function catalogueRemedy(signal: Signal): 'reset_gpu' | 'reboot_node' | undefined {
  if (signal.kind === 'gpu_lost') return 'reboot_node';
  if (signal.kind !== 'xid') return undefined;
  const xid = Number(signal.evidence.xid);
  if (!Number.isInteger(xid)) return undefined;
  const message = typeof signal.evidence.message === 'string' ? signal.evidence.message : '';
  const { remedy } = classifyXid(xid, message);
  return remedy === 'reset_gpu' || remedy === 'reboot_node' ? remedy : undefined;
}

/**
 * Whether chooseRemedy looks at the node's history for this signal: only when the rung the
 * catalogue names for it is on. Otherwise (every rung off, the default) the choice is a drain
 * whatever the history holds, and the fault's way to its drain need not wait for a read of it.
 */
export function remedyNeedsHistory(signal: Signal, config: RemediesConfig): boolean {
  const remedy = catalogueRemedy(signal);
  if (remedy === 'reset_gpu') return config.gpuReset.enabled && signal.gpu !== undefined && PCI_BUS_ID_PATTERN.test(signal.gpu);
  return remedy === 'reboot_node' && config.reboot.enabled;
}

/** chooseRemedy, reading the node's history only when the choice depends on it (remedyNeedsHistory). */
export async function chooseRemedyReading(
  signal: Signal,
  drainReason: string,
  readHistory: () => Promise<readonly RemediationEntry[]>,
  config: RemediesConfig,
  now: () => number = Date.now,
): Promise<RemedyChoice> {
  const history = remedyNeedsHistory(signal, config) ? await readHistory() : [];
  return chooseRemedy(signal, drainReason, history, config, now());
}

export function chooseRemedy(signal: Signal, drainReason: string, history: readonly RemediationEntry[], config: RemediesConfig, now: number): RemedyChoice {
  const since = now - config.escalation.windowSeconds * 1000;
  const windowText = `${config.escalation.windowSeconds} s`;
  const reboots = spent(history, 'reboot', since).length;

  const rebootRung = (why: string): RemedyChoice => {
    if (reboots >= config.escalation.rebootsBeforeHandOff) {
      return { verb: 'hand_off', reason: `${drainReason}; ${reboots} reboots within ${windowText} did not hold: needs hands` };
    }
    return { verb: 'reboot', reason: `${drainReason}; ${why}` };
  };

  const remedy = catalogueRemedy(signal);
  if (remedy === 'reset_gpu' && config.gpuReset.enabled && signal.gpu !== undefined && PCI_BUS_ID_PATTERN.test(signal.gpu)) {
    const resets = spent(history, 'reset_gpu', since);
    if (resets.length >= config.escalation.resetsBeforeReboot) {
      const why = `${resets.length} GPU resets within ${windowText}`;
      if (config.reboot.enabled) return rebootRung(`${why}: reboot`);
      return { verb: 'hand_off', reason: `${drainReason}; ${why} did not hold: needs hands` };
    }
    const other = resets.find((entry) => entry.gpu !== undefined && entry.gpu !== signal.gpu);
    if (other?.gpu !== undefined) return { verb: 'drain', reason: `${drainReason}; GPU ${other.gpu} of this node needed a reset too within ${windowText}: not one GPU's fault` };
    return { verb: 'reset_gpu', gpu: signal.gpu, reason: `${drainReason}; the catalogue's remedy is a GPU reset` };
  }
  if (remedy === 'reboot_node' && config.reboot.enabled) return rebootRung("the catalogue's remedy is a node reboot");
  return { verb: 'drain', reason: drainReason };
}
