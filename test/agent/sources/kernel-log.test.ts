import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { KernelLogParser, isBootBanner, parseKernelLog, parseXidLine } from '../../../agent/sources/kernel-log.js';
import { XID_LOGS } from '../helpers.js';

const LOG_FILES = readdirSync(XID_LOGS).filter((name) => name !== 'README.md');

/**
 * `grep -cw 'Xid ('` for each sample (SXid lines are not Xid lines), and the events a whole-file read gives: one per Xid line, but
 * a GPU's fall off the bus once per boot whichever of its reports are there (Xid 79, the NVRM
 * notices, the probe report). Pinned so a lost or extra sample line shows up here.
 */
const SAMPLE_COUNTS: Record<string, { xidLines: number; events: number }> = {
  'boot-banner_firecracker-vm_dmesg-formats.log': { xidLines: 0, events: 0 },
  'gpud_dev-kmsg-raw_nvidia-peermem.log': { xidLines: 0, events: 0 },
  'gpud_dev-kmsg-raw_nvswitch.log': { xidLines: 0, events: 0 },
  'gpud_dmesg-T_xid119_gsp-timeout_h100-xe9680.log': { xidLines: 5, events: 5 },
  'gpud_dmesg-decode-iso_libnccl-segfault.log': { xidLines: 0, events: 0 },
  'gpud_dmesg-decode-iso_xid13_xid43_oom.log': { xidLines: 17, events: 17 },
  'gpud_xid_lines_h100_gb200.txt': { xidLines: 46, events: 46 },
  // Plus the probe report without an Xid line.
  'xid_lines_from_public_reports.txt': { xidLines: 31, events: 32 },
  // Its blocks are unrelated machines, three of them with a GPU at 0000:01:00: read as one boot, one fall.
  'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt': { xidLines: 6, events: 6 },
};

function readLog(name: string): string {
  return readFileSync(join(XID_LOGS, name), 'utf8');
}

describe('kernel log parser on the real samples', () => {
  it('knows every sample file, so a new sample cannot go untested', () => {
    expect(LOG_FILES.sort()).toEqual(Object.keys(SAMPLE_COUNTS).sort());
  });

  it.each(LOG_FILES)('reads every Xid line of %s, and gives the pinned number of events for the whole file', (name) => {
    const text = readLog(name);
    const xidLines = text.split('\n').filter((line) => /\bXid \(/.test(line));
    expect(xidLines.length).toBe(SAMPLE_COUNTS[name]?.xidLines);
    expect(xidLines.every((line) => parseXidLine(line) !== undefined)).toBe(true);
    expect(parseKernelLog(text)).toHaveLength(SAMPLE_COUNTS[name]?.events ?? -1);
  });

  it('reads the GSP timeout excerpt as five Xid 119 events and nothing from the RPC history, stack trace or rate-limit lines', () => {
    const events = parseKernelLog(readLog('gpud_dmesg-T_xid119_gsp-timeout_h100-xe9680.log'));
    expect(events).toHaveLength(5);
    expect(events.every((event) => event.xid === 119 && event.pciBusId === '0000:9b:00' && event.severity === 'fatal')).toBe(true);
    expect(events[0]).toMatchObject({ pid: '2024380', processName: 'nvidia-smi' });
    expect(events[0]?.message).toBe('Timeout after 6s of waiting for RPC response from GPU4 GSP! Expected function 103 (GSP_RM_ALLOC) (0x2081 0x4).');
  });

  it('reads the dmesg --decode excerpt as sixteen Xid 13 warnings and one Xid 43, ignoring the OOM-killer lines', () => {
    const events = parseKernelLog(readLog('gpud_dmesg-decode-iso_xid13_xid43_oom.log'));
    expect(events.filter((event) => event.xid === 13 && event.severity === 'warning')).toHaveLength(16);
    expect(events.filter((event) => event.xid === 43)).toEqual([
      expect.objectContaining({ pciBusId: '0000:38:00', severity: 'info', pid: '2924364', processName: 'pt_main_thread', message: 'Ch 00000008' }),
    ]);
  });

  it.each(['gpud_dev-kmsg-raw_nvidia-peermem.log', 'gpud_dev-kmsg-raw_nvswitch.log', 'gpud_dmesg-decode-iso_libnccl-segfault.log'])(
    'finds no Xid event in the noise of %s',
    (name) => {
      expect(parseKernelLog(readLog(name))).toEqual([]);
    },
  );

  it('classifies the GB200 NVLink5 lines by the verdict in their message, across PCI domains 0008 to 0019', () => {
    const events = parseKernelLog(readLog('gpud_xid_lines_h100_gb200.txt'));
    const domains = new Set(events.map((event) => event.pciBusId.slice(0, 4)));
    expect(domains).toEqual(new Set(['0000', '0008', '0009', '0018', '0019']));
    const nvlink = events.filter((event) => event.xid === 145 || event.xid === 149);
    for (const event of nvlink) {
      expect(event.severity).toBe(/\bNonfatal\b/.test(event.message) ? 'warning' : 'fatal');
    }
    expect(events.filter((event) => event.xid === 154).every((event) => event.severity === 'fatal')).toBe(true);
  });

  it('reports the probe-time "fallen off the bus" message without an Xid line as Xid 79 for that GPU', () => {
    const events = parseKernelLog(readLog('xid_lines_from_public_reports.txt'));
    expect(events.filter((event) => event.xid === 79).map((event) => event.pciBusId)).toEqual(['0000:b3:00', '0000:44:00', '0000:06:00', '0004:01:00']);
    expect(events.find((event) => event.pciBusId === '0000:b3:00')).toMatchObject({ xid: 79, severity: 'fatal', remedy: 'reboot_node' });
  });
});

/** The blocks of a sample under its `### source` lines, each read as a log of its own. */
function blocks(name: string): { source: string; text: string }[] {
  return readLog(name)
    .split(/^### /m)
    .slice(1)
    .map((block) => ({ source: block.slice(0, block.indexOf('\n')), text: block.slice(block.indexOf('\n') + 1) }));
}

describe('a GPU off the bus, one event per GPU per boot whichever way the driver reports it', () => {
  const SAMPLE = 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt';

  it('reads each real report as exactly one Xid 79 for its GPU: Xid line with notice, notice alone twice, probe report', () => {
    const perBlock = blocks(SAMPLE).map(({ text }) => parseKernelLog(text).filter((event) => event.xid === 79));
    expect(perBlock.map((events) => events.map((event) => [event.pciBusId, event.message]))).toEqual([
      [['0000:91:00', 'GPU has fallen off the bus.']],
      [['0000:01:00', 'GPU has fallen off the bus.']],
      [['0000:01:00', 'GPU has fallen off the bus (reported without an Xid line)']],
      [['0000:01:00', 'GPU has fallen off the bus (reported at probe, without an Xid line)']],
      [],
    ]);
    expect(perBlock.flat().every((event) => event.severity === 'fatal' && event.remedy === 'reboot_node')).toBe(true);
  });

  it('reads the real dmesg -T lines as their Xids', () => {
    const dmesgT = blocks(SAMPLE).at(-1)?.text ?? '';
    expect(parseKernelLog(dmesgT).map((event) => [event.pciBusId, event.xid])).toEqual([
      ['0000:00:05', 43],
      ['0000:00:05', 43],
      ['0000:00:07', 31],
      ['0000:00:08', 94],
    ]);
  });

  it('counts the same GPU falling again only after a boot banner, and another GPU at once', () => {
    const [xidAndNotice = ''] = blocks(SAMPLE).map(({ text }) => text);
    const banner = readLog('boot-banner_firecracker-vm_dmesg-formats.log').split('\n')[0] ?? '';
    const other = xidAndNotice.replaceAll('0000:91:00', '0000:5d:00');
    const events = parseKernelLog([xidAndNotice, xidAndNotice, other, banner, xidAndNotice].join('\n'));
    expect(events.filter((event) => event.xid === 79).map((event) => event.pciBusId)).toEqual(['0000:91:00', '0000:5d:00', '0000:91:00']);
  });
});

describe('the boot banner, where a log that spans reboots starts a new boot', () => {
  const BANNER_SAMPLE = 'boot-banner_firecracker-vm_dmesg-formats.log';

  it('is found in each of the five captured prefix formats (dmesg, -T, --decode iso, -r, raw /dev/kmsg) and nowhere else in that capture', () => {
    const lines = readLog(BANNER_SAMPLE)
      .split('\n')
      .filter((line) => line !== '');
    expect(lines.filter((line) => isBootBanner(line))).toHaveLength(5);
    expect(lines.filter((line) => !isBootBanner(line)).every((line) => !line.includes('Linux version'))).toBe(true);
  });

  it.each(LOG_FILES.filter((name) => name !== BANNER_SAMPLE))('is not found in %s, which holds no boot', (name) => {
    expect(
      readLog(name)
        .split('\n')
        .filter((line) => isBootBanner(line)),
    ).toEqual([]);
  });

  it('is only the kernel message itself, not the words inside another message', () => {
    expect(isBootBanner('[ 12.3] audit: comm="sh" msg="Linux version 6.1 check"')).toBe(false);
    expect(isBootBanner('Nov 23 14:37:18 gpu-7 kernel: Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) #1 SMP')).toBe(true);
  });
});

describe('kernel log parser on single lines', () => {
  it.each([
    ['no prefix', "NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", '0000:91:00', 79, 'fatal'],
    ['dmesg seconds', '[155044.078590] NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.', '0000:06:00', 79, 'fatal'],
    [
      'dmesg with thread tag',
      '[ 130.456250] [ T1946] NVRM: Xid (PCI:0000:2b:00): 31, pid=1942, name=llama-bench, channel 0x00000002',
      '0000:2b:00',
      31,
      'warning',
    ],
    [
      'dmesg -T',
      "[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception",
      '0000:cb:00',
      13,
      'warning',
    ],
    [
      'dmesg --decode iso',
      'kern  :warn  : 2025-01-21T04:41:44,287197+00:00 NVRM: Xid (PCI:0000:38:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008',
      '0000:38:00',
      43,
      'info',
    ],
    ['syslog', 'Feb 01 14:25:31 archbox kernel: NVRM: Xid (PCI:0000:01:00): 38, pid=1659,', '0000:01:00', 38, 'warning'],
    [
      'journalctl, Spanish locale',
      'nov 23 14:25:31 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1659, name=python, GPU has fallen off the bus.',
      '0000:3b:00',
      79,
      'fatal',
    ],
    [
      'journalctl, French locale',
      'déc. 05 09:01:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 48, An uncorrectable double bit error (DBE) has been detected',
      '0000:3b:00',
      48,
      'fatal',
    ],
    [
      'journalctl, French locale, no dot',
      'mars 05 09:01:02 gpu-7 kernel: NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception',
      '0000:3b:00',
      13,
      'warning',
    ],
    ['journalctl, German locale', 'Dez 05 09:01:02 gpu-7 kernel: NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.', '0000:5d:00', 79, 'fatal'],
    [
      'journalctl, Russian locale',
      'ноя 23 14:25:31 gpu-7 kernel: NVRM: Xid (PCI:0000:5d:00): 119, pid=430, name=nv_queue, Timeout waiting for RPC from GSP!',
      '0000:5d:00',
      119,
      'fatal',
    ],
    ['journalctl, Chinese locale', '11月 23 14:25:31 gpu-7 kernel: NVRM: Xid (PCI:0000:5d:00): 79, GPU has fallen off the bus.', '0000:5d:00', 79, 'fatal'],
    [
      'journalctl, Korean locale',
      '11월 23 14:25:31 gpu-7 kernel: NVRM: Xid (PCI:0000:5d:00): 43, pid=2924364, name=pt_main_thread, Ch 00000008',
      '0000:5d:00',
      43,
      'info',
    ],
    [
      'journalctl kernel:',
      "kernel: NVRM: Xid (PCI:0000:c1:00): 74, pid='<unknown>', name=<unknown>, NVLink: fatal error detected on link 1",
      '0000:c1:00',
      74,
      'fatal',
    ],
    [
      'raw /dev/kmsg record',
      '4,3973,227996636,-;NVRM: Xid (PCI:0000:9b:00): 119, pid=430, name=nv_queue, Timeout waiting for RPC from GSP!',
      '0000:9b:00',
      119,
      'fatal',
    ],
    ['five-part address', 'NVRM: Xid (PCI:0000:3B:00.0): 48, An uncorrectable double bit error (DBE) has been detected', '0000:3b:00', 48, 'fatal'],
    ['MIG attribution', 'NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No', '0000:01:00', 94, 'warning'],
    [
      'NVLink5 with padded spacing',
      'NVRM: Xid (PCI:0008:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 01 (0x021425c6 0x00000000)',
      '0008:01:00',
      149,
      'fatal',
    ],
  ])('parses a line with %s', (_format, line, pciBusId, xid, severity) => {
    expect(parseXidLine(line)).toMatchObject({ pciBusId, xid, severity });
  });

  it('takes the message after pid and name, keeping "<unknown>" as printed', () => {
    expect(parseXidLine("NVRM: Xid (PCI:0000:07:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE)")).toMatchObject({
      pid: "'<unknown>'",
      processName: '<unknown>',
      message: 'An uncorrectable double bit error (DBE)',
    });
    expect(parseXidLine('NVRM: Xid (PCI:0000:18:00): 145, pid=876767, name=ray::WorkerDict, RLW_RXPIPE Nonfatal XC0 i0 Link 13')).toMatchObject({
      processName: 'ray::WorkerDict',
      message: 'RLW_RXPIPE Nonfatal XC0 i0 Link 13',
    });
    expect(parseXidLine('NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu to activate.')).toMatchObject({
      pid: '1896',
      processName: undefined,
      message: 'Row Remapper: New row marked for remapping, reset gpu to activate.',
    });
  });

  it('records the MIG GPU instance of a contained error', () => {
    expect(parseXidLine('NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 94, pid=7194, Contained')).toMatchObject({ gpuInstance: 5, computeInstance: 1 });
  });

  it('gives an empty message for a line truncated right after pid', () => {
    expect(parseXidLine('Feb 01 14:25:31 archbox kernel: NVRM: Xid (PCI:0000:01:00): 38, pid=1659,')).toMatchObject({ message: '', pid: '1659' });
  });

  it('ignores a line truncated inside the PCI address, and Xid text that is not at the start of the kernel message', () => {
    expect(parseXidLine('kern  :warn  : 2025-01-21T04:41:44,283302+00:00 NVRM: Xid (PCI:0000')).toBeUndefined();
    expect(parseXidLine('bash[123]: grep "NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus" syslog')).toBeUndefined();
  });

  it('joins the "fallen off the bus" report when its lines arrive as separate /dev/kmsg records', () => {
    const parser = new KernelLogParser();
    const events = [
      '3,1001,1843308145,-;NVRM: The NVIDIA GPU 0000:b3:00.0',
      '3,1002,1843308146,c;NVRM: (PCI ID: 10de:26b5) installed in this system has',
      '3,1003,1843308147,c;NVRM: fallen off the bus and is not responding to commands.',
    ].flatMap((line) => parser.push(line));
    expect(events).toEqual([expect.objectContaining({ pciBusId: '0000:b3:00', xid: 79, severity: 'fatal' })]);
  });

  it('does not join a "fallen off the bus" line that comes long after the GPU was named', () => {
    const parser = new KernelLogParser();
    const lines = [
      'NVRM: The NVIDIA GPU 0000:b3:00.0',
      ...Array.from({ length: 6 }, (_, n) => `IPv6: noise ${n}`),
      'NVRM: fallen off the bus and is not responding to commands.',
    ];
    expect(lines.flatMap((line) => parser.push(line))).toEqual([]);
  });

  it('reads the runtime "GPU has fallen off the bus" notice alone as Xid 79, and beside its Xid line as the same fall', () => {
    expect(parseKernelLog('NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n')).toEqual([
      expect.objectContaining({ pciBusId: '0000:3b:00', xid: 79, severity: 'fatal', message: 'GPU has fallen off the bus (reported without an Xid line)' }),
    ]);
    const both =
      "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\nNVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.\n";
    expect(parseKernelLog(both)).toEqual([expect.objectContaining({ pciBusId: '0000:3b:00', xid: 79, message: 'GPU has fallen off the bus.' })]);
  });
});
