// Synchronous: procfs files are generated in memory when read and never block on a device.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Counter } from 'prom-client';
import { errorMessage } from '../../../core/errors.js';
import type { Collector, CollectorContext, CollectorFactory } from '../../collector.js';
import { readFlag } from '../../flags.js';
import { NFS_EVENT_NAMES, parseMountstats, type NfsEventName, type NfsMount } from '../../sources/mountstats.js';
import { NfsMetrics } from './metrics.js';
import { identifyMounts, nfsVersion, slotSaturation, snapshot, transportProtocol, type TransportSnapshot } from './mounts.js';

/**
 * The `nfs` collector: NFS client statistics from `/proc/self/mountstats`, read at scrape time.
 * Which mounts are exported under which `mount` id, and how slot saturation is computed, is
 * mounts.ts; the series themselves are metrics.ts.
 *
 * Values. Counters are exported as the kernel prints them, per operation only for operations used
 * at least once (a NFSv4.1 mount lists ~60, most never called). A value of 2^63 or more is a kernel
 * sum that went negative and was printed unsigned (the queue time 18446743919241604546 in the
 * procfs fixture is −154467947070 ms); that one series is left out rather than exported as 5·10^8
 * years. Values beyond 2^53 lose their low bits in the float64 every Prometheus sample is.
 */

export interface NfsCollectorOptions {
  /** The mountstats file; by default `<procfs>/self/mountstats`. */
  readonly mountstatsPath?: string | undefined;
}

export const NFS_MOUNTSTATS_FLAG = 'nfs.mountstats';

/** Events worth a series: cache revalidation storms, fsyncs, a congested or busy (NFS4ERR_DELAY) server, short I/O. */
const EXPORTED_EVENTS: readonly NfsEventName[] = [
  'inode_revalidate',
  'dentry_revalidate',
  'data_invalidate',
  'attr_invalidate',
  'vfs_open',
  'vfs_fsync',
  'congestion_wait',
  'silly_rename',
  'short_read',
  'short_write',
  'delay',
];

/** A u64 sum at or above 2^63 is a negative s64 printed unsigned (see the module comment). */
const WRAPPED = 1n << 63n;

type MountLabel = 'mount';
type OperationLabel = MountLabel | 'operation';
type TransportLabel = MountLabel | 'transport';

/** Sets a counter to the kernel's absolute value (reset() + inc), leaving out values that wrapped. */
function setCounter<L extends string>(counter: Counter<L>, labels: Record<L, string>, value: bigint | undefined): void {
  if (value === undefined || value >= WRAPPED) return;
  counter.inc(labels, Number(value));
}

function setSeconds<L extends string>(counter: Counter<L>, labels: Record<L, string>, milliseconds: bigint): void {
  if (milliseconds >= WRAPPED) return;
  counter.inc(labels, Number(milliseconds) / 1000);
}

class NfsCollector implements Collector {
  readonly name = 'nfs';
  private readonly metrics: NfsMetrics;
  private readonly path: string;
  /** Transport counters of the previous scrape, by mount id. */
  private previous = new Map<string, readonly TransportSnapshot[]>();

  constructor(
    private readonly context: CollectorContext,
    options: NfsCollectorOptions,
  ) {
    this.metrics = new NfsMetrics(context.registry);
    this.path = options.mountstatsPath ?? readFlag(context.settings, NFS_MOUNTSTATS_FLAG, 'path') ?? join(context.paths.procfs, 'self', 'mountstats');
  }

  async start(): Promise<void> {}

  async update(): Promise<void> {
    let text: string;
    try {
      text = readFileSync(this.path, 'utf8');
    } catch (error) {
      // Values we can no longer read are not current; drop them rather than export stale ones.
      this.metrics.reset();
      throw new Error(`cannot read ${this.path}: ${errorMessage(error)}`, { cause: error });
    }
    const mounts = identifyMounts(parseMountstats(text));
    const rdmaSlots = mounts.some(({ mount }) => mount.transports.some((transport) => transport.protocol === 'rdma')) ? await this.readRdmaSlots() : undefined;
    this.metrics.reset();
    const current = new Map<string, readonly TransportSnapshot[]>();
    for (const { id, mount, exportsSeries } of mounts) {
      this.writeInfo(id, mount);
      if (!exportsSeries) continue;
      this.writeMount(id, mount);
      const saturation = slotSaturation(this.previous.get(id), mount.transports, rdmaSlots);
      if (saturation?.utilization !== undefined) this.metrics.slotUtilization.set({ mount: id }, saturation.utilization);
      if (saturation !== undefined) this.metrics.backlogAverage.set({ mount: id }, saturation.backlog);
      current.set(id, mount.transports.map(snapshot));
    }
    this.previous = current;
  }

  async close(): Promise<void> {}

  /** The rdma slot table size (sysctl sunrpc.rdma_slot_table_entries); undefined when xprtrdma is not loaded. */
  private async readRdmaSlots(): Promise<number | undefined> {
    const path = join(this.context.paths.procfs, 'sys', 'sunrpc', 'rdma_slot_table_entries');
    try {
      const slots = Number(readFileSync(path, 'utf8').trim());
      return Number.isInteger(slots) && slots > 0 ? slots : undefined;
    } catch (error) {
      this.context.logger.debug({ collector: this.name, path, err: error }, 'no rdma slot table size; rdma slot utilisation not exported');
      return undefined;
    }
  }

  private writeInfo(id: string, mount: NfsMount): void {
    this.metrics.info.set(
      {
        mount: id,
        export: mount.device,
        mountpoint: mount.mountpoint,
        fstype: mount.fstype,
        version: nfsVersion(mount),
        protocol: transportProtocol(mount),
        statvers: mount.statsVersion ?? '',
      },
      1,
    );
  }

  private writeMount(id: string, mount: NfsMount): void {
    const m = this.metrics;
    const labels: Record<MountLabel, string> = { mount: id };
    if (mount.ageSeconds !== undefined) m.age.set(labels, Number(mount.ageSeconds));
    if (mount.bytes !== undefined) {
      const bytes = mount.bytes;
      setCounter(m.readBytes, labels, bytes.normalRead + bytes.directRead);
      setCounter(m.writeBytes, labels, bytes.normalWrite + bytes.directWrite);
      setCounter(m.serverReadBytes, labels, bytes.serverRead);
      setCounter(m.serverWriteBytes, labels, bytes.serverWrite);
    }
    for (const event of EXPORTED_EVENTS) {
      setCounter(m.events, { mount: id, event }, mount.events?.[NFS_EVENT_NAMES.indexOf(event)]);
    }
    for (const operation of mount.operations) {
      if (operation.operations === 0n) continue;
      const op: Record<OperationLabel, string> = { mount: id, operation: operation.name };
      setCounter(m.operations, op, operation.operations);
      setCounter(m.transmissions, op, operation.transmissions);
      setCounter(m.majorTimeouts, op, operation.majorTimeouts);
      setCounter(m.sentBytes, op, operation.bytesSent);
      setCounter(m.receivedBytes, op, operation.bytesReceived);
      setSeconds(m.queueSeconds, op, operation.queueMilliseconds);
      setSeconds(m.rttSeconds, op, operation.rttMilliseconds);
      setSeconds(m.executeSeconds, op, operation.executeMilliseconds);
      setCounter(m.errors, op, operation.errors);
    }
    for (const [index, transport] of mount.transports.entries()) {
      const labelsT: Record<TransportLabel, string> = { mount: id, transport: String(index) };
      setCounter(m.transportSends, labelsT, transport.sends);
      setCounter(m.transportReceives, labelsT, transport.receives);
      setCounter(m.transportBadXids, labelsT, transport.badXids);
      setCounter(m.transportConnects, labelsT, transport.connectCount);
      setCounter(m.transportOutstanding, labelsT, transport.cumulativeOutstanding);
      setCounter(m.transportBacklog, labelsT, transport.cumulativeBacklog);
      setCounter(m.transportSending, labelsT, transport.cumulativeSending);
      setCounter(m.transportPending, labelsT, transport.cumulativePending);
      if (transport.maxSlots !== undefined) m.transportMaxSlots.set(labelsT, Number(transport.maxSlots));
    }
  }
}

export function createNfsCollector(context: CollectorContext, options: NfsCollectorOptions = {}): Collector {
  return new NfsCollector(context, options);
}

export const nfsCollectorFactory: CollectorFactory = {
  name: 'nfs',
  defaultEnabled: true,
  help: 'NFS client statistics from /proc/self/mountstats: per-operation counts, bytes and latency, transports, RPC slot saturation.',
  flags: [
    {
      name: NFS_MOUNTSTATS_FLAG,
      value: '<file>',
      description: 'mountstats file to read instead of <procfs>/self/mountstats (e.g. /host/proc/1/mountstats for the host mount namespace)',
    },
  ],
  create: (context) => createNfsCollector(context),
};
