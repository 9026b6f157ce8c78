import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { HostKernelParser, parseHostKernelLog, parseSxid } from '../../../agent/sources/host-kernel-log.js';
import { stripLinePrefixes } from '../../../agent/sources/kernel-log.js';
import { HOST_LOGS, XID_LOGS } from '../helpers.js';

function sample(name: string): string {
  return readFileSync(join(HOST_LOGS, name), 'utf8');
}

function kinds(text: string): string[] {
  return parseHostKernelLog(text).events.map((event) => (event.severity === undefined ? event.kind : `${event.kind}:${event.severity}`));
}

describe('host kernel log parser on the real samples', () => {
  it('reads an OOM kill and a hung task from node-problem-detector samples, the kill counted once', () => {
    const { events } = parseHostKernelLog(sample('npd_oom-kill_docker-hung.log'));
    expect(events.map((event) => [event.kind, event.task])).toEqual([
      ['oom_kill', 'heapster'],
      ['hung_task', 'docker'],
    ]);
  });

  it('reads soft lockups with the task they caught, and hung tasks in every prefix', () => {
    const { events } = parseHostKernelLog(sample('gpud_soft-lockup_hung-task_sxid_lines.txt'));
    expect(events.map((event) => [event.kind, event.task])).toEqual([
      ['soft_lockup', 'python3'],
      ['soft_lockup', 'cuda-EvtHandlr'],
      ['hung_task', 'jfsmount'],
      ['hung_task', 'kcompactd1'],
      ['hung_task', 'containerd-shim'],
    ]);
  });

  it('counts an SXid once with its verdict and link, never its Data follow-up line', () => {
    const { sxids } = parseHostKernelLog(sample('gpud_soft-lockup_hung-task_sxid_lines.txt'));
    expect(sxids.map(({ nvswitch, sxid, fatal, link }) => ({ nvswitch, sxid, fatal, link }))).toEqual([
      { nvswitch: '0000:05:00.0', sxid: 12028, fatal: false, link: 32 },
      { nvswitch: '0000:00:00.0', sxid: 20034, fatal: true, link: 30 },
    ]);
  });

  it('reads AER errors by severity and port, machine checks, NVIDIA hangs, adapter failures and the old two-line OOM kill', () => {
    const text = sample('host_lines_from_public_reports.txt');
    // An AER report is counted once its detail lines are in, so the fatal one comes after the machine check that follows it.
    expect(kinds(text)).toEqual([
      'pcie_aer:corrected',
      'pcie_aer:corrected',
      'pcie_aer:corrected',
      'machine_check:logged',
      'pcie_aer:fatal',
      'machine_check:logged',
      'hung_task',
      'hung_task_nvidia',
      'hung_task',
      'hung_task_nvidia',
      'gpu_init_failed',
      'gpu_init_failed',
      'gpu_init_failed',
      'oom_kill',
    ]);
    const { events } = parseHostKernelLog(text);
    expect(events.filter((event) => event.kind === 'pcie_aer').map((event) => event.device)).toEqual([
      '0000:00:03.1',
      '0000:00:03.1',
      '0000:00:1c.5',
      '0000:00:03.0',
    ]);
    expect(events.filter((event) => event.kind === 'hung_task_nvidia').map((event) => event.task)).toEqual(['nvc:[driver]', 'gdscheck']);
    expect(events.filter((event) => event.kind === 'gpu_init_failed').map((event) => event.device)).toEqual(['0000:04:01', '0000:04:02', '0000:0a:00']);
  });

  it('does not tie a hung task without NVIDIA frames to the driver', () => {
    const { events } = parseHostKernelLog(sample('npd_oom-kill_docker-hung.log'));
    expect(events.some((event) => event.kind === 'hung_task_nvidia')).toBe(false);
  });

  it('reads the GSP "needs to be reset" notice of a real H100 Xid 119 capture', () => {
    const { events } = parseHostKernelLog(readFileSync(join(XID_LOGS, 'gpud_dmesg-T_xid119_gsp-timeout_h100-xe9680.log'), 'utf8'));
    expect(events.map((event) => [event.kind, event.device])).toEqual([['gpu_reset_needed', '0000:9b:00']]);
  });

  it('finds nothing in the NVSwitch open and peermem kmsg samples, which hold no host faults', () => {
    for (const name of ['gpud_dev-kmsg-raw_nvswitch.log', 'gpud_dev-kmsg-raw_nvidia-peermem.log']) {
      const parsed = parseHostKernelLog(readFileSync(join(XID_LOGS, name), 'utf8'));
      expect(parsed, name).toEqual({ events: [], sxids: [] });
    }
  });

  it('refuses an SXid line whose code is not a number', () => {
    expect(parseSxid(stripLinePrefixes('nvidia-nvswitch0: SXid (PCI:0000:00:00.0): xyz, Fatal error'))).toBeUndefined();
  });
});

/** The blocks of a sample under its `### source` lines, each read as a log of its own. */
function blocks(name: string): { source: string; text: string }[] {
  return sample(name)
    .split(/^### /m)
    .slice(1)
    .map((block) => ({ source: block.slice(0, block.indexOf('\n')), text: block.slice(block.indexOf('\n') + 1) }));
}

function aerReports(text: string): string[] {
  return parseHostKernelLog(text)
    .events.filter((event) => event.kind === 'pcie_aer')
    .map((event) => `${event.severity} ${event.device}`);
}

describe('PCIe AER: one event per report, attributed to the device the report is about', () => {
  const AER = 'aer_reports_from_public_reports.txt';

  it('reads each real block as its reports: headline with details, headline alone, details alone, in every wording', () => {
    expect(blocks(AER).map(({ source, text }) => [source.split(' ')[0], aerReports(text)])).toEqual([
      // id=0010 is bus 00, device 02, function 0: the port itself, as its detail lines say.
      ['https://github.com/wilicc/gpu-burn/issues/1', ['corrected 0000:00:02.0', 'fatal 0000:00:02.0']],
      // Headlines whose source the kernel could not find: each is still a report.
      ['https://github.com/endlessm/linux/pull/226', ['corrected 0000:00:1c.0', 'corrected 0000:00:1c.0']],
      ['https://github.com/GSConnect/gnome-shell-extension-gsconnect/issues/1052', ['corrected 0000:00:1c.5', 'corrected 0000:00:1c.5']],
      // The port and the NVMe drive both print details; the headline names the drive, and its detail confirms it.
      ['https://github.com/pop-os/pop/issues/751', ['corrected 0000:03:00.0']],
      // The port receives it, the NIC below holds it: the NIC's report.
      ['https://lore.kernel.org/all/20200717213510.171726-1-kwizart@gmail.com/', ['uncorrected_nonfatal 0000:01:00.0']],
      ['https://lore.kernel.org/all/20240923212218.116979-1-mkhalfella@purestorage.com/', ['uncorrected_nonfatal 0000:09:00.0']],
      ['https://lore.kernel.org/all/20200527083130.4137-1-Zhiqiang.Hou@nxp.com/', ['fatal 0002:01:00.0']],
      ['https://lore.kernel.org/all/20250305063035.415717-1-hans.zhang@cixtech.com/', ['corrected 0003:31:00.0']],
      // Two functions of one GPU hold the error; the headline names the second.
      ['https://lore.kernel.org/all/Z2mW2k8GfP7S0c5M@x1n/', ['uncorrected_nonfatal 0000:03:00.1']],
      [
        'https://lore.kernel.org/all/ac855191-1289-40f5-b910-fb9558d5df76@linux.intel.com/',
        ['corrected 0000:00:1c.1', 'corrected 0000:06:00.0', 'corrected 0000:00:1c.1', 'corrected 0000:00:1c.1', 'corrected 0000:06:00.0'],
      ],
      // The kernel documentation's detail without a headline or a driver name.
      ['torvalds/linux', ['fatal 0000:50:00.0']],
    ]);
  });

  it('attributes a report to the device its detail names when the headline names an unlikely source (bus 0, device 0)', () => {
    const text = sample('host_lines_from_public_reports.txt').split('\n').slice(5, 13).join('\n');
    expect(text).toContain('Correctable error message received from 0000:00:00.0');
    expect(aerReports(text)).toEqual(['corrected 0000:00:03.1', 'corrected 0000:00:03.1']);
  });

  it('joins detail lines that arrive in a later read to the report already counted at the end of the earlier one', () => {
    const lines = blocks(AER)[4]?.text.split('\n') ?? [];
    const parser = new HostKernelParser();
    const first = [...parser.push(lines[0] ?? '').events, ...parser.flush().events];
    const later = lines.slice(1).flatMap((line) => parser.push(line).events);
    expect(first.map((event) => event.device)).toEqual(['0000:01:00.0']);
    expect([...later, ...parser.flush().events]).toEqual([]);
  });

  it('does not let /dev/kmsg dictionary lines between a headline and its detail close the report', () => {
    const [headline = '', detail = ''] = (blocks(AER)[4]?.text ?? '').split('\n');
    const dictionary = Array.from({ length: 40 }, () => ' SUBSYSTEM=pci\n DEVICE=+pci:0000:00:02.0').join('\n');
    expect(aerReports(`6,1,2,-;${headline}\n${dictionary}\n6,2,3,-;${detail}\n`)).toEqual(['uncorrected_nonfatal 0000:01:00.0']);
  });

  it('counts a headline whose details never come, once its window has passed', () => {
    const [headline = ''] = (blocks(AER)[4]?.text ?? '').split('\n');
    const noise = Array.from({ length: 20 }, (_, n) => `[ 12.${n}] IPv6: ADDRCONF(NETDEV_CHANGE): eth0: link becomes ready`);
    const parser = new HostKernelParser();
    const events = [headline, ...noise].flatMap((line) => parser.push(line).events);
    expect(events.map((event) => event.device)).toEqual(['0000:01:00.0']);
    expect(parser.flush().events).toEqual([]);
  });
});

describe('OOM kills: one event per kill, whichever of its lines are there', () => {
  const OOM = 'oom_soft-lockup_kmsg-record_from_public_reports.txt';

  it('reads each real block as its kills, by victim pid', () => {
    const kills = blocks(OOM).map(({ text }) =>
      parseHostKernelLog(text)
        .events.filter((event) => event.kind === 'oom_kill')
        .map((event) => `${event.task}:${event.pid}`),
    );
    expect(kills.slice(0, 4)).toEqual([['java:28438'], ['uwsgi:63214'], ['python3:15617', 'python3:15674', 'python3:15623'], ['pt_main_thread:461754']]);
  });

  it('counts a kill told by its summary, its kill line and its reaper line once, and the same pid again far later', () => {
    const [summary = ''] = blocks(OOM)[3]?.text.split('\n') ?? [];
    const kill = 'Out of memory: Killed process 461754 (pt_main_thread) total-vm:1kB';
    const reaped = 'oom_reaper: reaped process 461754 (pt_main_thread), now anon-rss:0kB';
    const filler = Array.from({ length: 1001 }, (_, n) => `[ 12.${n}] IPv6: noise`);
    const kinds = parseHostKernelLog([summary, kill, reaped, ...filler, reaped].join('\n')).events.map((event) => event.kind);
    expect(kinds).toEqual(['oom_kill', 'oom_kill']);
  });

  it('reads the old wording as the kill of the pid killed, not the one chosen', () => {
    const { events } = parseHostKernelLog(blocks(OOM)[0]?.text ?? '');
    expect(events).toEqual([expect.objectContaining({ kind: 'oom_kill', task: 'java', pid: 28438 })]);
  });

  it('counts the same pid again after a boot banner', () => {
    const [kill = '', reaped = ''] = blocks(OOM)[1]?.text.split('\n') ?? [];
    const banner = readFileSync(join(XID_LOGS, 'boot-banner_firecracker-vm_dmesg-formats.log'), 'utf8').split('\n')[0] ?? '';
    expect(parseHostKernelLog([kill, reaped, banner, kill].join('\n')).events.filter((event) => event.kind === 'oom_kill')).toHaveLength(2);
  });
});

describe('soft lockups in the old and the new wording', () => {
  it('reads the NMI watchdog wording of kernels before 4.13, with comms holding "=" and digits', () => {
    const { events } = parseHostKernelLog(sample('oom_soft-lockup_kmsg-record_from_public_reports.txt'));
    expect(events.filter((event) => event.kind === 'soft_lockup').map((event) => event.task)).toEqual(['tgid=13646', 'kswapd0']);
  });

  it('ignores the dictionary lines of a raw /dev/kmsg record', () => {
    const record = blocks('oom_soft-lockup_kmsg-record_from_public_reports.txt').at(-1)?.text ?? '';
    expect(record).toContain(' SUBSYSTEM=pci');
    expect(parseHostKernelLog(record)).toEqual({ events: [], sxids: [] });
  });
});
