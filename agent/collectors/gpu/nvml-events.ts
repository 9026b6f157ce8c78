import { classifyXid } from '../../../core/xid.js';
import type { CollectorContext } from '../../collector.js';
import type { NvmlClient, NvmlXidReport } from '../../sources/nvml/client.js';
import { XidLedger } from '../../xid-ledger.js';

/**
 * Xid events from NVML: the NVML thread registers nvmlEventTypeXidCriticalError on every GPU of
 * its last poll that supports it and checks for events every 100 ms (sources/nvml/worker.ts);
 * here each one goes to the ledger shared with the kernel log (xid-ledger.ts): counted once in
 * steadfast_xid_errors_total and, when fatal, sent on the fast path once, whichever source
 * reports it first. NVML gives the code and the GPU, not the driver's message: a code whose
 * severity depends on the message (NVLink5 errors, Xid 154) is judged without it, and the kernel
 * log's line, where the agent can read it, still sends it when it turns out fatal.
 */

export class NvmlXidEvents {
  private readonly ledger: XidLedger;
  private readonly onXid = (report: NvmlXidReport): void => this.handle(report);

  constructor(
    private readonly context: CollectorContext,
    private readonly nvml: NvmlClient,
  ) {
    this.ledger = context.xids ?? new XidLedger(context.registry);
  }

  /** Asks the NVML thread to watch the GPUs it read last. */
  start(timeoutMs: number): void {
    this.nvml.on('xid', this.onXid);
    this.nvml.watchXids(timeoutMs).then(
      (registered) => {
        if (registered === 0) this.context.logger.info({ collector: 'gpu' }, 'no GPU offers NVML Xid events; Xids come from the kernel log only');
        else if (registered > 0) {
          this.context.logger.info({ collector: 'gpu', gpus: registered }, 'listening for NVML Xid events');
          // Counted from the start, as the kernel log's Xids are.
          this.ledger.register();
        }
      },
      (error: unknown) => this.context.logger.warn({ collector: 'gpu', err: error }, 'NVML Xid events could not be started'),
    );
  }

  close(): void {
    this.nvml.off('xid', this.onXid);
  }

  private handle({ pciBusId, index, xid }: NvmlXidReport): void {
    const { severity, meaning } = classifyXid(xid);
    const { news, occurrence } = this.ledger.observe('nvml', { pciBusId, xid, severity });
    if (!news || severity !== 'fatal') return;
    // NVML gives no driver text: the catalogue's words for the code, and where the report came from.
    const message = `${meaning} (NVML event, GPU ${index})`;
    this.context.logger.error({ gpu: pciBusId, xid, source: 'nvml' }, 'fatal Xid');
    occurrence.sentAs = 'fatal';
    this.context.fastPath({ kind: 'xid', node: this.context.node, gpu: pciBusId, xid, message, time: new Date().toISOString() }, (outcome) => {
      if (outcome === 'delivered') occurrence.markDelivered();
    });
  }
}
