import { FAULT_MAX_AHEAD_MS, type FastPathFault } from '../../core/fast-path-event.js';
import { faultFingerprint, stableHash, type Signal } from '../../core/signal.js';
import { sxidIsFatal, xidSignalClass } from '../policy/fault-class.js';

/** Turns an agent's fast-path event into a Signal with the same fingerprint its alert will carry. */
export function signalFromFastPath(event: FastPathFault, receivedAt: Date): Signal {
  const detail =
    event.kind === 'xid'
      ? String(event.xid)
      : event.kind === 'sxid'
        ? `${event.nvswitch ?? '-'}:${event.sxid ?? '-'}`
        : event.job !== undefined
          ? `${event.job}:${event.rank ?? '-'}`
          : undefined;
  const fingerprint = faultFingerprint({ kind: event.kind, node: event.node, gpu: event.gpu, detail });
  const evidence: Record<string, string | number | boolean> = { message: event.message };
  if (event.rank !== undefined) evidence.rank = event.rank;
  // A clock running fast: the fault counts from its arrival, its own time kept as evidence.
  const reported = Date.parse(event.time);
  const ahead = reported > receivedAt.getTime() + FAULT_MAX_AHEAD_MS;
  if (ahead) evidence.reportedTime = new Date(reported).toISOString();
  let severity: Signal['severity'] = 'critical';
  if (event.kind === 'xid' && event.xid !== undefined) {
    // The controller classifies again (its one table, fault-class.ts) rather than trusting the sender's verdict.
    const xidClass = xidSignalClass(event.xid, event.message);
    severity = xidClass.severity;
    evidence.xid = event.xid;
    evidence.remedy = xidClass.remedy;
    evidence.meaning = xidClass.meaning;
  }
  if (event.kind === 'sxid' && event.sxid !== undefined) {
    // The kernel line says whether the NVSwitch error is fatal (`SXid (PCI:…): 20034, Fatal, …`).
    severity = sxidIsFatal(event.message) ? 'critical' : 'warning';
    evidence.sxid = event.sxid;
    if (event.nvswitch !== undefined) evidence.nvswitch = event.nvswitch;
  }
  return {
    id: 's-' + stableHash(['agent', fingerprint, event.time].join('|')),
    kind: event.kind,
    node: event.node,
    gpu: event.gpu,
    job: event.job,
    severity,
    time: ahead ? receivedAt.toISOString() : new Date(reported).toISOString(),
    receivedAt: receivedAt.toISOString(),
    fingerprint,
    source: 'agent',
    evidence,
  };
}
