import { chownSync, mkdirSync, mkdtempSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, utimesSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { dumpWithFaulthandler, parseBootTime, parseSignalStatus, stackDirectories, type FaulthandlerTarget } from '../../../agent/sources/faulthandler-dump.js';
import { parseStatLine } from '../../../agent/sources/proc-tree.js';
import { alive, startRank, stopRanks, type PythonRank, type RankMode } from '../python-ranks.js';

/**
 * faulthandler dumps of real Python ranks through the real /proc: signalled only when it is safe,
 * and only what the signal added to the file comes back.
 */

let dir: string;
const ranks: PythonRank[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-faulthandler-'));
});

afterEach(async () => {
  await stopRanks(ranks);
  rmSync(dir, { recursive: true, force: true });
});

async function rank(mode: RankMode, rankNumber = 0): Promise<PythonRank> {
  const started = await startRank(mode, { RANK: String(rankNumber), STEADFAST_STACK_DIR: dir });
  ranks.push(started);
  return started;
}

function target(pid: number, directories: readonly string[] = [dir]): FaulthandlerTarget {
  const stat = parseStatLine(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  if (!stat) throw new Error(`cannot read /proc/${pid}/stat`);
  return { pid, role: 'rank', rank: 0, startTimeTicks: stat.startTimeTicks, directories };
}

const OPTIONS = { procfs: '/proc', deadlineMs: 5000 };

describe('faulthandler dumps of real Python ranks', () => {
  it('signals a rank that registered faulthandler and returns what its file grew by, one dump per call', async () => {
    const python = await rank('collective');
    const [first] = await dumpWithFaulthandler([target(python.pid)], OPTIONS);
    expect(first).toMatchObject({ pid: python.pid, role: 'rank', rank: 0, ok: true });
    const text = first?.ok ? first.dump : '';
    expect(text).toMatch(/^Thread 0x[0-9a-f]{16} \(most recent call first\):\n/);
    expect(text).toContain(' in all_reduce\n');
    expect(text).not.toContain('# steadfast:');
    const [second] = await dumpWithFaulthandler([target(python.pid)], OPTIONS);
    expect(second?.ok ? second.dump : '').toBe(text);
    expect(readFileSync(python.file ?? '', 'utf8')).toContain(text + text);
    expect(alive(python.pid)).toBe(true);
  });

  it('finds the dump file of a rank in a pid namespace of its own (a container), which names it by the pid it knows itself by', async () => {
    const python = await startRank('collective', { RANK: '0', STEADFAST_STACK_DIR: dir }, { pidNamespace: true });
    ranks.push(python);
    expect(python.namespacePid).toBe(1);
    expect(python.file).toMatch(/-pid1\.stacks$/);
    expect(parseSignalStatus(readFileSync(`/proc/${python.pid}/status`, 'utf8'))?.namespacePid).toBe(1);
    const [result] = await dumpWithFaulthandler([target(python.pid)], OPTIONS);
    expect(result).toMatchObject({ pid: python.pid, ok: true });
    expect(result?.ok ? result.dump : '').toContain(' in all_reduce\n');
  });

  it('never signals a process without a SIGUSR1 handler, which the signal would end', async () => {
    const python = await rank('unregistered');
    const [result] = await dumpWithFaulthandler([target(python.pid)], OPTIONS);
    expect(result).toMatchObject({ ok: false, error: expect.stringContaining('has no SIGUSR1 handler') });
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(alive(python.pid)).toBe(true);
  });

  it('does not signal a rank whose dump file is not where it is looked for, nor one that is no longer the process classified', async () => {
    const python = await rank('collective');
    const size = statSync(python.file ?? '').size;
    const elsewhere = join(dir, 'elsewhere');
    mkdirSync(elsewhere);
    const [missing] = await dumpWithFaulthandler([target(python.pid, [elsewhere])], OPTIONS);
    expect(missing).toMatchObject({
      ok: false,
      error: expect.stringMatching(/^no faulthandler dump file \*-pid\d+\.stacks .* in .*elsewhere; not signalled$/),
    });
    const [reused] = await dumpWithFaulthandler([{ ...target(python.pid), startTimeTicks: 1 }], OPTIONS);
    expect(reused).toMatchObject({ ok: false, error: `process ${python.pid} exited before it could be signalled` });
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(statSync(python.file ?? '').size).toBe(size);
  });

  it("reads no file that is a link, or that another user owns, under the rank's name", async () => {
    const python = await rank('collective');
    const file = python.file ?? '';
    renameSync(file, `${file}.real`);
    symlinkSync(`${file}.real`, file);
    expect((await dumpWithFaulthandler([target(python.pid)], OPTIONS))[0]).toMatchObject({
      ok: false,
      error: expect.stringContaining('no faulthandler dump file'),
    });
    rmSync(file);
    renameSync(`${file}.real`, file);
    if (process.getuid?.() === 0) {
      chownSync(file, 65534, 65534);
      expect((await dumpWithFaulthandler([target(python.pid)], OPTIONS))[0]).toMatchObject({
        ok: false,
        error: expect.stringContaining("of the process's user"),
      });
    }
  });

  it('takes no file last written before the process started: an earlier process that had the same pid left it', async () => {
    const python = await rank('collective');
    const longAgo = new Date(Date.now() - 3600_000);
    utimesSync(python.file ?? '', longAgo, longAgo);
    const size = statSync(python.file ?? '').size;
    const [result] = await dumpWithFaulthandler([target(python.pid)], OPTIONS);
    expect(result).toMatchObject({ ok: false, error: expect.stringContaining('written since it started') });
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(statSync(python.file ?? '').size).toBe(size);
  });

  it('gives up at the deadline when the handler writes nothing', async () => {
    const python = await rank('silent');
    const started = Date.now();
    const [result] = await dumpWithFaulthandler([target(python.pid)], { ...OPTIONS, deadlineMs: 600 });
    expect(Date.now() - started).toBeLessThan(3000);
    expect(result).toMatchObject({ ok: false, error: expect.stringContaining('no dump appeared') });
    expect(alive(python.pid)).toBe(true);
  });

  it("signals nothing when the procfs read is not the agent's own pid namespace", async () => {
    const python = await rank('collective');
    const fake = join(dir, 'proc');
    mkdirSync(fake);
    symlinkSync('1', join(fake, 'self'));
    // The right namespace but no boot time: nothing is signalled either.
    const own = join(dir, 'own-proc');
    mkdirSync(own);
    symlinkSync(String(process.pid), join(own, 'self'));
    expect((await dumpWithFaulthandler([target(python.pid)], { ...OPTIONS, procfs: own }))[0]).toMatchObject({
      ok: false,
      error: expect.stringContaining('no boot time'),
    });
    const [result] = await dumpWithFaulthandler([target(python.pid)], { ...OPTIONS, procfs: fake });
    expect(result).toMatchObject({ ok: false, error: expect.stringContaining("is not this agent's pid namespace") });
    const [unknown] = await dumpWithFaulthandler([target(python.pid)], { ...OPTIONS, procfs: join(dir, 'nothing') });
    expect(unknown).toMatchObject({ ok: false, error: expect.stringContaining('cannot tell whether') });
  });
});

describe('where a rank writes its dumps, and what its status says', () => {
  it("follows the client: $STEADFAST_STACK_DIR, else $TMPDIR/steadfast-stacks, else /tmp/steadfast-stacks, inside the rank's root; the flag wins", () => {
    expect(stackDirectories('/proc', { pid: 7, environment: { stackDirectory: '/scratch/stacks', tempDirectory: '/var/tmp' } }, undefined)).toEqual([
      '/proc/7/root/scratch/stacks',
    ]);
    expect(stackDirectories('/proc', { pid: 7, environment: { tempDirectory: '/var/tmp' } }, undefined)).toEqual([
      '/proc/7/root/var/tmp/steadfast-stacks',
      '/proc/7/root/tmp/steadfast-stacks',
    ]);
    expect(stackDirectories('/host/proc', { pid: 7, environment: undefined }, undefined)).toEqual(['/host/proc/7/root/tmp/steadfast-stacks']);
    expect(stackDirectories('/proc', { pid: 7, environment: { tempDirectory: '/tmp' } }, undefined)).toEqual(['/proc/7/root/tmp/steadfast-stacks']);
    expect(stackDirectories('/proc', { pid: 7, environment: { stackDirectory: '/x' } }, '/var/lib/stacks')).toEqual(['/var/lib/stacks']);
  });

  it('reads the caught-signal mask and the effective uid from a real status file', () => {
    const status = parseSignalStatus(readFileSync('/proc/self/status', 'utf8'));
    expect(status?.uid).toBe(process.geteuid?.());
    expect(typeof status?.caught).toBe('bigint');
    expect(parseSignalStatus('SigCgt:\t0000000000000200\nUid:\t1000\t1001\t1000\t1000\n')).toEqual({ caught: 0x200n, uid: 1001 });
    // A process in a container: the host's pid, then the container's.
    expect(parseSignalStatus('SigCgt:\t0000000000000200\nUid:\t0\t0\t0\t0\nNSpid:\t48213\t7\n')).toEqual({ caught: 0x200n, uid: 0, namespacePid: 7 });
    expect(parseSignalStatus('Name:\tpython3\n')).toBeUndefined();
  });

  it('reads the boot time from a real /proc/stat', () => {
    const bootTime = parseBootTime(readFileSync('/proc/stat', 'utf8'));
    expect(bootTime).toBeGreaterThan(1_000_000_000);
    expect(bootTime).toBeLessThanOrEqual(Date.now() / 1000);
    expect(parseBootTime('cpu 1 2 3\n')).toBeUndefined();
  });
});
