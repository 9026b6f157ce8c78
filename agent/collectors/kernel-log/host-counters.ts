import { Counter, type Registry } from 'prom-client';
import type { CollectorContext } from '../../collector.js';
import type { LogPosition } from '../../log-follower.js';
import { HostKernelParser, type HostKernelEvent, type HostKernelParse, type SxidEvent } from '../../sources/host-kernel-log.js';

/**
 * The host side of the kernel log, counted by the xid collector from the same lines it reads for
 * Xids (one reader of the kernel log per agent). Counters, not last values, so every repeat shows;
 * like the Xid counts they start from the whole log at every agent start.
 *
 * A GPU the driver cannot bring up (`RmInitAdapter failed!`) also goes on the fast path as
 * `gpu_lost`: nvidia-smi never lists such a GPU, so the gpu collector cannot miss it. What the log
 * held at start is sent only when it follows the last boot, once that first read ends. An SXid
 * goes on the fast path (kind `sxid`) only as it is logged, and only when the controller listed its
 * code (agent/xid-policy-client.ts); otherwise the counter and its alert carry it.
 */

const HOST_EVENT_KINDS = new Set<HostKernelEvent['kind']>(['soft_lockup', 'hung_task', 'hung_task_nvidia', 'oom_kill']);

export class HostKernelCounters {
  private readonly parser = new HostKernelParser();
  private readonly events: Counter<'kind'>;
  private readonly machineChecks: Counter<'severity'>;
  private readonly aer: Counter<'pci_address' | 'severity'>;
  private readonly gpuDriver: Counter<'pci_bus_id' | 'event'>;
  private readonly sxid: Counter<'nvswitch' | 'sxid' | 'severity'>;
  /** GPUs that failed to initialise, seen in the first read; sent when it ends if after the last boot. */
  private pending: HostKernelEvent[] = [];

  constructor(
    registry: Registry,
    private readonly context: CollectorContext,
  ) {
    const registers = [registry];
    this.events = new Counter({
      name: 'steadfast_kernel_events_total',
      help: 'Host kernel events in the kernel log, by kind: soft_lockup, hung_task, hung_task_nvidia (a hung task stuck in an NVIDIA module), oom_kill.',
      labelNames: ['kind'],
      registers,
    });
    this.machineChecks = new Counter({
      name: 'steadfast_machine_check_events_total',
      help: 'Machine-check (MCE) reports in the kernel log, by severity: logged (the kernel survived it) or fatal.',
      labelNames: ['severity'],
      registers,
    });
    this.aer = new Counter({
      name: 'steadfast_pcie_aer_errors_total',
      help: 'PCIe AER error reports in the kernel log, one per report, by the device it names (dddd:bb:dd.f) and severity: corrected, uncorrected_nonfatal, fatal.',
      labelNames: ['pci_address', 'severity'],
      registers,
    });
    this.gpuDriver = new Counter({
      name: 'steadfast_gpu_driver_events_total',
      help: 'NVIDIA driver messages about a GPU that precede its loss, by GPU and event: init_failed (RmInitAdapter failed), reset_needed (GSP errors, the driver asks for a reset).',
      labelNames: ['pci_bus_id', 'event'],
      registers,
    });
    this.sxid = new Counter({
      name: 'steadfast_nvswitch_sxid_errors_total',
      help: 'NVSwitch SXid errors in the kernel log, by NVSwitch (dddd:bb:dd.f), SXid code and severity (fatal, nonfatal).',
      labelNames: ['nvswitch', 'sxid', 'severity'],
      registers,
    });
  }

  /** Counts one kernel log line's host events. */
  handle(line: string, position: LogPosition): void {
    this.count(this.parser.push(line), position.firstRead);
  }

  private count({ events, sxids }: HostKernelParse, firstRead: boolean): void {
    for (const sxid of sxids) {
      this.sxid.inc({ nvswitch: sxid.nvswitch, sxid: String(sxid.sxid), severity: sxid.fatal ? 'fatal' : 'nonfatal' });
      // Only a code the controller listed: an older controller would refuse the kind, and the batch with it.
      if (!firstRead && this.context.fastPathCodes?.wantsSxid(sxid.sxid) === true) this.sendSxid(sxid);
    }
    for (const event of events) {
      if (HOST_EVENT_KINDS.has(event.kind)) this.events.inc({ kind: event.kind });
      else if (event.kind === 'machine_check' && event.severity !== undefined) this.machineChecks.inc({ severity: event.severity });
      else if (event.kind === 'pcie_aer' && event.device !== undefined && event.severity !== undefined)
        this.aer.inc({ pci_address: event.device, severity: event.severity });
      else if (event.device !== undefined && (event.kind === 'gpu_init_failed' || event.kind === 'gpu_reset_needed')) {
        this.gpuDriver.inc({ pci_bus_id: event.device, event: event.kind === 'gpu_init_failed' ? 'init_failed' : 'reset_needed' });
        if (event.kind !== 'gpu_init_failed') continue;
        if (firstRead) this.pending.push(event);
        else this.sendGpuLost(event);
      }
    }
  }

  /** A boot banner in the first read: what came before it is an earlier boot's. */
  bootSeen(): void {
    this.pending = [];
  }

  /**
   * End of a read of the log: the reports the parser still holds open (an AER headline waiting for
   * its detail lines) are counted, so that a quiet log shows them at once; after the first read,
   * GPUs that failed to initialise in this boot go on the fast path.
   */
  readEnded(): void {
    this.count(this.parser.flush(), false);
    const pending = this.pending;
    this.pending = [];
    for (const event of pending) this.sendGpuLost(event);
  }

  private sendSxid(sxid: SxidEvent): void {
    this.context.logger.error({ nvswitch: sxid.nvswitch, sxid: sxid.sxid, message: sxid.message }, 'SXid the controller asked for');
    this.context.fastPath({
      kind: 'sxid',
      node: this.context.node,
      sxid: sxid.sxid,
      nvswitch: sxid.nvswitch,
      message: sxid.message,
      time: new Date().toISOString(),
    });
  }

  private sendGpuLost(event: HostKernelEvent): void {
    if (event.device === undefined) return;
    this.context.logger.error({ gpu: event.device, message: event.message }, 'the NVIDIA driver cannot initialise a GPU');
    this.context.fastPath({
      kind: 'gpu_lost',
      node: this.context.node,
      gpu: event.device,
      message: `the NVIDIA driver cannot initialise GPU ${event.device} (RmInitAdapter failed)`,
      time: new Date().toISOString(),
    });
  }
}
