import { FAULT_CITATIONS } from '../../core/ladder.js';
import type { Signal } from '../../core/signal.js';
import { configuredRule, type PolicyLayer, type XidKind } from '../../core/xid-policy.js';
import { culpritOrCrash, xidSignalClass, type Classification, type FaultVerdict, type XidPolicyChoice } from './fault-class.js';
import type { XidOccurrences } from './xid-occurrences.js';

/**
 * The configured Xid policy (core/xid-policy.ts) laid over a signal's classification: where a
 * layer names the Xid or SXid a signal reports, its rule decides, not the catalogue and not the
 * agent's verdict. A code no layer names keeps the classification it has (fault-class.ts), so a
 * configuration without `xidPolicy` decides exactly as before.
 *
 * The signals that report a code: an Xid signal (the agent's fast path, or the alert that is
 * one), an SXid signal (the agent's fast path), and an alert with an `xid` or `sxid` label (the
 * reset- and reboot-required alerts, the NVSwitch alert).
 */

export interface XidReport {
  readonly kind: XidKind;
  readonly code: number;
}

function codeOf(value: string | number | boolean | undefined): number | undefined {
  if (typeof value === 'number') return Number.isSafeInteger(value) ? value : undefined;
  return typeof value === 'string' && /^\d{1,6}$/.test(value) ? Number(value) : undefined;
}

/** The Xid or SXid code a signal reports; undefined for a signal about neither. */
export function xidReportOf(signal: Signal): XidReport | undefined {
  if (signal.kind === 'sxid') {
    const code = codeOf(signal.evidence.sxid);
    return code === undefined ? undefined : { kind: 'sxid', code };
  }
  if (signal.kind !== 'xid' && signal.kind !== 'alert') return undefined;
  const sxid = codeOf(signal.evidence['label.sxid']);
  if (signal.kind === 'alert' && sxid !== undefined) return { kind: 'sxid', code: sxid };
  const xid = codeOf(signal.evidence.xid ?? signal.evidence['label.xid']);
  return xid === undefined ? undefined : { kind: 'xid', code: xid };
}

/** A code as people write it: `Xid 13`, `SXid 20034`. */
export function codeName(report: XidReport): string {
  return `${report.kind === 'xid' ? 'Xid' : 'SXid'} ${report.code}`;
}

function meaningOf(signal: Signal, report: XidReport): string {
  if (report.kind === 'sxid') return 'NVSwitch error';
  const known = signal.evidence.meaning;
  return typeof known === 'string' && known !== ''
    ? known
    : xidSignalClass(report.code, typeof signal.evidence.message === 'string' ? signal.evidence.message : '').meaning;
}

export interface XidRuleDeps {
  /** The policy's layers, lowest first (configurationLayers); without one naming a code, nothing changes. */
  readonly layers: readonly PolicyLayer[];
  /** Where occurrences are counted, for rules with a count above 1. */
  readonly occurrences: XidOccurrences;
}

/**
 * `verdict` as the configured rule for the signal's code has it. Below a rule's count the signal
 * is observed, saying how many of how many were seen; at the count the rule's action is taken.
 */
export async function applyXidPolicy(signal: Signal, verdict: Classification, deps: XidRuleDeps): Promise<Classification> {
  if (signal.evidence.status === 'resolved') return verdict;
  const report = xidReportOf(signal);
  if (report === undefined) return verdict;
  const configured = configuredRule(deps.layers, report.kind, report.code);
  if (configured === undefined) return verdict;
  const { rule, source } = configured;
  const name = codeName(report);
  if (rule.action === 'ignore') return { verdict: 'ignore', reason: `${name} is ignored by the ${source}` };
  if (rule.count > 1 && rule.windowSeconds !== undefined && signal.node !== undefined) {
    const { seen } = await deps.occurrences.count(signal, signal.node, report.kind, report.code, rule.windowSeconds);
    if (seen < rule.count) {
      return {
        verdict: 'ignore',
        reason: `${name} on ${signal.node}: ${seen} of ${rule.count} within ${rule.windowSeconds} s (${source}): no action yet`,
      };
    }
  }
  if (rule.action === 'observe') return { verdict: 'ignore', reason: `${name} is observed only (${source})` };
  const policy: XidPolicyChoice = { kind: report.kind, code: report.code, meaning: meaningOf(signal, report), action: rule.action, source };
  const counted = rule.count > 1 ? `, ${rule.count} within ${rule.windowSeconds ?? '?'} s` : '';
  const base = culpritOrCrash('machine', signal.node, `${name} (${policy.meaning}): ${source} says ${rule.action}${counted}`, FAULT_CITATIONS.machine);
  if (base.faultClass !== 'machine') return base;
  const remedy = rule.action === 'reset' ? 'reset_gpu' : rule.action === 'reboot' ? 'reboot_node' : undefined;
  const fault: FaultVerdict = {
    ...base,
    ...(remedy === undefined ? {} : { remedy }),
    ...(report.kind === 'xid' ? { xid: { code: report.code, meaning: policy.meaning } } : {}),
    policy,
  };
  return fault;
}
