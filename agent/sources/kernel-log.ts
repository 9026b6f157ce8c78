import { normalizePciBusId } from '../../core/names.js';
import { classifyXid, type XidRemedy, type XidSeverity } from '../../core/xid.js';

/**
 * Pure parsing of kernel log lines into Xid events. The line format is the one the NVIDIA
 * driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c):
 *
 *   NVRM: Xid (PCI:dddd:bb:dd[ GPU-I:nn[ GPU-CI:nn]]): <xid>, [pid=<pid>, name=<comm>, ]<message>
 *
 * behind whatever prefix the tool that captured it added (dmesg, dmesg -T, dmesg --decode,
 * journalctl, syslog, raw /dev/kmsg). The samples in test/fixtures/realworld/xid-kernel-logs/ pin
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
 * What capture tools put in front of the kernel's own text, outermost first. Each step takes at
 * most its own prefix, anchored at the front, and the steps run in this order, so that no pattern
 * can reach into the message: a later step never sees text an earlier one would have to skip, and
 * the message's own words (`watchdog:`, `nvidia-nvswitch0:`, `[Hardware Error]`, `kernel:`) are
 * never taken for a prefix.
 *
 *   [<pri>[1 ]]                          syslog priority (`dmesg -r`), RFC 5424 version
 *   [prio,seq,usec,flags;]               a raw /dev/kmsg record
 *   [writer time [host] kernel[pid]:]    syslog, rsyslog, journalctl -o short/-iso/-precise/-monotonic/-full/-unix
 *   [facility :level :]                  dmesg --decode
 *   [time] [caller] …                    dmesg: `[ 12.3]`, `dmesg -T` in any locale, `[ T1946]`, `[  +0.0008]`, ISO
 */
const LEADING_BLANKS = /^[ \t]+/;
const SYSLOG_PRIORITY = /^<\d{1,3}>(?:1 )?/;
// kernel Documentation/ABI/testing/dev-kmsg.
const KMSG_HEADER = /^\d+,\d+,\d+,[^;]*;/;
/**
 * `host kernel:`, `kernel[123]:`, or RFC 5424's `host kernel - - -` (app name, proc id, msg id,
 * structured data). A host name holds no colon or bracket, so `audit: kernel:` is message text.
 */
const SYSLOG_TAG_TEXT = String.raw`(?:[^\s:\[\]]+\s+)?kernel(?:\[\d+\])?(?::|\s+\S+\s+\S+\s+(?:-|\[[^\]]*\]))`;
const SYSLOG_TAG = new RegExp(String.raw`^${SYSLOG_TAG_TEXT}\s*`);
const ISO_TIME = /^\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?\s+/;
/**
 * The log writer's time stamp, before the host and the `kernel:` tag. journalctl and syslog write
 * the month in the locale of whoever runs them: `Jan`, `nov` (es, it), `déc.` `janv.` (fr), `Mär`
 * `Dez` (de), `фев` (ru), `1月` (zh, ja), `1월` (ko); `-o short-precise` adds microseconds. The
 * day and the time that must follow keep a word of the message from being taken for a month.
 */
const WRITER_TIMES: readonly RegExp[] = [
  ISO_TIME,
  /^(?:\p{L}{2,5}\.?|\d{1,2}[月월])\s+\d{1,2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+/u,
  // journalctl -o short-full: `Sun 2025-01-05 18:28:55 UTC`.
  /^\p{L}{2,5}\.?\s+\d{4}-\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+[\w+:-]{1,8}\s+/u,
  // journalctl -o short-unix: `1736101735.123456`.
  /^\d{9,11}\.\d{1,9}\s+/,
  // journalctl -o short-monotonic: `[ 1234.567890] host kernel:`; a dmesg stamp without the tag is left to the dmesg step.
  new RegExp(String.raw`^\[\s*\d+\.\d+\]\s+(?=${SYSLOG_TAG_TEXT})`),
];
/** `dmesg --decode` (util-linux facility and level names): `kern  :warn  : `, `syslog:err   : `. */
const DMESG_DECODE =
  /^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7])\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*:\s*/;
/**
 * A bracketed dmesg stamp, and only that: seconds (`[ 12345.678901]`, `[  +0.000844]`,
 * `[<    0.000010>]`), a caller id (`[ T1946]`, `[    C3]`), or anything holding a clock time
 * (`dmesg -T` in any locale: `[Sun Jan  5 18:28:55 2025]`, `[So Jan  5 …]`, `[dim. janv.  5 …]`,
 * `[二 9月  3 05:57:48 2024]`; `--reltime`: `[May19 19:57]`). Brackets of the message itself
 * (`[Hardware Error]`, `[drm]`, `[ 0] RxErr`) hold none of these.
 */
const DMESG_STAMP = /^\[\s*(?:<?\s*[+-]?\d+[.,]\d+>?|[TC]\d+|[^\]\n]{0,40}?\d{1,2}:\d{2}[^\]\n]{0,40}?)\s*\]\s*/;
const DMESG_STAMPS: readonly RegExp[] = [ISO_TIME, DMESG_STAMP];
/** rsyslog writes the /dev/kmsg dictionary of a record after it as `#012 SUBSYSTEM=pci#012 DEVICE=+pci:…`. */
const ESCAPED_DICTIONARY = /(?:#012 [A-Z][A-Z0-9_]*=\S*)+$/;

function take(text: string, prefix: RegExp): string {
  const match = prefix.exec(text);
  return match ? text.slice(match[0].length) : text;
}

function takeFirst(text: string, prefixes: readonly RegExp[]): string {
  for (const prefix of prefixes) {
    const match = prefix.exec(text);
    if (match) return text.slice(match[0].length);
  }
  return text;
}

/** Removes capture-tool prefixes; returns the kernel message itself. */
export function stripLinePrefixes(line: string): string {
  let body = line.endsWith('\r') ? line.slice(0, -1) : line;
  body = take(body, LEADING_BLANKS);
  body = take(body, SYSLOG_PRIORITY);
  body = take(body, KMSG_HEADER);
  body = take(takeFirst(body, WRITER_TIMES), SYSLOG_TAG);
  body = take(body, DMESG_DECODE);
  // A time stamp and a caller id (`[ 12.345][ T1234]`), or an ISO time (`dmesg --time-format=iso`).
  for (let stamp = 0; stamp < 3; stamp += 1) {
    const before = body;
    body = takeFirst(body, DMESG_STAMPS);
    if (body === before) break;
  }
  body = take(body, LEADING_BLANKS);
  return body.includes('#012 ') ? body.replace(ESCAPED_DICTIONARY, '') : body;
}

/**
 * A /dev/kmsg record's dictionary (` SUBSYSTEM=pci`, ` DEVICE=+pci:0000:01:00.0`): key=value lines
 * indented by a blank that follow the message when a raw record is written to a file. Not message
 * text; the parsers skip them without counting them as lines.
 */
export function isKmsgDictionaryLine(line: string): boolean {
  return /^[ \t]+[A-Z][A-Z0-9_]*=/.test(line);
}

const XID_LINE = /^NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)(?: GPU-I:(\d+))?(?: GPU-CI:(\d+))?\): (\d+)(?:,\s*(.*))?$/;

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
 * A GPU that falls off the bus is reported in up to four ways, and several of them for one fall:
 *   NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
 *   NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.            (beside the Xid, current drivers)
 *   NVRM: GPU at 0000:01:00.0 has fallen off the bus.               (beside the Xid, or alone, older drivers)
 *   NVRM: The NVIDIA GPU 0000:b3:00.0                               (at probe, no Xid; issue NVIDIA/NVSentinel#155)
 *   NVRM: (PCI ID: 10de:26b5) installed in this system has
 *   NVRM: fallen off the bus and is not responding to commands.
 * Each becomes Xid 79 for that GPU, once per boot: a GPU off the bus stays off until the node is
 * rebooted (NVIDIA's remedy for Xid 79), so a later report of it before the next boot banner is the
 * same fall told again, not news (docs/agent.md, "The counting rule").
 */
const FALLEN_OFF_XID = 79;
const PCI_ADDRESS = String.raw`[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?`;
const FALLEN_OFF_NOTICES: readonly RegExp[] = [
  new RegExp(String.raw`^NVRM: GPU (${PCI_ADDRESS}): GPU has fallen off the bus`),
  new RegExp(String.raw`^NVRM: GPU at (?:PCI:)?(${PCI_ADDRESS}) has fallen off the bus`),
];
const LOST_GPU_HEAD = new RegExp(String.raw`^NVRM: The NVIDIA GPU (${PCI_ADDRESS})\b`);
const FALLEN_OFF = /fallen off the bus/;
/** The probe report spans three lines; a little slack covers an interleaved line from another CPU. */
const LOST_GPU_WINDOW_LINES = 4;
const NOTICE_MESSAGE = 'GPU has fallen off the bus (reported without an Xid line)';
const PROBE_MESSAGE = 'GPU has fallen off the bus (reported at probe, without an Xid line)';

/**
 * Turns a stream of kernel log lines into Xid events. Stateful to join the multi-line probe report
 * (whether its lines arrive as indented dmesg continuations or as separate /dev/kmsg records) and
 * to count each GPU's fall off the bus once per boot. One instance per log source.
 */
export class KernelLogParser {
  private lostGpu: { pciBusId: string; linesLeft: number } | undefined;
  /** GPUs reported off the bus since the last boot banner. */
  private readonly fallen = new Set<string>();

  push(line: string): XidEvent[] {
    if (isKmsgDictionaryLine(line)) return [];
    if (isBootBanner(line)) {
      this.fallen.clear();
      this.lostGpu = undefined;
      return [];
    }
    const body = stripLinePrefixes(line);
    const xidEvent = parseXidMessage(body);
    if (xidEvent) return xidEvent.xid === FALLEN_OFF_XID ? this.fellOff(xidEvent) : [xidEvent];
    if (!body.startsWith('NVRM:')) {
      this.age();
      return [];
    }
    for (const notice of FALLEN_OFF_NOTICES) {
      const pciBusId = normalizePciBusId(notice.exec(body)?.[1] ?? '');
      if (pciBusId !== undefined) return this.fellOff(fallenOffBusEvent(pciBusId, NOTICE_MESSAGE));
    }
    const head = LOST_GPU_HEAD.exec(body);
    if (head) {
      const pciBusId = normalizePciBusId(head[1] ?? '');
      this.lostGpu = pciBusId === undefined ? undefined : { pciBusId, linesLeft: LOST_GPU_WINDOW_LINES };
    }
    if (this.lostGpu && FALLEN_OFF.test(body)) {
      const { pciBusId } = this.lostGpu;
      this.lostGpu = undefined;
      return this.fellOff(fallenOffBusEvent(pciBusId, PROBE_MESSAGE));
    }
    if (!head) this.age();
    return [];
  }

  /** The first report of a GPU's fall in this boot is the event; the others are the same fall. */
  private fellOff(event: XidEvent): XidEvent[] {
    if (this.fallen.has(event.pciBusId)) return [];
    this.fallen.add(event.pciBusId);
    return [event];
  }

  private age(): void {
    if (!this.lostGpu) return;
    this.lostGpu.linesLeft -= 1;
    if (this.lostGpu.linesLeft <= 0) this.lostGpu = undefined;
  }
}

function fallenOffBusEvent(pciBusId: string, message: string): XidEvent {
  const verdict = classifyXid(FALLEN_OFF_XID, message);
  return { pciBusId, xid: FALLEN_OFF_XID, message, severity: verdict.severity, remedy: verdict.remedy };
}

/**
 * The kernel's first message of every boot (init/version.c, `linux_banner`):
 *   Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) (gcc-12 …) #1 SMP PREEMPT_DYNAMIC …
 * A log that spans reboots (a syslog kern.log, `journalctl -k` of several boots) holds one per
 * boot; what comes before the last one belongs to an earlier boot. The sample in
 * test/fixtures/realworld/xid-kernel-logs/ pins it in every prefix the other lines have.
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
