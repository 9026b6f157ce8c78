import { Counter, type Registry } from 'prom-client';
import type { XidSeverity } from '../core/xid.js';

/**
 * One count per Xid, whichever way the agent learns of it. The driver reports an Xid twice: a
 * line in the kernel log (the xid collector) and an NVML event (the gpu collector reading NVML,
 * which needs no kernel-log rights: a pod without CAP_SYSLOG still sees them). The ledger pairs
 * the two reports of one occurrence: the first to arrive is counted in steadfast_xid_errors_total
 * and, when fatal, goes on the fast path; the second, from the other source, for the same GPU and
 * code within `windowMs`, is its twin and is neither counted nor sent again. Pairing is one to
 * one, so a burst of five Xid 13s seen by both sources counts five.
 *
 * What the kernel log held when the agent started is history: counted (the counters start from
 * the whole log, rules/README.md) but never paired, since NVML reports only what happens after
 * its events are registered.
 */

export type XidSource = 'kernel-log' | 'nvml';

export interface XidReport {
  readonly pciBusId: string;
  readonly xid: number;
  readonly severity: XidSeverity;
}

/** One occurrence, as the ledger knows it: whether its fast-path report was sent and taken. */
export class XidOccurrence {
  /** Severity the occurrence was sent on the fast path with, if sent. */
  sentAs: XidSeverity | undefined;
  private delivered = false;
  private readonly waiting: (() => void)[] = [];

  /** The controller took the fast-path report. */
  markDelivered(): void {
    if (this.delivered) return;
    this.delivered = true;
    for (const callback of this.waiting.splice(0)) callback();
  }

  /** Runs `callback` once the report is delivered (now, if it is). */
  whenDelivered(callback: () => void): void {
    if (this.delivered) callback();
    else this.waiting.push(callback);
  }
}

export interface XidObservation {
  /** First report of this occurrence: counted now; the caller sends it when fatal. */
  readonly news: boolean;
  readonly occurrence: XidOccurrence;
}

interface Unpaired {
  readonly source: XidSource;
  readonly at: number;
  readonly occurrence: XidOccurrence;
}

export const XID_ERRORS = 'steadfast_xid_errors_total';
export const DEFAULT_PAIRING_WINDOW_MS = 10_000;
/** Unpaired reports kept per GPU and code; a storm beyond it pairs with the newest. */
const MAX_UNPAIRED = 256;

export class XidLedger {
  /** steadfast_xid_errors_total; in the registry once a source that counts into it is there (register()). */
  private errors: Counter<'pci_bus_id' | 'xid' | 'severity'>;
  private readonly unpaired = new Map<string, Unpaired[]>();

  constructor(
    private readonly registry: Registry,
    private readonly windowMs = DEFAULT_PAIRING_WINDOW_MS,
    private readonly now: () => number = Date.now,
  ) {
    this.errors = new Counter({
      name: XID_ERRORS,
      help: 'NVIDIA Xid errors, by GPU, Xid code and severity: each occurrence once, from the kernel log or NVML events, whichever reports it first.',
      labelNames: ['pci_bus_id', 'xid', 'severity'],
      registers: [],
    });
  }

  /**
   * Puts steadfast_xid_errors_total in the registry: the xid collector at its construction, the
   * gpu collector once NVML Xid events are registered, so that the series exists (at zero) from
   * then on, and not on an agent that reads Xids from neither. Registering again is a no-op; a
   * ledger finding another's counter there (two ledgers on one registry) counts into that one.
   */
  register(): void {
    const existing = this.registry.getSingleMetric(XID_ERRORS);
    if (existing === this.errors) return;
    if (existing instanceof Counter) this.errors = existing as Counter<'pci_bus_id' | 'xid' | 'severity'>;
    else this.registry.registerMetric(this.errors);
  }

  /** An Xid from the kernel log as it was when the agent started: counted, never paired. */
  countHistory(report: XidReport): void {
    this.count(report);
  }

  /** A report of a new Xid; see XidObservation. */
  observe(source: XidSource, report: XidReport): XidObservation {
    const key = `${report.pciBusId}/${report.xid}`;
    const now = this.now();
    const list = (this.unpaired.get(key) ?? []).filter((entry) => now - entry.at <= this.windowMs);
    const twin = list.findIndex((entry) => entry.source !== source);
    if (twin !== -1) {
      const [paired] = list.splice(twin, 1);
      this.store(key, list);
      return { news: false, occurrence: (paired as Unpaired).occurrence };
    }
    const occurrence = new XidOccurrence();
    list.push({ source, at: now, occurrence });
    this.store(key, list.slice(-MAX_UNPAIRED));
    this.count(report);
    return { news: true, occurrence };
  }

  private store(key: string, list: Unpaired[]): void {
    if (list.length === 0) this.unpaired.delete(key);
    else this.unpaired.set(key, list);
  }

  private count(report: XidReport): void {
    this.errors.inc({ pci_bus_id: report.pciBusId, xid: String(report.xid), severity: report.severity });
  }
}
