import { normalizePciBusId } from '../../core/names.js';
import { classifyXid, type XidRemedy, type XidSeverity } from '../../core/xid.js';

/**
 * Pure parsing of kernel log lines into Xid events. The line format is the one the NVIDIA
 * driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c):
 *
 *   NVRM: Xid (PCI:dddd:bb:dd[ GPU-I:nn[ GPU-CI:nn]]): <xid>, [pid=<pid>, name=<comm>, ]<message>
 *
 * behind whatever prefix the tool that captured it added (dmesg, dmesg -T, dmesg --decode,
 * journalctl, syslog, raw /dev/kmsg). The samples in shared/realworld/xid-kernel-logs/ pin
 * every prefix handled here.
 */

export interface XidEvent {
  /** `dddd:bb:dd`, lower case (core/names.ts). */
  readonly pciBusId: string;
  readonly xid: number;
  /** The driver's text after `pid=…, name=…,` (empty when the line was truncated there). */
  readonly message: string;
  readonly severity: XidSeverity;
  readonly remedy: XidRemedy;
  /** MIG attribution (`GPU-I:05`), when the driver gave one. */
  readonly gpuInstance?: number | undefined;
  readonly computeInstance?: number | undefined;
  /** `'<unknown>'` stays as the driver printed it. */
  readonly pid?: string | undefined;
  readonly processName?: string | undefined;
}

/**
 * Prefixes that capture tools put in front of the kernel's own text, removed one after another
 * until the line starts with the message. Each is anchored so that a prefix can only be taken
 * from the front, never from inside the message.
 */
const LINE_PREFIXES: readonly RegExp[] = [
  // Leading blanks: dmesg indents the continuation lines of a multi-line message.
  /^\s+/,
  // Syslog priority, `<4>`.
  /^<\d{1,3}>/,
  // Raw /dev/kmsg record header, `prio,seq,usec,flags[,…];` (kernel Documentation/ABI/testing/dev-kmsg).
  /^\d+,\d+,\d+,[^;]*;/,
  // `dmesg` time stamps and caller ids: `[ 12345.678901]`, `[Fri Aug 30 11:43:09 2024]`, `[ T1946]`.
  /^\[[^\]\n]{1,40}\]\s*/,
  // `dmesg --decode`: `kern  :warn  : `.
  /^[a-z]+\s*:[a-z]+\s*:\s*/,
  // ISO 8601 time (`dmesg --time-format=iso`, journalctl -o short-iso, rsyslog).
  /^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+/,
  // BSD syslog / journalctl short time, `Feb 01 14:25:31 `. journalctl writes the month in the
  // locale of whoever runs it: `nov 23` (es, it, fr), `déc. 05` (fr), `Dez 05` (de), `ноя 23`
  // (ru), `11月 23` (zh, ja), `11월 23` (ko). The day and the time that must follow keep a
  // word of the message from being taken for a month.
  /^(?:\p{L}{2,5}\.?|\d{1,2}[月월])\s+\d{1,2}\s+\d{2}:\d{2}:\d{2}\s+/u,
  // `host kernel: ` or `kernel: ` (journalctl, syslog).
  /^(?:[\w.-]+\s+)?kernel(?:\[\d+\])?:\s*/,
];

/** Removes capture-tool prefixes; returns the kernel message itself. */
export function stripLinePrefixes(line: string): string {
  let body = line.replace(/\r$/, '');
  // A handful of passes covers the deepest stack seen (`Feb 01 14:25:31 host kernel: [ 1.2] `).
  for (let pass = 0; pass < 8; pass += 1) {
    const before = body;
    for (const prefix of LINE_PREFIXES) body = body.replace(prefix, '');
    if (body === before) break;
  }
  return body;
}

const XID_LINE =
  /^NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): (\d+)(?:,\s*(.*))?$/;

/** `pid=` is the pid or `'<unknown>'`; `name=` is the task's comm (kernel_rc.c prints both only when known). */
const PID_FIELD = /^pid=('[^']*'|[^,\s]+),\s*/;
const NAME_FIELD = /^name=(.*?),(?:\s+|$)/;

/** Parses one `NVRM: Xid` message (prefixes already removed); undefined for anything else. */
export function parseXidMessage(body: string): XidEvent | undefined {
  const match = XID_LINE.exec(body);
  if (!match) return undefined;
  const [, address = '', gpuInstance, computeInstance, code = '', tail = ''] = match;
  const pciBusId = normalizePciBusId(address);
  if (pciBusId === undefined) return undefined;
  const xid = Number(code);
  let rest = tail;
  let pid: string | undefined;
  let processName: string | undefined;
  const pidMatch = PID_FIELD.exec(rest);
  if (pidMatch) {
    pid = pidMatch[1];
    rest = rest.slice(pidMatch[0].length);
    const nameMatch = NAME_FIELD.exec(rest);
    if (nameMatch) {
      processName = nameMatch[1];
      rest = rest.slice(nameMatch[0].length);
    }
  }
  const message = rest.trim();
  const verdict = classifyXid(xid, message);
  return {
    pciBusId,
    xid,
    message,
    severity: verdict.severity,
    remedy: verdict.remedy,
    gpuInstance: gpuInstance === undefined ? undefined : Number(gpuInstance),
    computeInstance: computeInstance === undefined ? undefined : Number(computeInstance),
    pid,
    processName,
  };
}

/** Parses a single line with its prefix; no memory of earlier lines. */
export function parseXidLine(line: string): XidEvent | undefined {
  return parseXidMessage(stripLinePrefixes(line));
}

/**
 * The probe-time report of a lost GPU has no Xid line; nv-pci.c prints it over several
 * `NVRM:` lines (issue NVIDIA/NVSentinel#155):
 *   NVRM: The NVIDIA GPU 0000:b3:00.0
 *   NVRM: (PCI ID: 10de:26b5) installed in this system has
 *   NVRM: fallen off the bus and is not responding to commands.
 * The runtime report (`NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`) is left alone:
 * the driver prints it next to an `Xid …: 79` line, which is already counted.
 */
const LOST_GPU_HEAD = /^NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b/;
const FALLEN_OFF = /fallen off the bus/;
/** The message spans three lines; a little slack covers an interleaved line from another CPU. */
const LOST_GPU_WINDOW_LINES = 4;
const FALLEN_OFF_XID = 79;
const FALLEN_OFF_MESSAGE = 'GPU has fallen off the bus (reported at probe, without an Xid line)';

/**
 * Turns a stream of kernel log lines into Xid events. Stateful only to join the multi-line
 * "fallen off the bus" report, whether its lines arrive as indented dmesg continuations or as
 * separate /dev/kmsg records. One instance per log source.
 */
export class KernelLogParser {
  private lostGpu: { pciBusId: string; linesLeft: number } | undefined;

  push(line: string): XidEvent[] {
    const body = stripLinePrefixes(line);
    const xidEvent = parseXidMessage(body);
    if (xidEvent) return [xidEvent];
    if (!body.startsWith('NVRM:')) {
      this.age();
      return [];
    }
    const head = LOST_GPU_HEAD.exec(body);
    if (head) {
      const pciBusId = normalizePciBusId(head[1] ?? '');
      this.lostGpu = pciBusId === undefined ? undefined : { pciBusId, linesLeft: LOST_GPU_WINDOW_LINES };
    }
    if (this.lostGpu && FALLEN_OFF.test(body)) {
      const { pciBusId } = this.lostGpu;
      this.lostGpu = undefined;
      return [fallenOffBusEvent(pciBusId)];
    }
    if (!head) this.age();
    return [];
  }

  private age(): void {
    if (!this.lostGpu) return;
    this.lostGpu.linesLeft -= 1;
    if (this.lostGpu.linesLeft <= 0) this.lostGpu = undefined;
  }
}

function fallenOffBusEvent(pciBusId: string): XidEvent {
  const verdict = classifyXid(FALLEN_OFF_XID, FALLEN_OFF_MESSAGE);
  return { pciBusId, xid: FALLEN_OFF_XID, message: FALLEN_OFF_MESSAGE, severity: verdict.severity, remedy: verdict.remedy };
}

/**
 * The kernel's first message of every boot (init/version.c, `linux_banner`):
 *   Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 …) #1 SMP PREEMPT_DYNAMIC …
 * A log that spans reboots (a syslog kern.log, `journalctl -k` of several boots) holds one per
 * boot; what comes before the last one belongs to an earlier boot. The sample in
 * shared/realworld/xid-kernel-logs/ pins it in every prefix the other lines have.
 */
export function isBootBanner(line: string): boolean {
  // Cheap test first: this runs on every kernel log line.
  return line.includes('Linux version ') && stripLinePrefixes(line).startsWith('Linux version ');
}

/** Parses a whole log text (a captured file); convenient for tests and one-shot reads. */
export function parseKernelLog(text: string): XidEvent[] {
  const parser = new KernelLogParser();
  return text.split('\n').flatMap((line) => parser.push(line));
}
