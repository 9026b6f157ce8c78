import { errorMessage } from '../../../core/errors.js';
import type { Collector, CollectorContext, CollectorFactory } from '../../collector.js';
import { readFlag } from '../../flags.js';
import { isBootBanner, KernelLogParser } from '../../sources/kernel-log.js';
import { LogFollower, type LogPosition } from '../../log-follower.js';
import { HostKernelCounters } from './host-counters.js';
import { bootIdPath, ReportedXids, type XidCandidate } from './xid-reported.js';
import { XidLedger, type XidOccurrence } from '../../xid-ledger.js';

/**
 * The kernel-log collector: the agent's one reader of the kernel log (/dev/kmsg or a log file).
 * It counts every `NVRM: Xid` per GPU and code (a counter, not a last-value gauge, so repeats
 * stay visible), once with the NVML event of the same Xid where the gpu collector reads NVML
 * (../../xid-ledger.ts). Fatal ones, and those the controller's Xid policy asks for (GET
 * /api/v1/xid-policy, seen live, not in the log as it was at start), go to the controller on the fast path, once per
 * occurrence: the counters start from the whole log at every agent start (the rules expect that,
 * rules/README.md), but a fatal Xid already reported before a restart (xid-reported.ts), or logged
 * before the last boot, is not sent again. The same lines feed the host kernel counters
 * (host-counters.ts): lockups, hung tasks, OOM kills, machine checks, PCIe AER, NVSwitch SXids and
 * GPUs the driver cannot initialise.
 *
 * Its user-facing name stays `xid`, from when it read Xids only: operators' configurations name it
 * (`--collector.xid`, `--no-collector.xid`, `--xid.state-file`, collector="xid" in
 * steadfast_collector_success, the steadfast_xid_* metrics and the alerts on them), so the code
 * is named for what it reads and the collector for what they already run.
 */

export const XID_STATE_FILE_FLAG = 'xid.state-file';
export const DEFAULT_XID_STATE_FILE = '/var/lib/steadfast/xid-state.json';

export interface KernelLogCollectorOptions {
  /** How often a plain log file is checked for new data, and /dev/kmsg for new records. */
  readonly followIntervalMs?: number;
}

// A stat and a short read ten times a second costs little and keeps the fast path under 250 ms.
const DEFAULT_FOLLOW_INTERVAL_MS = 100;
class KernelLogCollector implements Collector {
  readonly name = 'xid';
  private readonly ledger: XidLedger;
  private readonly parser = new KernelLogParser();
  private readonly follower: LogFollower;
  private readonly reported: ReportedXids;
  private readonly host: HostKernelCounters;
  /** Fatal Xids of a first read of the log, judged once it ends (a later line may show they are history). */
  private pending: XidCandidate[] = [];
  /** Candidates before this index came before a boot banner in the log as it was at start. */
  private beforeBoot = 0;
  private started = false;

  constructor(
    private readonly context: CollectorContext,
    options: KernelLogCollectorOptions,
  ) {
    // Shared with the gpu collector's NVML events: one count per Xid whichever reports it first.
    this.ledger = context.xids ?? new XidLedger(context.registry);
    this.ledger.register();
    this.host = new HostKernelCounters(context.registry, context);
    const logger = context.logger.child({ collector: this.name });
    this.reported = new ReportedXids({
      statePath: readFlag(context.settings, XID_STATE_FILE_FLAG, 'path'),
      bootIdPath: bootIdPath(context.paths.procfs),
      logPath: context.paths.kmsg,
      logger,
    });
    this.follower = new LogFollower(
      context.paths.kmsg,
      options.followIntervalMs ?? DEFAULT_FOLLOW_INTERVAL_MS,
      (line, position) => this.handleLine(line, position),
      logger,
      'kernel log',
      () => this.judgePending(),
    );
  }

  async start(): Promise<void> {
    if (this.started) return;
    this.started = true;
    await this.reported.load();
    await this.follower.start();
  }

  async update(): Promise<void> {
    if (!this.started) throw new Error('xid collector was not started');
    if (this.follower.lastError) throw new Error(`cannot read kernel log ${this.context.paths.kmsg}: ${errorMessage(this.follower.lastError)}`);
  }

  async close(): Promise<void> {
    await this.follower.close();
    await this.reported.close();
  }

  private handleLine(line: string, position: LogPosition): void {
    // Lines the log held when the agent opened it may span reboots: what precedes the last boot is history.
    if (position.firstRead && isBootBanner(line)) {
      this.beforeBoot = this.pending.length;
      this.host.bootSeen();
    }
    this.host.handle(line, position);
    for (const event of this.parser.push(line)) {
      if (position.firstRead) {
        this.ledger.countHistory(event);
        if (event.severity !== 'fatal') continue;
        this.context.logger.error({ gpu: event.pciBusId, xid: event.xid, message: event.message }, 'fatal Xid');
        // What the log held when it was opened waits for the end of that read.
        this.pending.push(this.reported.candidate(event, line, position));
        continue;
      }
      const { news, occurrence } = this.ledger.observe('kernel-log', event);
      // Beyond the fatal ones, the codes the controller's Xid policy acts on or counts (xid-policy-client.ts).
      const asked = event.severity !== 'fatal' && this.context.fastPathCodes?.wantsXid(event.xid) === true;
      if (event.severity !== 'fatal' && !asked) continue;
      const candidate = this.reported.candidate(event, line, position);
      if (news || occurrence.sentAs !== 'fatal') {
        this.context.logger.error({ gpu: event.pciBusId, xid: event.xid, message: event.message }, asked ? 'Xid the controller asked for' : 'fatal Xid');
        if (this.reported.reportedCount([candidate]) === 0) this.send(candidate, occurrence);
      } else {
        // NVML reported it first and sent it: the state file still records this line as reported.
        occurrence.whenDelivered(() => this.reported.delivered(candidate));
      }
    }
  }

  /** At the end of every read; after a first read, the fatal Xids that are news go on the fast path, in log order. */
  private judgePending(): void {
    this.host.readEnded();
    const candidates = this.pending;
    const beforeBoot = this.beforeBoot;
    this.pending = [];
    this.beforeBoot = 0;
    if (candidates.length === 0) return;
    const reported = this.reported.reportedCount(candidates);
    const skip = Math.max(beforeBoot, reported);
    if (skip > 0) {
      this.context.logger.info(
        { collector: this.name, skipped: skip, reportedBefore: reported, beforeLastBoot: beforeBoot },
        'fatal Xids in the kernel log at start not sent again: reported before the agent restarted, or logged before the last boot',
      );
    }
    for (const candidate of candidates.slice(skip)) this.send(candidate);
  }

  private send(candidate: XidCandidate, occurrence?: XidOccurrence): void {
    const { event } = candidate;
    if (occurrence) occurrence.sentAs = 'fatal';
    this.context.fastPath(
      { kind: 'xid', node: this.context.node, gpu: event.pciBusId, xid: event.xid, message: event.message, time: new Date().toISOString() },
      (outcome) => {
        if (outcome !== 'delivered') return;
        this.reported.delivered(candidate);
        occurrence?.markDelivered();
      },
    );
  }
}

export function createKernelLogCollector(context: CollectorContext, options: KernelLogCollectorOptions = {}): Collector {
  return new KernelLogCollector(context, options);
}

export const kernelLogCollectorFactory: CollectorFactory = {
  name: 'xid',
  defaultEnabled: true,
  help: 'NVIDIA Xid errors and host kernel events (lockups, hung tasks, OOM kills, MCE, PCIe AER, NVSwitch SXid) from the kernel log (/dev/kmsg or a log file).',
  flags: [
    {
      name: XID_STATE_FILE_FLAG,
      value: '<file>',
      description:
        'where the agent records the last fatal Xid the controller accepted, so that a restarted agent does not report it again (created with its directory; unreadable or corrupt: logged and treated as empty).',
      default: DEFAULT_XID_STATE_FILE,
    },
  ],
  create: (context) => createKernelLogCollector(context),
};
