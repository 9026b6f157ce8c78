// Synchronous: procfs files are generated in memory when read and never block on a device.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Counter, Gauge, type Registry } from 'prom-client';
import { errorMessage } from '../../core/errors.js';
import type { Collector, CollectorContext, CollectorFactory, CollectorSettings } from '../collector.js';
import { NFS_EVENT_NAMES, parseMountstats, type NfsEventName, type NfsMount, type NfsTransport } from '../sources/mountstats.js';

/**
 * The `nfs` collector: NFS client statistics from `/proc/self/mountstats`, read at scrape time.
 *
 * Mount identity. Every series carries a short `mount` label; `steadfast_nfs_mount_info` maps it
 * to the export, mount point, NFS version and transport (one info line per mount point). The id is
 * the export (`server:/path`). Mounts of the same export with the same fstype, version and
 * transport protocol share one id and their series are exported once, from the first of them: the
 * kernel keeps these statistics per superblock, and such mounts (Kubernetes pod volumes, bind
 * mounts) usually share one, so exporting each would count the same traffic twice (node_exporter
 * drops them the same way). Another mount of the same export that differs in those (NFSv3/udp next
 * to NFSv4/tcp) gets `server:/path#2`, `#3`, … in file order.
 *
 * Values. Counters are exported as the kernel prints them, per operation only for operations used
 * at least once (a NFSv4.1 mount lists ~60, most never called). A value of 2^63 or more is a kernel
 * sum that went negative and was printed unsigned (the queue time 18446743919241604546 in the
 * procfs fixture is −154467947070 ms); that one series is left out rather than exported as 5·10^8
 * years. Values beyond 2^53 lose their low bits in the float64 every Prometheus sample is.
 *
 * Slot saturation (a 504-GPU operations report traced slow checkpoints to a full 128-slot RPC
 * table on the NFS client). The kernel adds, at every send, `sends − recvs` to `req_u` and the
 * backlog length to `bklog_u` (net/sunrpc/xprt.c, xprt_request_transmit), so between two
 * scrapes Δreq_u / Δsends is the mean number of requests on the wire at a send. Per mount, over
 * its nconnect transports:
 *
 *   utilisation = Σ_t (Δreq_u_t / Δsends_t) / Σ_t slots_t        backlog = Σ_t (Δbklog_u_t / Δsends_t)
 *
 * i.e. requests on the wire across all connections over all slots of the mount; a transport that
 * sent nothing adds no requests and keeps its slots. slots_t is `max_slots` of the xprt line (the
 * most slots the transport ever held, which is the table size once it has filled); rdma lines do
 * not print it, so rdma uses the sunrpc sysctl `rdma_slot_table_entries` (default 128), the size
 * of every rdma transport's table. Both gauges are absent on the first scrape, when no transport
 * sent anything, and after a counter went backwards (a remount). `sends − recvs` also
 * keeps every retransmission ever made (sent twice, answered once), so on a mount with many
 * retransmissions the ratio reads high and can pass 1.
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

class NfsMetrics {
  readonly info;
  readonly age;
  readonly readBytes;
  readonly writeBytes;
  readonly serverReadBytes;
  readonly serverWriteBytes;
  readonly events;
  readonly operations;
  readonly transmissions;
  readonly majorTimeouts;
  readonly sentBytes;
  readonly receivedBytes;
  readonly queueSeconds;
  readonly rttSeconds;
  readonly executeSeconds;
  readonly errors;
  readonly transportSends;
  readonly transportReceives;
  readonly transportBadXids;
  readonly transportConnects;
  readonly transportOutstanding;
  readonly transportBacklog;
  readonly transportSending;
  readonly transportPending;
  readonly transportMaxSlots;
  readonly slotUtilization;
  readonly backlogAverage;
  private readonly all: readonly (Counter<string> | Gauge<string>)[];

  constructor(registry: Registry) {
    const registers = [registry];
    const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]): Gauge<L> => new Gauge<L>({ name, help, labelNames, registers });
    const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]): Counter<L> =>
      new Counter<L>({ name, help, labelNames, registers });
    const mount = ['mount'] as const;
    const op = ['mount', 'operation'] as const;
    const transport = ['mount', 'transport'] as const;
    this.info = gauge('steadfast_nfs_mount_info', 'NFS mount identity; always 1. Maps the mount label of the other series to the export and mount point.', [
      'mount',
      'export',
      'mountpoint',
      'fstype',
      'version',
      'protocol',
      'statvers',
    ]);
    this.age = gauge('steadfast_nfs_age_seconds', 'Time since the NFS mount was made.', mount);
    this.readBytes = counter('steadfast_nfs_read_bytes_total', 'Bytes applications read from the mount, through the page cache and with O_DIRECT.', mount);
    this.writeBytes = counter('steadfast_nfs_write_bytes_total', 'Bytes applications wrote to the mount, through the page cache and with O_DIRECT.', mount);
    this.serverReadBytes = counter('steadfast_nfs_server_read_bytes_total', 'Bytes of READ payload received from the server.', mount);
    this.serverWriteBytes = counter('steadfast_nfs_server_write_bytes_total', 'Bytes of WRITE payload sent to the server.', mount);
    this.events = counter('steadfast_nfs_events_total', 'NFS client events (cache revalidations, fsyncs, congestion waits, server delays, short reads and writes).', [
      'mount',
      'event',
    ]);
    this.operations = counter('steadfast_nfs_operations_total', 'RPC operations completed, by operation.', op);
    this.transmissions = counter('steadfast_nfs_transmissions_total', 'RPC transmissions, retransmissions included, by operation.', op);
    this.majorTimeouts = counter('steadfast_nfs_major_timeouts_total', 'RPC major timeouts, by operation.', op);
    this.sentBytes = counter('steadfast_nfs_sent_bytes_total', 'Bytes sent for the operation, RPC headers included.', op);
    this.receivedBytes = counter('steadfast_nfs_received_bytes_total', 'Bytes received for the operation, RPC headers included.', op);
    this.queueSeconds = counter('steadfast_nfs_queue_seconds_total', 'Time requests waited in the client before being sent, by operation.', op);
    this.rttSeconds = counter('steadfast_nfs_rtt_seconds_total', 'Time from sending a request to receiving its reply, by operation.', op);
    this.executeSeconds = counter('steadfast_nfs_execute_seconds_total', 'Time from queueing a request to its completion, by operation.', op);
    this.errors = counter('steadfast_nfs_errors_total', 'Operations that completed with an error (kernel 5.6 and later), by operation.', op);
    this.transportSends = counter('steadfast_nfs_transport_sends_total', 'RPC requests sent on the transport.', transport);
    this.transportReceives = counter('steadfast_nfs_transport_receives_total', 'RPC replies received on the transport.', transport);
    this.transportBadXids = counter('steadfast_nfs_transport_bad_xids_total', 'Replies whose transaction id matched no request.', transport);
    this.transportConnects = counter('steadfast_nfs_transport_connects_total', 'Connections made by the transport (tcp, rdma).', transport);
    this.transportOutstanding = counter(
      'steadfast_nfs_transport_outstanding_requests_total',
      'Sum, over sends, of the requests on the wire at the send; divided by sends, the mean requests in flight.',
      transport,
    );
    this.transportBacklog = counter('steadfast_nfs_transport_backlog_queue_total', 'Sum, over sends, of the requests waiting for a free slot at the send.', transport);
    this.transportSending = counter('steadfast_nfs_transport_sending_queue_total', 'Sum, over sends, of the requests waiting to transmit at the send.', transport);
    this.transportPending = counter('steadfast_nfs_transport_pending_queue_total', 'Sum, over sends, of the requests waiting for a reply at the send.', transport);
    this.transportMaxSlots = gauge('steadfast_nfs_transport_max_slots', 'Most RPC request slots the transport ever had allocated.', transport);
    this.slotUtilization = gauge(
      'steadfast_nfs_rpc_slot_utilization_ratio',
      'Mean requests in flight at a send over the RPC slots of the mount, over all its transports, since the previous scrape.',
      mount,
    );
    this.backlogAverage = gauge(
      'steadfast_nfs_rpc_backlog_average',
      'Mean requests waiting for an RPC slot at a send, summed over the transports of the mount, since the previous scrape.',
      mount,
    );
    this.all = [
      this.info,
      this.age,
      this.readBytes,
      this.writeBytes,
      this.serverReadBytes,
      this.serverWriteBytes,
      this.events,
      this.operations,
      this.transmissions,
      this.majorTimeouts,
      this.sentBytes,
      this.receivedBytes,
      this.queueSeconds,
      this.rttSeconds,
      this.executeSeconds,
      this.errors,
      this.transportSends,
      this.transportReceives,
      this.transportBadXids,
      this.transportConnects,
      this.transportOutstanding,
      this.transportBacklog,
      this.transportSending,
      this.transportPending,
      this.transportMaxSlots,
      this.slotUtilization,
      this.backlogAverage,
    ];
  }

  /** Forgets every series; the next read writes what is there now (mounts come and go). */
  reset(): void {
    for (const metric of this.all) metric.reset();
  }
}

/** Sets a counter to the kernel's absolute value (reset() + inc), leaving out values that wrapped. */
function setCounter<L extends string>(counter: Counter<L>, labels: Record<L, string>, value: bigint | undefined): void {
  if (value === undefined || value >= WRAPPED) return;
  counter.inc(labels, Number(value));
}

function setSeconds<L extends string>(counter: Counter<L>, labels: Record<L, string>, milliseconds: bigint): void {
  if (milliseconds >= WRAPPED) return;
  counter.inc(labels, Number(milliseconds) / 1000);
}

/** A mount as exported: its id, and whether its series come from it (the first of its kind) or only its info line. */
interface IdentifiedMount {
  readonly id: string;
  readonly mount: NfsMount;
  readonly exportsSeries: boolean;
}

function nfsVersion(mount: NfsMount): string {
  return mount.options.get('vers') ?? mount.rpcProgramVersion ?? '';
}

function transportProtocol(mount: NfsMount): string {
  return mount.options.get('proto') ?? mount.transports[0]?.protocol ?? '';
}

/** Gives each mount its `mount` id (see the module comment). */
export function identifyMounts(mounts: readonly NfsMount[]): IdentifiedMount[] {
  const idByKind = new Map<string, string>();
  const kindsByDevice = new Map<string, number>();
  return mounts.map((mount) => {
    const kind = JSON.stringify([mount.device, mount.fstype, nfsVersion(mount), transportProtocol(mount)]);
    const known = idByKind.get(kind);
    if (known !== undefined) return { id: known, mount, exportsSeries: false };
    const ordinal = (kindsByDevice.get(mount.device) ?? 0) + 1;
    kindsByDevice.set(mount.device, ordinal);
    const id = ordinal === 1 ? mount.device : `${mount.device}#${ordinal}`;
    idByKind.set(kind, id);
    return { id, mount, exportsSeries: true };
  });
}

/** The counters the saturation gauges are computed from, per transport, as of the previous scrape. */
interface TransportSnapshot {
  readonly sends: bigint;
  readonly outstanding: bigint;
  readonly backlog: bigint;
}

function snapshot(transport: NfsTransport): TransportSnapshot {
  return { sends: transport.sends, outstanding: transport.cumulativeOutstanding, backlog: transport.cumulativeBacklog };
}

/**
 * Mean requests in flight (over slots) and mean backlog of a mount between two reads of its
 * transports; undefined where there is nothing to compare (see the module comment).
 */
export function slotSaturation(
  previous: readonly TransportSnapshot[] | undefined,
  transports: readonly NfsTransport[],
  rdmaSlots: number | undefined,
): { utilization?: number | undefined; backlog: number } | undefined {
  if (previous === undefined || previous.length !== transports.length || transports.length === 0) return undefined;
  let inFlight = 0;
  let backlog = 0;
  let slots: number | undefined = 0;
  let sends = 0n;
  for (const [index, transport] of transports.entries()) {
    const before = previous[index];
    if (before === undefined) return undefined;
    const deltaSends = transport.sends - before.sends;
    const deltaOutstanding = transport.cumulativeOutstanding - before.outstanding;
    const deltaBacklog = transport.cumulativeBacklog - before.backlog;
    if (deltaSends < 0n || deltaOutstanding < 0n || deltaBacklog < 0n) return undefined;
    sends += deltaSends;
    if (deltaSends > 0n) {
      inFlight += Number(deltaOutstanding) / Number(deltaSends);
      backlog += Number(deltaBacklog) / Number(deltaSends);
    }
    const transportSlots = transport.maxSlots !== undefined ? Number(transport.maxSlots) : transport.protocol === 'rdma' ? rdmaSlots : undefined;
    slots = slots === undefined || transportSlots === undefined ? undefined : slots + transportSlots;
  }
  if (sends === 0n) return undefined;
  return { utilization: slots === undefined || slots === 0 ? undefined : inFlight / slots, backlog };
}

function settingValue(settings: CollectorSettings, name: string): string | undefined {
  const value = settings[name];
  return typeof value === 'string' ? value : value?.at(-1);
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
    this.path = options.mountstatsPath ?? settingValue(context.settings, NFS_MOUNTSTATS_FLAG) ?? join(context.paths.procfs, 'self', 'mountstats');
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
      this.context.logger.debug({ collector: this.name, path, err: errorMessage(error) }, 'no rdma slot table size; rdma slot utilisation not exported');
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
