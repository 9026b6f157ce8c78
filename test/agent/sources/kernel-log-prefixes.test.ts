import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HostKernelParser } from '../../../agent/sources/host-kernel-log.js';
import { KernelLogParser, stripLinePrefixes } from '../../../agent/sources/kernel-log.js';
import { HOST_LOGS, XID_LOGS } from '../helpers.js';

/**
 * Every kind of kernel line the agent counts, behind every prefix a capture tool may put in front
 * of it, must give the same event as the bare kernel message. The messages are real lines from
 * the samples (the first test checks each is there, verbatim); writing them again behind each
 * prefix is a transformation of real data. Real lines in many of these prefix forms are in the
 * samples themselves (test/fixtures/realworld/host-kernel-logs/README.md lists which).
 */

interface Kind {
  readonly name: string;
  /** The sample the message is quoted from. */
  readonly sample: string;
  readonly message: string;
}

const KINDS: readonly Kind[] = [
  {
    name: 'Xid',
    sample: join(XID_LOGS, 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt'),
    message: 'NVRM: Xid (PCI:0000:00:05): 43, pid=1045242, name=pt_main_thread, Ch 00000008',
  },
  {
    name: 'Xid 79',
    sample: join(XID_LOGS, 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt'),
    message: "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
  },
  {
    name: 'SXid',
    sample: join(HOST_LOGS, 'gpud_soft-lockup_hung-task_sxid_lines.txt'),
    message: 'nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up',
  },
  {
    name: 'soft lockup',
    sample: join(HOST_LOGS, 'gpud_soft-lockup_hung-task_sxid_lines.txt'),
    message: 'watchdog: BUG: soft lockup - CPU#18 stuck for 27s! [python3:2254956]',
  },
  {
    name: 'soft lockup, NMI watchdog wording',
    sample: join(HOST_LOGS, 'oom_soft-lockup_kmsg-record_from_public_reports.txt'),
    message: 'NMI watchdog: BUG: soft lockup - CPU#2 stuck for 23s! [tgid=13646:13646]',
  },
  {
    name: 'hung task',
    sample: join(HOST_LOGS, 'host_lines_from_public_reports.txt'),
    message: 'INFO: task nvc:[driver]:5403 blocked for more than 120 seconds.',
  },
  {
    name: 'OOM kill summary',
    sample: join(HOST_LOGS, 'oom_soft-lockup_kmsg-record_from_public_reports.txt'),
    message:
      'oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-ec9ee26695deb4cc72bc665efff1cf3a03fdfb12f1303e02fe9252985e084a95.scope,mems_allowed=0-1,oom_memcg=/lxc.payload....-lxc/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podeded8c65_6e8e_4c6e_a889_3e427565c740.slice,task_memcg=/lxc.payload.ny2g2r5hh3-lxc/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-podeded8c65_6e8e_4c6e_a889_3e427565c740.slice/cri-containerd-ec9ee26695deb4cc72bc665efff1cf3a03fdfb12f1303e02fe9252985e084a95.scope,task=pt_main_thread,pid=461754,uid=0',
  },
  {
    name: 'OOM kill',
    sample: join(HOST_LOGS, 'oom_soft-lockup_kmsg-record_from_public_reports.txt'),
    message:
      'Memory cgroup out of memory: Killed process 63214 (uwsgi) total-vm:3149468kB, anon-rss:164992kB, file-rss:52176kB, shmem-rss:92kB, UID:0 pgtables:1372kB oom_score_adj:986',
  },
  {
    name: 'OOM reaper',
    sample: join(HOST_LOGS, 'oom_soft-lockup_kmsg-record_from_public_reports.txt'),
    message: 'oom_reaper: reaped process 63214 (uwsgi), now anon-rss:0kB, file-rss:0kB, shmem-rss:92kB',
  },
  { name: 'machine check', sample: join(HOST_LOGS, 'host_lines_from_public_reports.txt'), message: 'mce: [Hardware Error]: Machine check events logged' },
  {
    name: 'AER headline',
    sample: join(HOST_LOGS, 'aer_reports_from_public_reports.txt'),
    message: 'pcieport 0000:00:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:01:00.0',
  },
  {
    name: 'AER headline, 6.8 wording',
    sample: join(HOST_LOGS, 'aer_reports_from_public_reports.txt'),
    message: 'pcieport 0000:00:01.1: AER: Multiple Uncorrectable (Non-Fatal) error message received from 0000:03:00.1',
  },
  {
    name: 'AER headline, id= wording',
    sample: join(HOST_LOGS, 'aer_reports_from_public_reports.txt'),
    message: 'pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010',
  },
  {
    name: 'AER detail',
    sample: join(HOST_LOGS, 'aer_reports_from_public_reports.txt'),
    message: 'r8169 0000:01:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)',
  },
  {
    name: 'NVRM off the bus notice',
    sample: join(XID_LOGS, 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt'),
    message: 'NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.',
  },
  {
    name: 'NVRM "GPU at" off the bus',
    sample: join(XID_LOGS, 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt'),
    message: 'NVRM: GPU at 0000:01:00.0 has fallen off the bus.',
  },
  {
    name: 'RmInitAdapter failed',
    sample: join(HOST_LOGS, 'host_lines_from_public_reports.txt'),
    message: 'NVRM: GPU 0000:04:01.0: RmInitAdapter failed! (0x11:0x45:2525)',
  },
  {
    name: 'GSP reset needed',
    sample: join(XID_LOGS, 'gpud_dmesg-T_xid119_gsp-timeout_h100-xe9680.log'),
    message: 'NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).  The GPU likely needs to be reset.',
  },
];

/** How each capture tool writes a kernel message; the ones marked (real) appear in the samples with real lines. */
const PREFIXES: readonly (readonly [string, (message: string) => string])[] = [
  ['no prefix (real)', (message) => message],
  ['raw /dev/kmsg record (real)', (message) => `6,1234,5678901,-;${message}`],
  ['raw /dev/kmsg record with its dictionary lines (real)', (message) => `6,1234,5678901,-;${message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:01:00.0`],
  ['raw /dev/kmsg record with caller fields', (message) => `4,1635,363548949,-,caller=T1;${message}`],
  ['dmesg (real)', (message) => `[ 1234.567890] ${message}`],
  ['dmesg, large uptime (real)', (message) => `[3017506.733819] ${message}`],
  ['dmesg -T (real)', (message) => `[Sun Jan  5 18:28:55 2025] ${message}`],
  ['dmesg -T, German locale', (message) => `[So Jan  5 18:28:55 2025] ${message}`],
  ['dmesg -T, French locale', (message) => `[dim. janv.  5 18:28:55 2025] ${message}`],
  ['dmesg -T, Chinese locale', (message) => `[日 1月  5 18:28:55 2025] ${message}`],
  ['dmesg -T, Korean locale', (message) => `[일 1월  5 18:28:55 2025] ${message}`],
  ['dmesg -T -d', (message) => `[Sun Jan  5 18:28:55 2025 <    0.000010>] ${message}`],
  ['dmesg with caller id (real)', (message) => `[  130.456250] [ T1946] ${message}`],
  ['dmesg with caller id, joined', (message) => `[   12.345678][ T1234] ${message}`],
  ['dmesg caller id alone (real)', (message) => `[  T292] ${message}`],
  ['dmesg -H (real)', (message) => `[  +0.000844] ${message}`],
  ['dmesg --reltime, minute mark (real)', (message) => `[May19 19:57] ${message}`],
  ['dmesg -r', (message) => `<4>[ 1234.567890] ${message}`],
  ['dmesg --decode', (message) => `kern  :warn  : [ 1234.567890] ${message}`],
  ['dmesg --decode --time-format=iso (real)', (message) => `kern  :err   : 2025-01-21T04:41:44,287197+00:00 ${message}`],
  ['dmesg --decode, syslog facility', (message) => `syslog:err   : 2025-05-27T04:18:56,089671+00:00 ${message}`],
  ['syslog with dmesg stamp (real)', (message) => `Sep 19 16:18:02 bubz kernel: [68183.615790] ${message}`],
  ['syslog, one-digit day (real)', (message) => `Dec  2 11:49:53 worker4 kernel: [  885.242168] ${message}`],
  ['syslog without host (real)', (message) => `Sep 16 19:51:15 kernel: [    0.064261] ${message}`],
  ['rsyslog RFC 3339 file format', (message) => `2025-01-05T18:28:55.123456+00:00 gpu-7 kernel: ${message}`],
  ['rsyslog RFC 3339 with dmesg stamp', (message) => `2025-01-05T18:28:55.123456+00:00 gpu-7 kernel: [ 1234.567890] ${message}`],
  ['RFC 5424', (message) => `<4>1 2025-01-05T18:28:55.123456+00:00 gpu-7 kernel - - - ${message}`],
  ['rsyslog #012 dictionary suffix', (message) => `2025-11-06T19:17:34.967439+01:00 gpu-7 kernel: ${message}#012 SUBSYSTEM=pci#012 DEVICE=+pci:0000:03:00.0`],
  ['journalctl -o short (real)', (message) => `Jan 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl -o short, kernel: only (real)', (message) => `kernel: ${message}`],
  ['journalctl -o short-iso', (message) => `2025-01-05T18:28:55+0000 gpu-7 kernel: ${message}`],
  ['journalctl -o short-iso-precise', (message) => `2025-01-05T18:28:55.123456+00:00 gpu-7 kernel: ${message}`],
  ['journalctl -o short-precise (real)', (message) => `Aug 30 06:58:55.050705 ... kernel: ${message}`],
  ['journalctl -o short-monotonic', (message) => `[ 1234.567890] gpu-7 kernel: ${message}`],
  ['journalctl -o short-full', (message) => `Sun 2025-01-05 18:28:55 UTC gpu-7 kernel: ${message}`],
  ['journalctl -o short-unix', (message) => `1736101735.123456 gpu-7 kernel: ${message}`],
  ['journalctl, German locale', (message) => `Mär 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, German locale, December', (message) => `Dez 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, French locale (real)', (message) => `jan. 29 20:50:17 kevin kernel: ${message}`],
  ['journalctl, French locale, December', (message) => `déc. 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, Spanish locale', (message) => `ene 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, Russian locale (real)', (message) => `фев 12 00:48:02 kernel: ${message}`],
  ['journalctl, Chinese or Japanese locale', (message) => `1月 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, Korean locale', (message) => `1월 05 18:28:55 gpu-7 kernel: ${message}`],
  ['journalctl, host name elided', (message) => `Feb 03 19:57:08 ** kernel: ${message}`],
  ['journalctl over dmesg -T', (message) => `Jan 05 18:28:55 gpu-7 kernel: [Sun Jan  5 18:28:55 2025] ${message}`],
  ['dmesg indentation of a continuation line (real)', (message) => `               ${message}`],
  ['Windows line end', (message) => `[ 1234.567890] ${message}\r`],
];

/** What both parsers make of a text: Xid events, host events (with open AER reports closed) and SXids. */
function outcome(text: string): unknown {
  const xid = new KernelLogParser();
  const host = new HostKernelParser();
  const xids: unknown[] = [];
  const hostEvents: unknown[] = [];
  const sxids: unknown[] = [];
  for (const line of text.split('\n')) {
    xids.push(...xid.push(line));
    const parsed = host.push(line);
    hostEvents.push(...parsed.events);
    sxids.push(...parsed.sxids);
  }
  hostEvents.push(...host.flush().events);
  return { xids, hostEvents, sxids };
}

describe('every kernel line kind behind every capture prefix', () => {
  it.each(KINDS.map((kind) => [kind.name, kind] as const))('quotes a real line for %s, verbatim from its sample', (_name, kind) => {
    expect(readFileSync(kind.sample, 'utf8')).toContain(kind.message);
  });

  it.each(KINDS.map((kind) => [kind.name, kind] as const))('reads the bare %s message as an event', (_name, kind) => {
    const { xids, hostEvents, sxids } = outcome(kind.message) as { xids: unknown[]; hostEvents: unknown[]; sxids: unknown[] };
    expect(xids.length + hostEvents.length + sxids.length).toBe(1);
  });

  const cases = KINDS.flatMap((kind) => PREFIXES.map(([prefixName, write]) => [kind.name, prefixName, kind.message, write] as const));
  it.each(cases)('reads %s behind %s as the same event as the bare message', (_kind, _prefix, message, write) => {
    expect(outcome(write(message))).toEqual(outcome(message));
  });
});

describe('prefixes never reach into the message', () => {
  it.each([
    ['a bracket of the message', '[ 12.345678] [Hardware Error]: Machine check events logged', '[Hardware Error]: Machine check events logged'],
    ['a bracket that is not a stamp', '[Sun Jan  5 18:28:55 2025] [drm] Initialized nvidia-drm 0.0.0', '[drm] Initialized nvidia-drm 0.0.0'],
    ['an AER error bit', 'pcieport 0000:00:03.1:    [ 6] BadTLP', 'pcieport 0000:00:03.1:    [ 6] BadTLP'],
    ['a word that ends in a colon before "kernel:"', '[ 12.345678] audit: kernel: something', 'audit: kernel: something'],
    [
      'a driver name with a colon',
      'Jan 05 18:28:55 gpu-7 kernel: nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal',
      'nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal',
    ],
    ['the watchdog prefix', 'kern  :emerg : watchdog: BUG: soft lockup', 'watchdog: BUG: soft lockup'],
    ['a second stamp-like text after the message start', 'NVRM: Xid (PCI:0000:01:00): 13, [ 12.3] text', 'NVRM: Xid (PCI:0000:01:00): 13, [ 12.3] text'],
  ])('keeps %s', (_what, line, message) => {
    expect(stripLinePrefixes(line)).toBe(message);
  });
});
