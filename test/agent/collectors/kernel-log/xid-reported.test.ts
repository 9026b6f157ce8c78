import { mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../../core/log.js';
import { ReportedXids, bootIdPath, readBootId, readXidState, writeXidState, type XidState } from '../../../../agent/collectors/kernel-log/xid-reported.js';
import type { LogPosition } from '../../../../agent/log-follower.js';
import { parseXidLine, type XidEvent } from '../../../../agent/sources/kernel-log.js';

/**
 * The /dev/kmsg side of "one report per occurrence": a character device cannot be faked in a
 * test, so the records' positions (boot id, sequence number) are given here as the follower
 * hands them over.
 */

const BOOT_A = '300bb6f5-52c6-4c27-9521-21bf98c1c353';
const BOOT_B = '9c1d2e3f-4a5b-4c6d-8e7f-0a1b2c3d4e5f';
const KMSG = '/dev/kmsg';
const XID79 = parseXidLine("4,2207,1843308145,-;NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.") as XidEvent;

let dir: string;
let procfs: string;
let statePath: string;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-xid-state-'));
  procfs = join(dir, 'proc');
  statePath = join(dir, 'xid-state.json');
  boot(BOOT_A);
});

afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

function boot(id: string): void {
  mkdirSync(join(procfs, 'sys', 'kernel', 'random'), { recursive: true });
  writeFileSync(bootIdPath(procfs), `${id}\n`);
}

function kmsg(sequence: number | undefined, firstRead = true): LogPosition {
  return { source: 'kmsg', sequence, firstRead };
}

async function loaded(): Promise<ReportedXids> {
  const reported = new ReportedXids({ statePath, bootIdPath: bootIdPath(procfs), logPath: KMSG, logger: silentLogger() });
  await reported.load();
  return reported;
}

describe('fatal Xids reported from /dev/kmsg, across agent restarts', () => {
  it('takes the records up to the last reported sequence number of this boot as reported, and the later ones as news', async () => {
    const first = await loaded();
    first.delivered(first.candidate(XID79, 'line', kmsg(2207)));
    await first.close();
    expect(await readXidState(statePath)).toMatchObject({ state: { log: KMSG, bootId: BOOT_A, last: { source: 'kmsg', sequence: 2207 } } });

    const second = await loaded();
    const candidates = [2100, 2207, 2300].map((sequence) => second.candidate(XID79, 'line', kmsg(sequence)));
    expect(second.reportedCount(candidates)).toBe(2);
    // A record without a sequence number cannot be told apart: it is news.
    expect(second.reportedCount([second.candidate(XID79, 'line', kmsg(undefined))])).toBe(0);
  });

  it('starts afresh after a reboot: sequence numbers count from 0 again under a new boot id', async () => {
    const first = await loaded();
    first.delivered(first.candidate(XID79, 'line', kmsg(2207)));
    await first.close();
    boot(BOOT_B);
    const second = await loaded();
    expect(second.reportedCount([second.candidate(XID79, 'line', kmsg(12))])).toBe(0);
  });

  it('trusts no sequence number when the boot id cannot be read, then or now', async () => {
    rmSync(bootIdPath(procfs));
    const first = await loaded();
    first.delivered(first.candidate(XID79, 'line', kmsg(2207)));
    await first.close();
    expect(await readXidState(statePath)).toMatchObject({ state: { bootId: null } });
    boot(BOOT_A);
    const second = await loaded();
    expect(second.reportedCount([second.candidate(XID79, 'line', kmsg(5))])).toBe(0);
  });

  it('keeps nothing without a state file, but remembers in memory what it reported', async () => {
    const reported = new ReportedXids({ statePath: undefined, bootIdPath: bootIdPath(procfs), logPath: KMSG, logger: silentLogger() });
    await reported.load();
    reported.delivered(reported.candidate(XID79, 'line', kmsg(10)));
    await reported.close();
    expect(reported.reportedCount([reported.candidate(XID79, 'line', kmsg(10))])).toBe(1);
  });
});

describe('the xid state file and the boot id', () => {
  const state: XidState = {
    version: 1,
    log: KMSG,
    bootId: BOOT_A,
    last: { source: 'kmsg', sequence: 7 },
    xid: 79,
    gpu: '0000:91:00',
    reportedAt: '2026-11-23T14:37:18.000Z',
  };

  it('round-trips, readable only by its owner, and reads a missing file as no state', async () => {
    await writeXidState(join(dir, 'new', 'dir', 'state.json'), state);
    expect(await readXidState(join(dir, 'new', 'dir', 'state.json'))).toEqual({ state });
    expect(statSync(join(dir, 'new', 'dir', 'state.json')).mode & 0o777).toBe(0o600);
    expect(await readXidState(join(dir, 'absent.json'))).toEqual({ state: undefined });
  });

  it.each([
    ['an unknown field', { ...state, extra: 1 }],
    ['a negative sequence number', { ...state, last: { source: 'kmsg', sequence: -1 } }],
    ['a line hash that is not SHA-256', { ...state, last: { source: 'file', lineSha256: 'abc', occurrence: 1 } }],
    ['a boot id that is not one', { ...state, bootId: '../../etc' }],
  ])('refuses a state with %s, naming the problem', async (_what, content) => {
    writeFileSync(statePath, JSON.stringify(content));
    const read = await readXidState(statePath);
    expect(read).toEqual({ error: expect.stringContaining('is not an xid state file') });
  });

  it('reads the boot id this machine has, and refuses a file that holds something else', async () => {
    expect(await readBootId('/proc/sys/kernel/random/boot_id')).toEqual({ bootId: expect.stringMatching(/^[0-9a-f-]{36}$/) });
    writeFileSync(bootIdPath(procfs), 'not a boot id\n');
    expect(await readBootId(bootIdPath(procfs))).toEqual({ error: expect.stringContaining('does not hold a boot id') });
    expect(await readBootId(join(dir, 'nothing'))).toEqual({ error: expect.stringContaining('cannot read') });
  });
});
