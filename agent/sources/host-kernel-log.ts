import { normalizePciBusId } from '../../core/names.js';
import { isBootBanner, isKmsgDictionaryLine, stripLinePrefixes } from './kernel-log.js';

/**
 * Pure parsing of the host-side kernel log signals that sit beside the Xids: soft lockups, hung
 * tasks (and hung tasks stuck inside the NVIDIA driver), OOM kills, machine checks, PCIe AER
 * errors, NVSwitch SXid errors and the NVRM messages of a GPU the driver cannot bring up. The
 * formats are the kernel's own (kernel/watchdog.c, kernel/hung_task.c, mm/oom_kill.c,
 * arch/x86/kernel/cpu/mce, drivers/pci/pcie/aer.c) and the NVIDIA drivers'; the samples in
 * test/fixtures/realworld/host-kernel-logs/ pin every shape handled here. Prefixes (dmesg, journalctl,
 * /dev/kmsg) are removed by the same code the Xid parser uses.
 */

export type HostKernelEventKind =
  | 'soft_lockup'
  | 'hung_task'
  /** A hung task whose stack runs through an NVIDIA kernel module: the driver itself is stuck. */
  | 'hung_task_nvidia'
  | 'oom_kill'
  | 'machine_check'
  | 'pcie_aer'
  /** `RmInitAdapter failed!`: the driver cannot bring the GPU up; it is lost until repaired. */
  | 'gpu_init_failed'
  /** The driver stopped printing GSP RPC errors for a GPU because it "likely needs to be reset". */
  | 'gpu_reset_needed';

/**
 * Severity of a hardware error as the kernel states it. `logged`: a machine check the kernel
 * recorded and survived (corrected, or recovered from); its line does not say which.
 */
export type HardwareSeverity = 'corrected' | 'uncorrected_nonfatal' | 'fatal' | 'logged';

export interface HostKernelEvent {
  readonly kind: HostKernelEventKind;
  /** For pcie_aer, machine_check: what the kernel said about it. */
  readonly severity?: HardwareSeverity | undefined;
  /**
   * `dddd:bb:dd` for GPUs; for AER `dddd:bb:dd.f`, the device the report is about (a port is not
   * always a GPU): the error source the headline names when a detail line confirms it, else the
   * device of the first detail line, else the named source, else the reporting port.
   */
  readonly device?: string | undefined;
  /** The task the kernel named (comm), for lockups, hung tasks and OOM kills. */
  readonly task?: string | undefined;
  /** The killed process, for OOM kills. */
  readonly pid?: number | undefined;
  /** The kernel's own text, for logs and fast-path messages. */
  readonly message: string;
}

export interface SxidEvent {
  /** The NVSwitch's PCI address, `dddd:bb:dd.f`. */
  readonly nvswitch: string;
  readonly sxid: number;
  readonly fatal: boolean;
  /** Link number, when the line gives one (`Link 30`). */
  readonly link?: number | undefined;
  readonly message: string;
}

export interface HostKernelParse {
  readonly events: HostKernelEvent[];
  readonly sxids: SxidEvent[];
}

/** `dddd:bb:dd.f`, lower case; the function digit stays because an AER port and its GPU differ there. */
function pciFunctionAddress(raw: string): string | undefined {
  const match = /^([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$/.exec(raw);
  if (!match) return undefined;
  const [, domain = '', bus = '', device = '', fn = ''] = match;
  return `${domain.slice(-4)}:${bus}:${device}.${fn}`.toLowerCase();
}

// kernel/watchdog.c: `watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:2254956]`; kernels
// before 4.13 say `NMI watchdog: BUG: …`. The comm may hold blanks, colons and brackets
// (`[kworker/0:0H:6]`, `[Web Content:18189]`): it is everything up to the last `:<pid>]`.
const SOFT_LOCKUP = /^(?:(?:NMI )?watchdog: )?BUG: soft lockup - CPU#\d+ stuck for \d+s! \[(.+):\d+\]/;
// kernel/hung_task.c: `INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.` The comm may hold colons.
const HUNG_TASK = /^INFO: task (.+):\d+ blocked for more than \d+ seconds\./;
// mm/oom_kill.c prints up to three lines for one kill, each naming the victim's pid: the summary
// `oom-kill:constraint=…,task=python3,pid=1234,uid=0` (4.19 and later), `[Out of memory: |Memory
// cgroup out of memory: ]Killed process 1234 (python3) …` and, when the reaper had to help,
// `oom_reaper: reaped process 1234 (python3), …`. `Kill process 1234 … or sacrifice child` is not
// one: it names the process chosen, and the one killed may be a child.
const OOM_SUMMARY = /^oom-kill:.*?,task=(.*?),pid=(\d+)(?:,uid=-?\d+)?\s*$/;
const OOM_KILLED = /(?:^|: )Killed process (\d+),? (?:UID \d+, )?\((.*?)\)(?=[ ,.]|$)/;
const OOM_REAPED = /^oom_reaper: reaped process (\d+) \((.*?)\)(?=[ ,.]|$)/;
/** Lines within which the lines of one kill are looked for; pids are not reused that fast. */
const OOM_KILL_WINDOW_LINES = 1000;
// arch/x86/kernel/cpu/mce: errors the kernel survives are reported by this line; a fatal one panics.
// Kernels before the `mce: ` prefix print the `[Hardware Error]: ` part alone.
const MCE_LOGGED = /^(?:mce: )?\[Hardware Error\]: Machine check events logged/;
const MCE_FATAL = /^(?:Kernel panic - not syncing: Fatal [Mm]achine check|(?:mce: )?\[Hardware Error\]: .*Machine Check Exception)/;
const PCI_FUNCTION = String.raw`[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]`;
// drivers/pci/pcie/aer.c prints one report in two parts. The root port that received the error
// message names its source (`aer_print_port_info`; since 6.8 `aer_print_source`):
//   pcieport 0000:00:01.0: AER: [Multiple ]Corrected error received: 0000:01:00.0      (4.17 … 6.7)
//   pcieport 0000:00:1c.5: AER: [Multiple ]Corrected error received: id=00e5           (before 4.17)
//   pcieport 0000:00:01.0: AER: [Multiple ]Correctable error message received from 0000:01:00.0  (6.8 and later)
// with `Uncorrected (Non-Fatal)`/`Uncorrectable (Non-Fatal)`, `… (Fatal)` for the others. Then
// each device found holding the error prints its status (`aer_print_error`), with its own driver
// and address: `nvidia 0000:01:00.0: [AER: ]PCIe Bus Error: severity=Corrected, type=…`, followed by
// `device [10de:2330] error status/mask=…` and one `[ n] Name` line per error bit. Firmware-first
// (APEI) reports and old kernels print the detail alone (Documentation/PCI/pcieaer-howto.rst).
const AER_HEADLINE = new RegExp(
  String.raw`^(?:\S+ )?(${PCI_FUNCTION}): (?:AER: )?(?:Multiple )?(Correct(?:ed|able)|Uncorrect(?:ed|able) \((?:Non-Fatal|Fatal)\)) error (?:received:|message received from) (?:id=([0-9a-fA-F]{4})\b|(${PCI_FUNCTION}))`,
);
const AER_DETAIL = new RegExp(String.raw`^(?:\S+ )?(${PCI_FUNCTION}): (?:AER: )?PCIe Bus Error: severity=([^,]+),`);
/** Lines after a headline, or after its last detail line, within which its detail lines are looked for. */
const AER_REPORT_WINDOW_LINES = 16;
// NVIDIA nvswitch driver: `nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up`.
// The `…: 20034, Data {…}` line that follows repeats the code with its raw data: not a second error.
const SXID = /^nvidia-nvswitch\d+: SXid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\): (\d+), (Fatal|Non-fatal)\b,?\s*(.*)$/;
const RM_INIT_FAILED = /^NVRM: GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?): RmInitAdapter failed!/;
const GSP_RESET_NEEDED = /^NVRM: Rate limiting GSP RPC error prints for GPU at PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}).*needs to be reset/;
/** A stack frame in an NVIDIA kernel module: `os_acquire_rwlock_read+0x35/0x50 [nvidia]`, `… [nvidia_uvm]`. */
const NVIDIA_FRAME = /\+0x[0-9a-f]+\/0x[0-9a-f]+ \[nvidia(?:_uvm|_modeset|_drm|_peermem)?\]\s*$/;
/** Lines of a hung-task report in which an NVIDIA frame still belongs to it. */
const HUNG_REPORT_LINES = 64;

function aerSeverity(text: string): HardwareSeverity | undefined {
  if (/^Correct(?:ed|able)$/.test(text)) return 'corrected';
  if (/^Uncorrect(?:ed|able) \(Non-Fatal\)$/i.test(text)) return 'uncorrected_nonfatal';
  if (/^Uncorrect(?:ed|able) \(Fatal\)$/i.test(text)) return 'fatal';
  return undefined;
}

/** An `id=00e5` source of an old kernel's headline: bus 0x00, device 0x1c, function 5, in the port's domain. */
function aerSourceFromId(id: string, port: string): string {
  const value = Number.parseInt(id, 16);
  const hex = (n: number): string => n.toString(16).padStart(2, '0');
  return `${port.slice(0, 4)}:${hex(value >> 8)}:${hex((value >> 3) & 0x1f)}.${value & 7}`;
}

/** One AER report being read: its headline, and the devices whose detail lines joined it. */
interface AerReport {
  readonly port: string;
  readonly source: string | undefined;
  readonly severity: HardwareSeverity;
  readonly message: string;
  readonly details: string[];
  linesLeft: number;
  /** Counted already (at the end of a read); detail lines still join it so they are not counted again. */
  counted: boolean;
}

function aerEvent(report: AerReport): HostKernelEvent {
  const { source, details } = report;
  const device = source !== undefined && details.includes(source) ? source : (details[0] ?? source ?? report.port);
  return { kind: 'pcie_aer', severity: report.severity, device, message: report.message };
}

/**
 * Turns kernel log lines into host events. Stateful only where the kernel spreads one event over
 * several lines: a hung-task report and the NVIDIA frames of its call trace, an AER report's
 * headline and detail lines, an OOM kill's summary, kill and reaper lines. One instance per log.
 * An AER report is counted once its lines are in: when its window closes, when the next report of
 * the same port and severity starts, or at `flush()`, which the reader calls at the end of every read.
 */
export class HostKernelParser {
  private hung: { task: string; message: string; linesLeft: number } | undefined;
  private aerReports: AerReport[] = [];
  /** Recent OOM victims by pid, with the line number they were counted at. */
  private oomKills = new Map<number, number>();
  private lineNumber = 0;

  push(line: string): HostKernelParse {
    const events: HostKernelEvent[] = [];
    const sxids: SxidEvent[] = [];
    if (isKmsgDictionaryLine(line)) return { events, sxids };
    if (isBootBanner(line)) {
      // Pids start over, and no report spans a reboot.
      events.push(...this.flush().events);
      this.aerReports = [];
      this.oomKills.clear();
      this.hung = undefined;
      return { events, sxids };
    }
    this.lineNumber += 1;
    const body = stripLinePrefixes(line);
    if (this.hung) {
      this.hung.linesLeft -= 1;
      if (NVIDIA_FRAME.test(body)) {
        events.push({ kind: 'hung_task_nvidia', task: this.hung.task, message: this.hung.message });
        this.hung = undefined;
      } else if (this.hung.linesLeft <= 0) {
        this.hung = undefined;
      }
    }
    events.push(...this.ageAerReports());
    events.push(...this.match(body));
    const sxid = parseSxid(body);
    if (sxid) sxids.push(sxid);
    return { events, sxids };
  }

  /** Counts the AER reports still open: the end of a read, or of the log. Idempotent. */
  flush(): HostKernelParse {
    const events: HostKernelEvent[] = [];
    for (const report of this.aerReports) {
      if (report.counted) continue;
      report.counted = true;
      events.push(aerEvent(report));
    }
    return { events, sxids: [] };
  }

  private match(body: string): HostKernelEvent[] {
    let found: RegExpExecArray | null;
    if ((found = HUNG_TASK.exec(body))) {
      const task = found[1] ?? '';
      this.hung = { task, message: body, linesLeft: HUNG_REPORT_LINES };
      return [{ kind: 'hung_task', task, message: body }];
    }
    if ((found = SOFT_LOCKUP.exec(body))) return [{ kind: 'soft_lockup', task: found[1], message: body }];
    if ((found = OOM_SUMMARY.exec(body))) return this.oomKill(Number(found[2]), found[1] ?? '', body);
    if ((found = OOM_KILLED.exec(body)) ?? (found = OOM_REAPED.exec(body))) return this.oomKill(Number(found[1]), found[2] ?? '', body);
    if (MCE_FATAL.test(body)) return [{ kind: 'machine_check', severity: 'fatal', message: body }];
    if (MCE_LOGGED.test(body)) return [{ kind: 'machine_check', severity: 'logged', message: body }];
    if ((found = AER_HEADLINE.exec(body))) return this.aerHeadline(found, body);
    if ((found = AER_DETAIL.exec(body))) return this.aerDetail(found, body);
    if ((found = RM_INIT_FAILED.exec(body))) {
      const device = normalizePciBusId(found[1] ?? '');
      return device === undefined ? [] : [{ kind: 'gpu_init_failed', device, message: body }];
    }
    if ((found = GSP_RESET_NEEDED.exec(body))) {
      const device = normalizePciBusId(found[1] ?? '');
      return device === undefined ? [] : [{ kind: 'gpu_reset_needed', device, message: body }];
    }
    return [];
  }

  /** One kill is one event, whichever of its lines come and in what order. */
  private oomKill(pid: number, task: string, message: string): HostKernelEvent[] {
    const seenAt = this.oomKills.get(pid);
    if (seenAt !== undefined && this.lineNumber - seenAt <= OOM_KILL_WINDOW_LINES) return [];
    this.oomKills.set(pid, this.lineNumber);
    if (this.oomKills.size > 64) {
      for (const [oldPid, at] of this.oomKills) if (this.lineNumber - at > OOM_KILL_WINDOW_LINES) this.oomKills.delete(oldPid);
    }
    return [{ kind: 'oom_kill', task, pid, message }];
  }

  private aerHeadline(found: RegExpExecArray, body: string): HostKernelEvent[] {
    const port = pciFunctionAddress(found[1] ?? '');
    const severity = aerSeverity(found[2] ?? '');
    if (port === undefined || severity === undefined) return [];
    const id = found[3];
    const source = id === undefined ? pciFunctionAddress(found[4] ?? '') : aerSourceFromId(id, port);
    // The port's next report of this severity starts: its previous one is complete.
    const events = this.closeAerReports((report) => report.port === port && report.severity === severity);
    this.aerReports.push({ port, source, severity, message: body, details: [], linesLeft: AER_REPORT_WINDOW_LINES, counted: false });
    return events;
  }

  private aerDetail(found: RegExpExecArray, body: string): HostKernelEvent[] {
    const device = pciFunctionAddress(found[1] ?? '');
    const severity = aerSeverity((found[2] ?? '').trim());
    if (device === undefined || severity === undefined) return [];
    // The open report of this severity that names this device, else the latest one; a device
    // prints one detail line per report, so a report it already joined is not its report.
    const open = this.aerReports.filter((report) => report.severity === severity && !report.details.includes(device));
    const report = [...open].reverse().find((candidate) => candidate.source === device || candidate.port === device) ?? open.at(-1);
    if (report === undefined) return [{ kind: 'pcie_aer', severity, device, message: body }];
    report.details.push(device);
    report.linesLeft = AER_REPORT_WINDOW_LINES;
    return [];
  }

  private ageAerReports(): HostKernelEvent[] {
    for (const report of this.aerReports) report.linesLeft -= 1;
    return this.closeAerReports((report) => report.linesLeft <= 0);
  }

  private closeAerReports(done: (report: AerReport) => boolean): HostKernelEvent[] {
    const events: HostKernelEvent[] = [];
    this.aerReports = this.aerReports.filter((report) => {
      if (!done(report)) return true;
      if (!report.counted) events.push(aerEvent(report));
      return false;
    });
    return events;
  }
}

/** Parses one SXid line (prefix removed); undefined for anything else, the `Data {…}` follow-up included. */
export function parseSxid(body: string): SxidEvent | undefined {
  const match = SXID.exec(body);
  if (!match) return undefined;
  const nvswitch = pciFunctionAddress(match[1] ?? '');
  if (nvswitch === undefined) return undefined;
  const rest = match[4] ?? '';
  const link = /^Link (\d+)\b/.exec(rest)?.[1];
  return { nvswitch, sxid: Number(match[2]), fatal: match[3] === 'Fatal', link: link === undefined ? undefined : Number(link), message: body };
}

/** Parses a whole captured log; convenient for tests and one-shot reads. */
export function parseHostKernelLog(text: string): HostKernelParse {
  const parser = new HostKernelParser();
  const events: HostKernelEvent[] = [];
  const sxids: SxidEvent[] = [];
  for (const line of text.split('\n')) {
    const parsed = parser.push(line);
    events.push(...parsed.events);
    sxids.push(...parsed.sxids);
  }
  events.push(...parser.flush().events);
  return { events, sxids };
}
