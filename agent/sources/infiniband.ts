// Synchronous on purpose: sysfs attributes are generated in memory and never block, and one
// thread-pool round trip per file (hundreds per scrape on an 8-HCA node) cost more than the reads.
import { closeSync, openSync, readSync, readdirSync as readdir, statSync as stat } from 'node:fs';

/** sysfs attributes are at most a page. */
const ATTRIBUTE_BYTES = 4096;

/** open, read, close: one syscall fewer than readFileSync, and no allocation but the string. */
function readAttribute(path: string, buffer: Buffer): string {
  const fd = openSync(path, 'r');
  try {
    const length = readSync(fd, buffer, 0, buffer.length, 0);
    return buffer.toString('utf8', 0, length);
  } finally {
    closeSync(fd);
  }
}
import { join } from 'node:path';
import { errorMessage } from '../../core/errors.js';

/**
 * Reads a `/sys/class/infiniband` tree into typed per-device, per-port data. Pure reading and
 * parsing: no metrics, no logging. What cannot be read or understood in a single file is
 * returned as a problem and the value left absent; only a directory that cannot be listed
 * fails the whole read (kernel Documentation/ABI/stable/sysfs-class-infiniband).
 */

/** `<sysfs>/class/infiniband`. */
export function infinibandClassDir(sysfs: string): string {
  return join(sysfs, 'class', 'infiniband');
}

/** Files under `ports/<n>/counters/` that are read (PMA PortCounters and PortCountersExtended). */
export const PORT_COUNTER_FILES = [
  'port_rcv_data',
  'port_xmit_data',
  'port_rcv_packets',
  'port_xmit_packets',
  'unicast_rcv_packets',
  'unicast_xmit_packets',
  'multicast_rcv_packets',
  'multicast_xmit_packets',
  'link_downed',
  'link_error_recovery',
  'symbol_error',
  'port_rcv_errors',
  'port_rcv_remote_physical_errors',
  'port_xmit_discards',
  'port_rcv_discards',
  'port_xmit_wait',
  'local_link_integrity_errors',
  'excessive_buffer_overrun_errors',
] as const;

/**
 * Files under `ports/<n>/counters_ext/` that are read: the 64-bit PortCountersExtended values of
 * drivers that keep them apart from the 32-bit `counters/` ones (mlx4), which saturate within
 * seconds at 40 Gb/s and above.
 */
export const PORT_EXT_COUNTER_FILES = [
  'port_rcv_data_64',
  'port_xmit_data_64',
  'port_rcv_packets_64',
  'port_xmit_packets_64',
  'port_unicast_rcv_packets',
  'port_unicast_xmit_packets',
  'port_multicast_rcv_packets',
  'port_multicast_xmit_packets',
] as const;

/** Files under `ports/<n>/hw_counters/` that are read (driver counters; mlx5 names). */
export const HW_COUNTER_FILES = [
  'np_cnp_sent',
  'rp_cnp_handled',
  'np_ecn_marked_roce_packets',
  'roce_adp_retrans',
  'local_ack_timeout_err',
  'out_of_sequence',
  'packet_seq_err',
  'out_of_buffer',
] as const;

export type PortCounterName = (typeof PORT_COUNTER_FILES)[number];
export type PortExtCounterName = (typeof PORT_EXT_COUNTER_FILES)[number];
export type HwCounterName = (typeof HW_COUNTER_FILES)[number];

/** `state` (`4: ACTIVE`) or `phys_state` (`5: LinkUp`): the numeric code and the kernel's name for it. */
export interface PortState {
  readonly code: number;
  readonly name: string;
}

/** IB logical port state ACTIVE (IBA 14.2.5.6, PortInfo:PortState). */
export const PORT_STATE_ACTIVE = 4;
/** IB physical port state LinkUp (IBA 14.2.5.6, PortInfo:PortPhysicalState). */
export const PHYSICAL_STATE_LINK_UP = 5;

export interface InfinibandPort {
  readonly device: string;
  /** Port number as written in the directory name (`1`). */
  readonly port: string;
  readonly state?: PortState | undefined;
  readonly physicalState?: PortState | undefined;
  /** Signalling rate from `rate` (`400 Gb/sec (4X NDR)`), in bytes per second. */
  readonly rateBytesPerSecond?: number | undefined;
  /** `InfiniBand` or `Ethernet` (RoCE). */
  readonly linkLayer?: string | undefined;
  /** Raw values as the kernel writes them; `port_rcv_data`/`port_xmit_data` are 4-octet words. */
  readonly counters: Readonly<Partial<Record<PortCounterName, number>>>;
  /** Absent when the port has no `counters_ext/` directory. */
  readonly extCounters?: Readonly<Partial<Record<PortExtCounterName, number>>> | undefined;
  /** Absent when the port has no `hw_counters/` directory (only some drivers have one). */
  readonly hwCounters?: Readonly<Partial<Record<HwCounterName, number>>> | undefined;
}

export interface InfinibandDevice {
  readonly name: string;
  readonly hcaType?: string | undefined;
  readonly firmwareVersion?: string | undefined;
  readonly boardId?: string | undefined;
  /** Sorted by port number. */
  readonly ports: readonly InfinibandPort[];
}

/** A file that exists but could not be read or parsed; its value is absent. */
export interface FileProblem {
  readonly path: string;
  readonly reason: string;
}

export interface InfinibandClass {
  /** Sorted by name; empty when the class directory does not exist (no RDMA hardware). */
  readonly devices: readonly InfinibandDevice[];
  readonly problems: readonly FileProblem[];
}

/** What a counter file holds. `unavailable` is the kernel's `N/A (no PMA)`: absent, and expected. */
export type CounterReading = { readonly kind: 'value'; readonly value: number } | { readonly kind: 'unavailable' } | { readonly kind: 'invalid' };

const DECIMAL = /^\d+$/;

/** Parses a counter file. Never throws. */
export function parseCounter(text: string): CounterReading {
  const trimmed = text.trim();
  if (DECIMAL.test(trimmed)) {
    const value = Number(trimmed);
    // More digits than a double can hold is not a counter reading.
    return Number.isFinite(value) ? { kind: 'value', value } : { kind: 'invalid' };
  }
  if (trimmed.startsWith('N/A')) return { kind: 'unavailable' };
  return { kind: 'invalid' };
}

const STATE = /^(\d+)(?:\s*:\s*(.*))?$/s;

/** Parses `state` or `phys_state` (`4: ACTIVE`, `5: LinkUp`). Never throws. */
export function parsePortState(text: string): PortState | undefined {
  const match = STATE.exec(text.trim());
  if (!match?.[1]) return undefined;
  const code = Number(match[1]);
  if (!Number.isSafeInteger(code)) return undefined;
  return { code, name: (match[2] ?? '').trim() };
}

const RATE = /^(\d+(?:\.\d+)?)\s*([MGT])b\/sec\b/;
const BITS_PER_UNIT: Readonly<Record<string, number>> = { M: 1e6, G: 1e9, T: 1e12 };

/** Parses `rate` (`400 Gb/sec (4X NDR)`, `2.5 Gb/sec (1X SDR)`) into bytes per second. Never throws. */
export function parseRate(text: string): number | undefined {
  const match = RATE.exec(text.trim());
  if (!match?.[1] || !match[2]) return undefined;
  const bitsPerUnit = BITS_PER_UNIT[match[2]];
  if (bitsPerUnit === undefined) return undefined;
  const bytes = (Number(match[1]) * bitsPerUnit) / 8;
  return Number.isFinite(bytes) ? bytes : undefined;
}

/** PortXmitData/PortRcvData count 4-octet words (IBA 16.1.3.5); this is the byte count. */
export function wordsToBytes(words: number | undefined): number | undefined {
  return words === undefined ? undefined : words * 4;
}

type Direction = 'received' | 'transmitted';

/** Data octets received or transmitted: the 64-bit `counters_ext/` word count when there is one. */
export function dataBytes(port: InfinibandPort, direction: Direction): number | undefined {
  const ext = port.extCounters;
  return direction === 'received'
    ? wordsToBytes(ext?.port_rcv_data_64 ?? port.counters.port_rcv_data)
    : wordsToBytes(ext?.port_xmit_data_64 ?? port.counters.port_xmit_data);
}

/** Unicast packets, from `counters/` or else the `counters_ext/` spelling. */
export function unicastPackets(port: InfinibandPort, direction: Direction): number | undefined {
  const ext = port.extCounters;
  return direction === 'received'
    ? (port.counters.unicast_rcv_packets ?? ext?.port_unicast_rcv_packets)
    : (port.counters.unicast_xmit_packets ?? ext?.port_unicast_xmit_packets);
}

/** Multicast packets, from `counters/` or else the `counters_ext/` spelling. */
export function multicastPackets(port: InfinibandPort, direction: Direction): number | undefined {
  const ext = port.extCounters;
  return direction === 'received'
    ? (port.counters.multicast_rcv_packets ?? ext?.port_multicast_rcv_packets)
    : (port.counters.multicast_xmit_packets ?? ext?.port_multicast_xmit_packets);
}

/**
 * Packets received or transmitted on all VLs: the 64-bit `counters_ext/` count when there is one,
 * then `port_rcv_packets`/`port_xmit_packets`, otherwise the sum of unicast and multicast when
 * both exist (some drivers only have the PortCountersExtended split). A partial sum would
 * undercount, so one of the two alone gives no value.
 */
export function packetCount(port: InfinibandPort, direction: Direction): number | undefined {
  const all =
    direction === 'received'
      ? (port.extCounters?.port_rcv_packets_64 ?? port.counters.port_rcv_packets)
      : (port.extCounters?.port_xmit_packets_64 ?? port.counters.port_xmit_packets);
  if (all !== undefined) return all;
  const unicast = unicastPackets(port, direction);
  const multicast = multicastPackets(port, direction);
  return unicast !== undefined && multicast !== undefined ? unicast + multicast : undefined;
}

/** Whether the port can carry traffic: logically ACTIVE and physically LinkUp. Unknown when either is unknown. */
export function portUp(port: InfinibandPort): boolean | undefined {
  if (port.state === undefined || port.physicalState === undefined) return undefined;
  return port.state.code === PORT_STATE_ACTIVE && port.physicalState.code === PHYSICAL_STATE_LINK_UP;
}

function errnoCode(error: unknown): string | undefined {
  return error instanceof Error && 'code' in error && typeof error.code === 'string' ? error.code : undefined;
}

/** A device or port that vanishes mid-read is simply gone, not an error. */
function isGone(error: unknown): boolean {
  return errnoCode(error) === 'ENOENT';
}

/**
 * Values that do not change while a device stays plugged in (firmware, board, link layer, which
 * counter files exist), kept between scrapes by the collector. It must clear the cache when the
 * set of devices changes, and now and then anyway.
 */
export type StableAttributeCache = Map<string, string | string[] | undefined>;

/** Collects the problems of one read; every reader below reports into one of these. */
class Reader {
  readonly problems: FileProblem[] = [];

  /** One buffer serves every read of a scrape (reads are synchronous, so never shared). */
  private readonly buffer = Buffer.alloc(ATTRIBUTE_BYTES);

  constructor(private readonly cache: StableAttributeCache = new Map()) {}

  async stableList(path: string): Promise<string[] | undefined> {
    if (this.cache.has(path)) return this.cache.get(path) as string[] | undefined;
    const listed = await this.list(path);
    this.cache.set(path, listed);
    return listed;
  }

  async stableText(path: string): Promise<string | undefined> {
    if (this.cache.has(path)) return this.cache.get(path) as string | undefined;
    const text = await this.text(path);
    this.cache.set(path, text);
    return text;
  }

  private problem(path: string, reason: string): void {
    this.problems.push({ path, reason });
  }

  /** Lists a directory; undefined when it does not exist. Throws for any other failure. */
  async list(path: string): Promise<string[] | undefined> {
    try {
      return readdir(path);
    } catch (error) {
      if (isGone(error)) return undefined;
      throw new Error(`cannot list ${path}: ${errorMessage(error)}`, { cause: error });
    }
  }

  /** The trimmed text of a file; undefined when it does not exist, or (reported) cannot be read. */
  async text(path: string): Promise<string | undefined> {
    try {
      return readAttribute(path, this.buffer).trim();
    } catch (error) {
      if (!isGone(error)) this.problem(path, errorMessage(error));
      return undefined;
    }
  }

  async parsed<T>(path: string, parse: (text: string) => T | undefined, what: string): Promise<T | undefined> {
    const text = await this.text(path);
    if (text === undefined) return undefined;
    const value = parse(text);
    if (value === undefined) this.problem(path, `not a ${what}: ${JSON.stringify(text.slice(0, 80))}`);
    return value;
  }

  /** Reads the known counter files present in `dir`; undefined when `dir` does not exist. */
  async counters<N extends string>(dir: string, names: readonly N[]): Promise<Partial<Record<N, number>> | undefined> {
    const present = await this.stableList(dir);
    if (present === undefined) return undefined;
    const listed = new Set(present);
    const wanted = names.filter((name) => listed.has(name));
    const readings = await Promise.all(
      wanted.map(async (name) => {
        const path = join(dir, name);
        const text = await this.text(path);
        if (text === undefined) return undefined;
        const reading = parseCounter(text);
        if (reading.kind === 'invalid') this.problem(path, `not a counter: ${JSON.stringify(text.slice(0, 80))}`);
        return reading.kind === 'value' ? ([name, reading.value] as const) : undefined;
      }),
    );
    const values: Partial<Record<N, number>> = {};
    for (const reading of readings) if (reading) values[reading[0]] = reading[1];
    return values;
  }
}

async function readPort(reader: Reader, device: string, portDir: string, port: string): Promise<InfinibandPort> {
  const [state, physicalState, rateBytesPerSecond, linkLayer, counters, extCounters, hwCounters] = await Promise.all([
    reader.parsed(join(portDir, 'state'), parsePortState, 'port state'),
    reader.parsed(join(portDir, 'phys_state'), parsePortState, 'physical port state'),
    reader.parsed(join(portDir, 'rate'), parseRate, 'rate'),
    reader.stableText(join(portDir, 'link_layer')),
    reader.counters(join(portDir, 'counters'), PORT_COUNTER_FILES),
    reader.counters(join(portDir, 'counters_ext'), PORT_EXT_COUNTER_FILES),
    reader.counters(join(portDir, 'hw_counters'), HW_COUNTER_FILES),
  ]);
  return { device, port, state, physicalState, rateBytesPerSecond, linkLayer: linkLayer || undefined, counters: counters ?? {}, extCounters, hwCounters };
}

async function isDirectory(path: string): Promise<boolean> {
  try {
    return stat(path).isDirectory();
  } catch (error) {
    if (isGone(error)) return false;
    throw new Error(`cannot stat ${path}: ${errorMessage(error)}`, { cause: error });
  }
}

async function readDevice(reader: Reader, classDir: string, name: string): Promise<InfinibandDevice | undefined> {
  const deviceDir = join(classDir, name);
  // Entries are symlinks into /sys/devices; anything that is not a directory is not a device.
  if (!(await isDirectory(deviceDir))) return undefined;
  const portsDir = join(deviceDir, 'ports');
  const [hcaType, firmwareVersion, boardId, portNames] = await Promise.all([
    reader.stableText(join(deviceDir, 'hca_type')),
    reader.stableText(join(deviceDir, 'fw_ver')),
    reader.stableText(join(deviceDir, 'board_id')),
    reader.stableList(portsDir),
  ]);
  const numbered = (portNames ?? []).filter((port) => DECIMAL.test(port)).sort((a, b) => Number(a) - Number(b));
  const ports = await Promise.all(numbered.map((port) => readPort(reader, name, join(portsDir, port), port)));
  return { name, hcaType: hcaType || undefined, firmwareVersion: firmwareVersion || undefined, boardId: boardId || undefined, ports };
}

/**
 * Reads every device and port under `classDir` (`<sysfs>/class/infiniband`). Resolves with no
 * devices when the directory does not exist; rejects when a directory exists but cannot be listed.
 */
export async function readInfinibandClass(classDir: string, cache?: StableAttributeCache): Promise<InfinibandClass> {
  const reader = new Reader(cache);
  const names = await reader.list(classDir);
  if (names === undefined) return { devices: [], problems: [] };
  const devices = await Promise.all([...names].sort().map((name) => readDevice(reader, classDir, name)));
  return { devices: devices.filter((device): device is InfinibandDevice => device !== undefined), problems: reader.problems };
}
