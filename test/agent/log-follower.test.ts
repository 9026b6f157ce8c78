import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { closeSync, constants, existsSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { createKernelLogCollector } from '../../agent/collectors/kernel-log/collector.js';
import { LogFollower, type LogPosition } from '../../agent/log-follower.js';
import { scrapeOne, seriesValue, testContext, waitFor } from './helpers.js';

/**
 * The follower on sources that never end: a character device other than /dev/kmsg and a FIFO
 * whose writer never closes. Every read of them is bounded, so the agent's first read, `--once`
 * and `steadfast check` return, and a read cut short says so.
 */

const XID13 = "[ 100.000001] NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception";
const SERIES13 = 'steadfast_xid_errors_total{pci_bus_id="0000:38:00",xid="13",severity="warning"}';
/** Each test must end by itself well inside this, whatever the source does. */
const TEST_LIMIT_MS = 20_000;

let dir: string;
let follower: LogFollower | undefined;
const writers: ChildProcess[] = [];
const heldOpen: number[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-follower-'));
});

afterEach(async () => {
  await follower?.close();
  follower = undefined;
  for (const writer of writers.splice(0)) writer.kill('SIGKILL');
  for (const fd of heldOpen.splice(0)) closeSync(fd);
  rmSync(dir, { recursive: true, force: true });
});

interface Followed {
  readonly lines: string[];
  readonly positions: LogPosition[];
  readonly logs: string[];
  readonly startMs: number;
}

async function follow(path: string, streamPass?: { bytes: number; ms: number }): Promise<Followed> {
  const lines: string[] = [];
  const positions: LogPosition[] = [];
  const logs: string[] = [];
  const logger = pino({ level: 'info' }, { write: (line: string) => void logs.push(line) });
  follower = new LogFollower(
    path,
    20,
    (line, position) => {
      lines.push(line);
      positions.push(position);
    },
    logger,
    'kernel log',
    undefined,
    streamPass,
  );
  const started = Date.now();
  await follower.start();
  return { lines, positions, logs, startMs: Date.now() - started };
}

function fifo(): string {
  const path = join(dir, 'kmsg.fifo');
  execFileSync('mkfifo', [path]);
  return path;
}

/** A writer that opens the FIFO and never closes it: `script` runs with fd 3 on the FIFO. */
function writer(path: string, script: string): ChildProcess {
  // Held open for reading first, so the writer's open(2) does not wait for the follower.
  heldOpen.push(openSync(path, constants.O_RDONLY | constants.O_NONBLOCK));
  const child = spawn('sh', ['-c', `exec 3>"$0"; ${script}`, path], { stdio: 'ignore' });
  writers.push(child);
  return child;
}

const cutShort = (logs: string[]): boolean => logs.some((line) => line.includes('did not run dry'));

describe('log follower on a source that never runs dry', () => {
  it(
    'reads /dev/zero for one bounded pass, says the read was cut short, and keeps no line longer than 1 MiB',
    async () => {
      const { lines, logs, startMs } = await follow('/dev/zero');
      expect(startMs).toBeLessThan(5_000);
      expect(follower?.lastError).toBeUndefined();
      expect(cutShort(logs)).toBe(true);
      // Zeros hold no newline: no line ended, and what waits of the unended one is capped.
      expect(lines).toEqual([]);
    },
    TEST_LIMIT_MS,
  );

  it(
    'reads a FIFO whose writer writes without end for one bounded pass, and says so',
    async () => {
      const path = fifo();
      writer(path, `yes "${XID13}" >&3`);
      // The pipe is full before the follower opens it; a bound below the pipe's 64 KiB is met at once.
      await new Promise((resolve) => setTimeout(resolve, 300));
      const { lines, logs, startMs } = await follow(path, { bytes: 16 * 1024, ms: 2_000 });
      expect(startMs).toBeLessThan(5_000);
      expect(cutShort(logs)).toBe(true);
      expect(lines.length).toBeGreaterThan(0);
      expect(lines.length).toBeLessThan((64 * 1024) / XID13.length + 1);
      expect(lines.every((line) => line === XID13)).toBe(true);
    },
    TEST_LIMIT_MS,
  );

  it(
    'reads what a FIFO holds when it opens, returns while the writer stays open and quiet, and reads a later line as new',
    async () => {
      const path = fifo();
      const child = writer(path, `printf '%s\\n' "${XID13}" >&3; sleep 60`);
      await waitFor(() => child.pid !== undefined, 1_000);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const { lines, positions, logs, startMs } = await follow(path);
      expect(startMs).toBeLessThan(5_000);
      expect(lines).toEqual([XID13]);
      expect(positions).toEqual([{ source: 'kmsg', sequence: undefined, firstRead: true }]);
      expect(cutShort(logs)).toBe(false);
      expect(follower?.lastError).toBeUndefined();
    },
    TEST_LIMIT_MS,
  );

  it(
    'opens a FIFO that has no writer yet without waiting, and reads the writer once it comes',
    async () => {
      const path = fifo();
      const { lines, positions, startMs } = await follow(path);
      expect(startMs).toBeLessThan(5_000);
      expect(lines).toEqual([]);
      writers.push(spawn('sh', ['-c', `exec 3>"$0"; printf '%s\\n' "${XID13}" >&3; sleep 60`, path], { stdio: 'ignore' }));
      await waitFor(() => lines.length === 1, 5_000);
      expect(positions).toEqual([{ source: 'kmsg', sequence: undefined, firstRead: false }]);
    },
    TEST_LIMIT_MS,
  );

  it('cuts a line longer than 1 MiB at 1 MiB and reads the next line whole', async () => {
    const path = join(dir, 'kern.log');
    writeFileSync(path, `${'x'.repeat(3 * 1024 * 1024)}\n${XID13}\n`);
    const { lines } = await follow(path);
    expect(lines.map((line) => line.length)).toEqual([1024 * 1024, XID13.length]);
    expect(lines[1]).toBe(XID13);
  });
});

describe('xid collector on a source that never runs dry', () => {
  it(
    'starts and scrapes on /dev/zero as --once does, reporting success and no events',
    async () => {
      const context = testContext({ kmsg: '/dev/zero' });
      const collector = createKernelLogCollector(context);
      try {
        const text = await scrapeOne(context, collector);
        expect(text).toContain('steadfast_collector_success{collector="xid"} 1');
        expect(text).not.toContain('steadfast_xid_errors_total{');
      } finally {
        await collector.close();
      }
    },
    TEST_LIMIT_MS,
  );

  it(
    'starts and scrapes on a FIFO held open by a writer that never closes, counting what it read',
    async () => {
      const path = fifo();
      writer(path, `printf '%s\\n%s\\n' "${XID13}" "${XID13}" >&3; sleep 60`);
      await new Promise((resolve) => setTimeout(resolve, 200));
      const context = testContext({ kmsg: path });
      const collector = createKernelLogCollector(context);
      try {
        const text = await scrapeOne(context, collector);
        expect(seriesValue(text, SERIES13)).toBe(2);
        expect(existsSync(path)).toBe(true);
      } finally {
        await collector.close();
      }
    },
    TEST_LIMIT_MS,
  );
});
