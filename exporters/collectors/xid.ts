import { Counter } from 'prom-client';
import { errorMessage } from '../../core/errors.js';
import type { Collector, CollectorContext, CollectorFactory } from '../collector.js';
import { KernelLogParser } from '../sources/kernel-log.js';
import { LogFollower } from '../log-follower.js';

/**
 * The `xid` collector: follows the kernel log and counts every `NVRM: Xid` per GPU and code
 * (a counter, not a last-value gauge, so repeats stay visible). Fatal ones also
 * go to the controller on the fast path.
 */

export interface XidCollectorOptions {
  /** How often a plain log file is checked for new data, and /dev/kmsg for new records. */
  readonly followIntervalMs?: number;
}

// A stat and a short read ten times a second costs little and keeps the fast path under 250 ms.
const DEFAULT_FOLLOW_INTERVAL_MS = 100;
class XidCollector implements Collector {
  readonly name = 'xid';
  private readonly errors: Counter<'pci_bus_id' | 'xid' | 'severity'>;
  private readonly parser = new KernelLogParser();
  private readonly follower: LogFollower;
  private started = false;

  constructor(
    private readonly context: CollectorContext,
    options: XidCollectorOptions,
  ) {
    this.errors = new Counter({
      name: 'steadfast_xid_errors_total',
      help: 'NVIDIA Xid errors seen in the kernel log, by GPU, Xid code and severity.',
      labelNames: ['pci_bus_id', 'xid', 'severity'],
      registers: [context.registry],
    });
    this.follower = new LogFollower(
      context.paths.kmsg,
      options.followIntervalMs ?? DEFAULT_FOLLOW_INTERVAL_MS,
      (line) => this.handleLine(line),
      context.logger.child({ collector: this.name }),
      'kernel log',
    );
  }

  async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    await this.follower.start();
  }

  async update(): Promise<void> {
    if (!this.started) throw new Error('xid collector was not started');
    if (this.follower.lastError) throw new Error(`cannot read kernel log ${this.context.paths.kmsg}: ${errorMessage(this.follower.lastError)}`);
  }

  async close(): Promise<void> {
    await this.follower.close();
  }

  private handleLine(line: string): void {
    for (const event of this.parser.push(line)) {
      this.errors.inc({ pci_bus_id: event.pciBusId, xid: String(event.xid), severity: event.severity });
      if (event.severity !== 'fatal') continue;
      this.context.logger.error({ gpu: event.pciBusId, xid: event.xid, message: event.message }, 'fatal Xid');
      // Fatal Xids already in the log at start are sent too: the controller dedupes by fingerprint.
      this.context.fastPath({
        kind: 'xid',
        node: this.context.node,
        gpu: event.pciBusId,
        xid: event.xid,
        message: event.message,
        time: new Date().toISOString(),
      });
    }
  }
}

export function createXidCollector(context: CollectorContext, options: XidCollectorOptions = {}): Collector {
  return new XidCollector(context, options);
}

export const xidCollectorFactory: CollectorFactory = {
  name: 'xid',
  defaultEnabled: true,
  help: 'NVIDIA Xid errors from the kernel log (/dev/kmsg or a log file).',
  create: (context) => createXidCollector(context),
};
