/**
 * Pure parser of `/proc/<pid>/mountstats` into typed NFS mounts. The layout comes from the
 * kernel's printers: fs/nfs/super.c `nfs_show_stats` (opts, age, events, bytes),
 * net/sunrpc/stats.c `rpc_clnt_show_stats` (RPC iostats, per-op lines) and the transports'
 * `print_stats` (net/sunrpc/xprtsock.c for udp/tcp/local, net/sunrpc/xprtrdma/transport.c for
 * rdma), as seen in the captures under test/fixtures/realworld/procfs-nfs-infiniband/.
 *
 * Numbers are kept exact as `bigint`: the kernel prints u64 counters, and a JS number is exact
 * only up to 2^53 (bytes and queue times on a long-lived mount pass that). Converting to a float
 * is the exporter's business, where Prometheus' float64 loses the same low bits anyway.
 *
 * The parser never throws: a line it cannot make sense of is skipped, and what was parsed
 * before it is kept. Mounts of other file systems are ignored.
 */

/** `bytes:` — what applications moved through the mount and what went over the wire. */
export interface NfsBytes {
  /** read(2) through the page cache. */
  readonly normalRead: bigint;
  readonly normalWrite: bigint;
  /** read(2) with O_DIRECT. */
  readonly directRead: bigint;
  readonly directWrite: bigint;
  /** READ / WRITE payload exchanged with the server. */
  readonly serverRead: bigint;
  readonly serverWrite: bigint;
  /** Pages, not bytes. */
  readonly readPages: bigint;
  readonly writePages: bigint;
}

export type NfsTransportProtocol = 'tcp' | 'udp' | 'rdma' | 'local';

/** One `xprt:` line; a mount with nconnect=N has N of them, in the kernel's order. */
export interface NfsTransport {
  readonly protocol: NfsTransportProtocol;
  /** Local port (0 for rdma; absent for local sockets). */
  readonly port?: bigint | undefined;
  readonly bindCount: bigint;
  /** Connection-oriented transports only (tcp, rdma, local). */
  readonly connectCount?: bigint | undefined;
  /** Seconds spent connecting, in total. */
  readonly connectTimeSeconds?: bigint | undefined;
  /** Seconds since the transport last carried traffic. */
  readonly idleTimeSeconds?: bigint | undefined;
  readonly sends: bigint;
  readonly receives: bigint;
  readonly badXids: bigint;
  /** `req_u`: at every send the kernel adds `sends − recvs`, the requests then on the wire. */
  readonly cumulativeOutstanding: bigint;
  /** `bklog_u`: at every send the kernel adds the length of the backlog (requests waiting for a slot). */
  readonly cumulativeBacklog: bigint;
  /** `max_slots`: the most request slots this transport ever had allocated (statvers ≥ 1.1; not printed for rdma). */
  readonly maxSlots?: bigint | undefined;
  /** `sending_u`: at every send, the length of the queue waiting for the transport's write lock. */
  readonly cumulativeSending?: bigint | undefined;
  /** `pending_u`: at every send, the length of the queue waiting for replies. */
  readonly cumulativePending?: bigint | undefined;
  /** rdma only: the transport-specific counters after the common ten (chunk counts, MR stats, …), in kernel order. */
  readonly rdmaCounters?: readonly bigint[] | undefined;
}

/** One line of `per-op statistics`. Times are cumulative milliseconds. */
export interface NfsOperation {
  readonly name: string;
  readonly operations: bigint;
  readonly transmissions: bigint;
  readonly majorTimeouts: bigint;
  readonly bytesSent: bigint;
  readonly bytesReceived: bigint;
  readonly queueMilliseconds: bigint;
  readonly rttMilliseconds: bigint;
  readonly executeMilliseconds: bigint;
  /** Operations that completed with an error; printed from kernel 5.6 on (the ninth field). */
  readonly errors?: bigint | undefined;
}

export interface NfsMount {
  /** The export as mounted, `server:/path`, with the kernel's octal escapes (`\040`) decoded. */
  readonly device: string;
  readonly mountpoint: string;
  /** `nfs` or `nfs4`. */
  readonly fstype: string;
  /** `statvers=` of the device line: `1.0`, `1.1`. */
  readonly statsVersion?: string | undefined;
  /** `opts:` as key → value; flags without a value (`rw`, `hard`) map to ''. */
  readonly options: ReadonlyMap<string, string>;
  readonly ageSeconds?: bigint | undefined;
  /** `events:` counters in kernel order (see NFS_EVENT_NAMES); older kernels print fewer. */
  readonly events?: readonly bigint[] | undefined;
  readonly bytes?: NfsBytes | undefined;
  /** `RPC iostats version: 1.1  p/v: 100003/4 (nfs)`: the RPC program version, `3` or `4`. */
  readonly rpcProgramVersion?: string | undefined;
  readonly transports: readonly NfsTransport[];
  /** In file order; a name seen twice keeps its last line. */
  readonly operations: readonly NfsOperation[];
}

/** Names of the `events:` counters by position, after enum nfs_stat_eventcounters (include/linux/nfs_iostat.h). */
export const NFS_EVENT_NAMES = [
  'inode_revalidate',
  'dentry_revalidate',
  'data_invalidate',
  'attr_invalidate',
  'vfs_open',
  'vfs_lookup',
  'vfs_access',
  'vfs_update_page',
  'vfs_read_page',
  'vfs_read_pages',
  'vfs_write_page',
  'vfs_write_pages',
  'vfs_getdents',
  'vfs_setattr',
  'vfs_flush',
  'vfs_fsync',
  'vfs_lock',
  'vfs_release',
  'congestion_wait',
  'setattr_truncate',
  'extend_write',
  'silly_rename',
  'short_read',
  'short_write',
  'delay',
  'pnfs_read',
  'pnfs_write',
] as const;

export type NfsEventName = (typeof NFS_EVENT_NAMES)[number];

const NFS_FSTYPES = new Set(['nfs', 'nfs4']);
const U64_MAX = (1n << 64n) - 1n;
const DEVICE_LINE = /^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?\s*$/;
const OPERATION_NAME = /^([A-Za-z0-9_]+):$/;
const PROGRAM_VERSION = /p\/v:\s*\d+\/(\d+)/;
/** Per-op lines print 8 numbers, 9 from kernel 5.6 on. */
const OPERATION_MIN_FIELDS = 8;

/** Decodes the kernel's seq_escape octal escapes (`\040` for a space). */
function unescapeOctal(text: string): string {
  return text.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(Number.parseInt(octal, 8)));
}

/** An unsigned decimal that fits in a u64, or undefined. */
function parseU64(token: string): bigint | undefined {
  if (!/^\d{1,20}$/.test(token)) return undefined;
  const value = BigInt(token);
  return value <= U64_MAX ? value : undefined;
}

/** Every token as a u64, or undefined when any one is not. */
function parseU64s(tokens: readonly string[]): bigint[] | undefined {
  const values: bigint[] = [];
  for (const token of tokens) {
    const value = parseU64(token);
    if (value === undefined) return undefined;
    values.push(value);
  }
  return values;
}

function parseOptions(text: string): Map<string, string> {
  const options = new Map<string, string>();
  for (const option of text.split(',')) {
    if (option === '') continue;
    const equals = option.indexOf('=');
    if (equals === -1) options.set(option, '');
    else options.set(option.slice(0, equals), option.slice(equals + 1));
  }
  return options;
}

function parseBytes(values: readonly bigint[]): NfsBytes | undefined {
  const [normalRead, normalWrite, directRead, directWrite, serverRead, serverWrite, readPages, writePages] = values;
  if (
    normalRead === undefined ||
    normalWrite === undefined ||
    directRead === undefined ||
    directWrite === undefined ||
    serverRead === undefined ||
    serverWrite === undefined ||
    readPages === undefined ||
    writePages === undefined
  ) {
    return undefined;
  }
  return { normalRead, normalWrite, directRead, directWrite, serverRead, serverWrite, readPages, writePages };
}

/**
 * One `xprt:` line. The common core is `[port] bind [connect connect_time idle] sends recvs
 * bad_xids req_u bklog_u`, then statvers 1.1 adds `max_slots sending_u pending_u` for udp, tcp and
 * local, while rdma goes on with its own counters instead.
 */
function parseTransport(tokens: readonly string[]): NfsTransport | undefined {
  const [protocol, ...rest] = tokens;
  const values = parseU64s(rest);
  if (values === undefined) return undefined;
  const at = (index: number): bigint => values[index] ?? 0n;
  switch (protocol) {
    case 'udp': {
      if (values.length !== 7 && values.length !== 10) return undefined;
      return {
        protocol,
        port: at(0),
        bindCount: at(1),
        sends: at(2),
        receives: at(3),
        badXids: at(4),
        cumulativeOutstanding: at(5),
        cumulativeBacklog: at(6),
        ...(values.length === 10 ? { maxSlots: at(7), cumulativeSending: at(8), cumulativePending: at(9) } : {}),
      };
    }
    case 'tcp':
    case 'rdma':
    case 'local': {
      // local sockets print no port; the rest of their line is tcp's.
      const offset = protocol === 'local' ? -1 : 0;
      const core = 10 + offset;
      if (protocol === 'rdma' ? values.length < core : values.length !== core && values.length !== core + 3) return undefined;
      const transport: NfsTransport = {
        protocol,
        port: protocol === 'local' ? undefined : at(0),
        bindCount: at(1 + offset),
        connectCount: at(2 + offset),
        connectTimeSeconds: at(3 + offset),
        idleTimeSeconds: at(4 + offset),
        sends: at(5 + offset),
        receives: at(6 + offset),
        badXids: at(7 + offset),
        cumulativeOutstanding: at(8 + offset),
        cumulativeBacklog: at(9 + offset),
      };
      if (protocol === 'rdma') return { ...transport, rdmaCounters: values.slice(core) };
      if (values.length === core) return transport;
      return { ...transport, maxSlots: at(core), cumulativeSending: at(core + 1), cumulativePending: at(core + 2) };
    }
    default:
      return undefined;
  }
}

function parseOperation(name: string, tokens: readonly string[]): NfsOperation | undefined {
  if (tokens.length < OPERATION_MIN_FIELDS) return undefined;
  const values = parseU64s(tokens);
  if (values === undefined) return undefined;
  const [operations, transmissions, majorTimeouts, bytesSent, bytesReceived, queue, rtt, execute, errors] = values;
  if (
    operations === undefined ||
    transmissions === undefined ||
    majorTimeouts === undefined ||
    bytesSent === undefined ||
    bytesReceived === undefined ||
    queue === undefined ||
    rtt === undefined ||
    execute === undefined
  ) {
    return undefined;
  }
  return {
    name,
    operations,
    transmissions,
    majorTimeouts,
    bytesSent,
    bytesReceived,
    queueMilliseconds: queue,
    rttMilliseconds: rtt,
    executeMilliseconds: execute,
    ...(errors === undefined ? {} : { errors }),
  };
}

/** A mount being read; fields are filled as their lines come. */
interface MountDraft {
  device: string;
  mountpoint: string;
  fstype: string;
  statsVersion: string | undefined;
  options: Map<string, string>;
  ageSeconds: bigint | undefined;
  events: bigint[] | undefined;
  bytes: NfsBytes | undefined;
  rpcProgramVersion: string | undefined;
  transports: NfsTransport[];
  operations: Map<string, NfsOperation>;
  inOperations: boolean;
}

function finish(draft: MountDraft): NfsMount {
  return {
    device: draft.device,
    mountpoint: draft.mountpoint,
    fstype: draft.fstype,
    statsVersion: draft.statsVersion,
    options: draft.options,
    ageSeconds: draft.ageSeconds,
    events: draft.events,
    bytes: draft.bytes,
    rpcProgramVersion: draft.rpcProgramVersion,
    transports: draft.transports,
    operations: [...draft.operations.values()],
  };
}

/** Applies one indented line of an NFS mount's block to its draft; a line that does not fit is ignored. */
function applyLine(draft: MountDraft, line: string): void {
  const tokens = line.split(/\s+/);
  const [tag = '', ...rest] = tokens;
  if (draft.inOperations) {
    const name = OPERATION_NAME.exec(tag)?.[1];
    const operation = name === undefined ? undefined : parseOperation(name, rest);
    if (operation !== undefined) {
      draft.operations.delete(operation.name);
      draft.operations.set(operation.name, operation);
      return;
    }
  }
  switch (tag) {
    case 'opts:':
      if (rest[0] !== undefined) draft.options = parseOptions(rest[0]);
      return;
    case 'age:': {
      const age = rest.length === 1 && rest[0] !== undefined ? parseU64(rest[0]) : undefined;
      if (age !== undefined) draft.ageSeconds = age;
      return;
    }
    case 'events:': {
      const events = parseU64s(rest);
      if (events !== undefined && events.length > 0) draft.events = events;
      return;
    }
    case 'bytes:': {
      const values = parseU64s(rest);
      const bytes = values === undefined || values.length !== 8 ? undefined : parseBytes(values);
      if (bytes !== undefined) draft.bytes = bytes;
      return;
    }
    case 'xprt:': {
      const transport = parseTransport(rest);
      if (transport !== undefined) draft.transports.push(transport);
      return;
    }
    case 'RPC': {
      const version = PROGRAM_VERSION.exec(line)?.[1];
      if (version !== undefined) draft.rpcProgramVersion = version;
      return;
    }
    case 'per-op':
      if (rest[0] === 'statistics') draft.inOperations = true;
      return;
    default:
      // caps:, sec:, nfsv4:, impl_id:, fsc:, pnfs lines, and anything unknown: not needed.
      return;
  }
}

/** Parses a whole mountstats text into its NFS mounts, in file order. Never throws. */
export function parseMountstats(text: string): NfsMount[] {
  const mounts: NfsMount[] = [];
  let draft: MountDraft | undefined;
  for (const rawLine of text.split('\n')) {
    const line = rawLine.trim();
    if (line === '') continue;
    if (line.startsWith('device ')) {
      if (draft !== undefined) mounts.push(finish(draft));
      draft = undefined;
      const match = DEVICE_LINE.exec(line);
      const [, device, mountpoint, fstype, statsVersion] = match ?? [];
      if (device === undefined || mountpoint === undefined || fstype === undefined || !NFS_FSTYPES.has(fstype)) continue;
      draft = {
        device: unescapeOctal(device),
        mountpoint: unescapeOctal(mountpoint),
        fstype,
        statsVersion,
        options: new Map(),
        ageSeconds: undefined,
        events: undefined,
        bytes: undefined,
        rpcProgramVersion: undefined,
        transports: [],
        operations: new Map(),
        inOperations: false,
      };
      continue;
    }
    if (draft !== undefined) applyLine(draft, line);
  }
  if (draft !== undefined) mounts.push(finish(draft));
  return mounts;
}
