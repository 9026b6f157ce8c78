import type { Signal } from '../../core/signal.js';

/** A signal as the audit names it: who reports what, where (`alertmanager reports Xid 79 on node-3 GPU 0000:3a:00`). */
export function describeSignal(signal: Signal): string {
  const what =
    signal.kind === 'xid'
      ? `Xid ${String(signal.evidence.xid ?? '?')}`
      : signal.kind === 'sxid'
        ? `SXid ${String(signal.evidence.sxid ?? '?')}`
        : signal.kind === 'alert'
          ? String(signal.evidence.alertname)
          : signal.kind;
  const where = [signal.node, signal.gpu].filter(Boolean).join(' GPU ');
  const status = signal.evidence.status === 'resolved' ? ' (resolved)' : '';
  return `${signal.source} reports ${what}${where ? ` on ${where}` : ''}${status}`;
}
