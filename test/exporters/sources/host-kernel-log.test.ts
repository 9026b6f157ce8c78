import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseHostKernelLog, parseSxid } from '../../../exporters/sources/host-kernel-log.js';
import { stripLinePrefixes } from '../../../exporters/sources/kernel-log.js';
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
    expect(events.filter((event) => event.kind === 'pcie_aer').map((event) => event.device)).toEqual(['0000:00:03.1', '0000:00:03.1', '0000:00:1c.5', '0000:00:03.0']);
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
