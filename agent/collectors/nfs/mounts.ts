import type { NfsMount, NfsTransport } from '../../sources/mountstats.js';

/**
 * What the `nfs` collector derives from the parsed mounts: each mount's `mount` id, and its RPC
 * slot saturation between two reads.
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

/** A mount as exported: its id, and whether its series come from it (the first of its kind) or only its info line. */
export interface IdentifiedMount {
  readonly id: string;
  readonly mount: NfsMount;
  readonly exportsSeries: boolean;
}

export function nfsVersion(mount: NfsMount): string {
  return mount.options.get('vers') ?? mount.rpcProgramVersion ?? '';
}

export function transportProtocol(mount: NfsMount): string {
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
export interface TransportSnapshot {
  readonly sends: bigint;
  readonly outstanding: bigint;
  readonly backlog: bigint;
}

export function snapshot(transport: NfsTransport): TransportSnapshot {
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
