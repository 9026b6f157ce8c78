import type { Gauge } from 'prom-client';
import { classifyXid } from '../../../core/xid.js';
import type { CollectorContext } from '../../collector.js';
import type { NvmlClient, NvmlEventsState, NvmlXidReport } from '../../sources/nvml/client.js';
import { nvmlErrorName } from '../../sources/nvml/library.js';
import { sharedGauge } from '../../shared-metrics.js';
import { XidLedger } from '../../xid-ledger.js';

/**
 * Xid events from NVML: the NVML thread registers nvmlEventTypeXidCriticalError on every GPU of
 * its last poll that supports it and checks for events every 100 ms (sources/nvml/worker.ts);
 * here each one goes to the ledger shared with the kernel log (xid-ledger.ts): counted once in
 * steadfast_xid_errors_total and, when fatal, sent on the fast path once, whichever source
 * reports it first. NVML gives the code and the GPU, not the driver's message: a code whose
 * severity depends on the message (NVLink5 errors, Xid 154) is judged without it, and the kernel
 * log's line, where the agent can read it, still sends it when it turns out fatal.
 *
 * steadfast_gpu_nvml_events_up says whether the events are being received: 1 while the event wait
 * answers, 0 while it fails. A failing wait is logged once (and once when it answers again) and
 * makes the collector poll the GPUs at once, as NVIDIA's device plugin takes a wait error for a
 * sign of sick GPUs: a GPU that fell off the bus is then shown as not present, and sent on the
 * fast path, within a poll's time rather than at the next interval.
 */

const EVENTS_UP = 'steadfast_gpu_nvml_events_up';

function eventsGauge(context: CollectorContext): Gauge {
  return sharedGauge(context.registry, {
    name: EVENTS_UP,
    help: 'Whether NVML Xid events are being received: 1 while the event wait answers, 0 while it fails (Xids then come from the kernel log only).',
  });
}

export class NvmlXidEvents {
  private readonly ledger: XidLedger;
  private readonly onXid = (report: NvmlXidReport): void => this.handle(report);
  private readonly onEvents = (state: NvmlEventsState): void => this.changed(state);
  private up: Gauge | undefined;

  constructor(
    private readonly context: CollectorContext,
    private readonly nvml: NvmlClient,
    private readonly pollNow: () => void = () => undefined,
  ) {
    this.ledger = context.xids ?? new XidLedger(context.registry);
  }

  /** Asks the NVML thread to watch the GPUs it read last. */
  start(timeoutMs: number): void {
    this.nvml.on('xid', this.onXid);
    this.nvml.on('events', this.onEvents);
    this.nvml.watchXids(timeoutMs).then(
      (registered) => {
        if (registered === 0) this.context.logger.info({ collector: 'gpu' }, 'no GPU offers NVML Xid events; Xids come from the kernel log only');
        else if (registered > 0) {
          this.context.logger.info({ collector: 'gpu', gpus: registered }, 'listening for NVML Xid events');
          this.up ??= eventsGauge(this.context);
          this.up.set(1);
          // Counted from the start, as the kernel log's Xids are.
          this.ledger.register();
        }
      },
      (error: unknown) => this.context.logger.warn({ collector: 'gpu', err: error }, 'NVML Xid events could not be started'),
    );
  }

  close(): void {
    this.nvml.off('xid', this.onXid);
    this.nvml.off('events', this.onEvents);
  }

  private changed({ state, code }: NvmlEventsState): void {
    this.up ??= eventsGauge(this.context);
    if (state === 'ok') {
      this.up.set(1);
      this.context.logger.info({ collector: 'gpu' }, 'NVML Xid events are received again');
      return;
    }
    this.up.set(0);
    const error = code === undefined ? 'unknown' : nvmlErrorName(code);
    this.context.logger.warn(
      { collector: 'gpu', error, code },
      'waiting for NVML Xid events fails; Xids come from the kernel log only until it answers again; polling the GPUs now',
    );
    this.pollNow();
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
