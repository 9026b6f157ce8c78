import {
  constants,
  accessSync,
  appendFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  truncateSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { XID_STATE_FILE_FLAG, createKernelLogCollector } from '../../../../agent/collectors/kernel-log/collector.js';
import { bootIdPath, readXidState } from '../../../../agent/collectors/kernel-log/xid-reported.js';
import type { FastPathOutcome } from '../../../../agent/fast-path-client.js';
import { EXPECTED, XID_LOGS, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor } from '../../helpers.js';

const FOLLOW_MS = 20;
const XID13 = "[ 100.000001] NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n";
const XID79 = "[ 200.000001] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";
const SERIES13 = 'steadfast_xid_errors_total{pci_bus_id="0000:38:00",xid="13",severity="warning"}';
const SERIES79 = 'steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"}';

let dir: string;
let collector: Collector | undefined;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-xid-'));
});

afterEach(async () => {
  await collector?.close();
  collector = undefined;
  rmSync(dir, { recursive: true, force: true });
});

async function started(path: string): Promise<{ collector: Collector; context: ReturnType<typeof testContext> }> {
  const context = testContext({ kmsg: path });
  collector = createKernelLogCollector(context, { followIntervalMs: FOLLOW_MS });
  await collector.start();
  return { collector, context };
}

async function value(context: ReturnType<typeof testContext>, series: string): Promise<number | undefined> {
  return seriesValue(await context.registry.metrics(), series);
}

describe('xid collector following a log file', () => {
  it('counts lines present at start, then lines appended later, and sends fatal ones on the fast path', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, XID13);
    const { context } = await started(log);
    expect(await value(context, SERIES13)).toBe(1);

    appendFileSync(log, XID13 + 'unrelated line\n' + XID79);
    await waitFor(async () => (await value(context, SERIES79)) === 1);
    expect(await value(context, SERIES13)).toBe(2);
    expect(context.events).toEqual([
      expect.objectContaining({ kind: 'xid', node: 'node-1', gpu: '0000:91:00', xid: 79, message: 'GPU has fallen off the bus.' }),
    ]);
  });

  it('counts the Xids of a journalctl capture in any locale, as with an English one', async () => {
    const log = join(dir, 'journal.txt');
    const lines = ['Nov 23', 'nov 23', 'déc. 05', 'Dez 05', 'ноя 23', '11月 23'].map(
      (date) => `${date} 14:25:31 gpu-7 kernel: NVRM: Xid (PCI:0000:38:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n`,
    );
    writeFileSync(log, lines.join(''));
    const { context } = await started(log);
    expect(await value(context, SERIES13)).toBe(6);
  });

  it('counts a last line that has no newline once no more data follows it', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, XID13.trimEnd());
    const { context } = await started(log);
    expect(await value(context, SERIES13)).toBe(1);
    appendFileSync(log, `\n${XID79.trimEnd()}`);
    await waitFor(async () => (await value(context, SERIES79)) === 1);
    expect(await value(context, SERIES13)).toBe(1);
    expect(context.events).toHaveLength(1);
  });

  it('reads a truncated file again from its start', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, XID13 + XID13 + XID13);
    const { context } = await started(log);
    expect(await value(context, SERIES13)).toBe(3);
    truncateSync(log, 0);
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 3));
    appendFileSync(log, XID79);
    await waitFor(async () => (await value(context, SERIES79)) === 1);
    expect(await value(context, SERIES13)).toBe(3);
  });

  it('reads a rotated file (a new file under the same name) from its start', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, XID13 + XID13 + XID13 + XID13);
    const { context } = await started(log);
    renameSync(log, `${log}.1`);
    // Shorter than what was read already would also look like truncation; make it not, to test the inode check.
    writeFileSync(log, XID79 + XID13 + XID13 + XID13 + XID13 + XID13);
    await waitFor(async () => (await value(context, SERIES79)) === 1);
    expect(await value(context, SERIES13)).toBe(9);
  });

  it('reports failure while the log does not exist, and reads it from the start once it appears', async () => {
    const log = join(dir, 'not-yet.log');
    const { collector: xid, context } = await started(log);
    await expect(xid.update()).rejects.toThrow(/cannot read kernel log/);
    writeFileSync(log, XID79);
    await waitFor(() =>
      xid.update().then(
        () => true,
        () => false,
      ),
    );
    expect(await value(context, SERIES79)).toBe(1);
  });

  it('joins the multi-line "fallen off the bus" report written as indented dmesg continuation lines', async () => {
    const log = join(dir, 'dmesg.log');
    writeFileSync(
      log,
      '[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0\n' +
        '               NVRM: (PCI ID: 10de:26b5) installed in this system has\n' +
        '               NVRM: fallen off the bus and is not responding to commands.\n',
    );
    const { context } = await started(log);
    expect(await value(context, 'steadfast_xid_errors_total{pci_bus_id="0000:b3:00",xid="79",severity="fatal"}')).toBe(1);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'xid', gpu: '0000:b3:00', xid: 79 })]);
  });

  it('sends a GPU off the bus once, told by Xid 79 and the NVRM notice beside it, and once when told by the notice alone', async () => {
    const sample = readFileSync(join(XID_LOGS, 'nvrm_fallen-off-bus_forms_and_dmesg-T_from_public_reports.txt'), 'utf8').split('### ');
    const block = (needle: string): string => (sample.find((text) => text.includes(needle)) ?? '').split('\n').slice(1).join('\n');
    const log = join(dir, 'kern.log');
    writeFileSync(log, block('gpud @4a8de33a3f02'));
    const { context } = await started(log);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'xid', gpu: '0000:91:00', xid: 79, message: 'GPU has fallen off the bus.' })]);
    appendFileSync(log, block('Bumblebee/issues/554'));
    await waitFor(() => context.events.length === 2);
    expect(context.events[1]).toMatchObject({ kind: 'xid', gpu: '0000:01:00', xid: 79, message: 'GPU has fallen off the bus (reported without an Xid line)' });
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 5));
    expect(context.events).toHaveLength(2);
    expect(await value(context, SERIES79)).toBe(1);
    expect(await value(context, 'steadfast_xid_errors_total{pci_bus_id="0000:01:00",xid="79",severity="fatal"}')).toBe(1);
  });

  it('stops following when closed, and can be closed twice', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, '');
    const { collector: xid, context } = await started(log);
    await xid.close();
    await xid.close();
    appendFileSync(log, XID79);
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 4));
    expect(await value(context, SERIES79)).toBeUndefined();
  });
});

function kmsgReadable(): boolean {
  try {
    accessSync('/dev/kmsg', constants.R_OK);
    return true;
  } catch {
    return false;
  }
}

describe('xid collector on /dev/kmsg', () => {
  // Reading needs the device and the right to read it; CI containers may have neither.
  it.skipIf(!kmsgReadable())('reads the kernel ring buffer without blocking and reports success', async () => {
    const { collector: xid } = await started('/dev/kmsg');
    await expect(xid.update()).resolves.toBeUndefined();
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 3));
    await expect(xid.update()).resolves.toBeUndefined();
  });
});

describe('xid collector exposition', () => {
  const logFiles = readdirSync(XID_LOGS).filter((name) => name !== 'README.md');

  it.each(logFiles)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({ kmsg: join(XID_LOGS, name) });
    collector = createKernelLogCollector(context);
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="xid"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'xid', name.replace(/\.(log|txt)$/, '.prom')), text);
  });
});

describe('xid collector reporting each fatal Xid once, across agent restarts', () => {
  const BOOT_A = '4f1d0c2e-8a7b-4c55-9e61-0d2f3a4b5c6d';
  const BOOT_B = 'b7e2a1d0-3c4f-4a6b-8d9e-1f2a3b4c5d6e';
  const XID79_LATER = "[ 300.000001] NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";
  const XID79_OTHER_GPU = "[ 300.000001] NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n";
  const SERIES79_OTHER_GPU = 'steadfast_xid_errors_total{pci_bus_id="0000:5d:00",xid="79",severity="fatal"}';
  const XID48 =
    "[ 250.000001] NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n";
  const BANNER = '[    0.000000] Linux version 6.18.44-fc-v669 (builder@sandboxing) (gcc (GCC) 15.3.0, GNU ld (GNU Binutils) 2.46) #1 SMP PREEMPT_DYNAMIC @0\n';

  let procfs: string;
  let stateFile: string;
  let log: string;

  beforeEach(() => {
    procfs = join(dir, 'proc');
    stateFile = join(dir, 'state', 'xid-state.json');
    log = join(dir, 'kern.log');
    boot(BOOT_A);
  });

  function boot(id: string): void {
    mkdirSync(join(procfs, 'sys', 'kernel', 'random'), { recursive: true });
    writeFileSync(bootIdPath(procfs), `${id}\n`);
  }

  /** One agent run: the collector started on the log, its fast path answering `outcome` to every event. */
  async function run(outcome: FastPathOutcome = 'delivered'): Promise<{ context: ReturnType<typeof testContext>; xid: Collector; logs: string[] }> {
    await collector?.close();
    const logs: string[] = [];
    const base = testContext({ kmsg: log, procfs }, 5, { [XID_STATE_FILE_FLAG]: stateFile });
    const context = {
      ...base,
      logger: pino({ level: 'info' }, { write: (line: string) => void logs.push(line) }),
      fastPath: (event: (typeof base.events)[number], onOutcome?: (outcome: FastPathOutcome) => void) => {
        base.events.push(event);
        onOutcome?.(outcome);
      },
    };
    collector = createKernelLogCollector(context, { followIntervalMs: FOLLOW_MS });
    await collector.start();
    return { context, xid: collector, logs };
  }

  /** Closes the running collector, so that the state it wrote is on disk. */
  async function stop(): Promise<void> {
    await collector?.close();
    collector = undefined;
  }

  it('does not send again, after a restart on the same boot, a fatal Xid the controller already took; the counter still counts it', async () => {
    writeFileSync(log, XID13 + XID79);
    const first = await run();
    expect(first.context.events).toHaveLength(1);
    await stop();
    const state = await readXidState(stateFile);
    expect(state).toMatchObject({ state: { version: 1, log, bootId: BOOT_A, xid: 79, gpu: '0000:91:00', last: { source: 'file', occurrence: 1 } } });

    const second = await run();
    expect(second.context.events).toEqual([]);
    expect(await value(second.context, SERIES79)).toBe(1);
    expect(await value(second.context, SERIES13)).toBe(1);
    expect(second.logs.some((line) => line.includes('not sent again'))).toBe(true);
  });

  it('sends once a fatal Xid written after the restart, and once one written while the agent was down', async () => {
    writeFileSync(log, XID79);
    await run();
    await stop();
    appendFileSync(log, XID48);
    const second = await run();
    expect(second.context.events).toEqual([expect.objectContaining({ xid: 48, gpu: '0000:3b:00' })]);
    appendFileSync(log, XID79_OTHER_GPU);
    await waitFor(() => second.context.events.length === 2);
    expect(second.context.events[1]).toMatchObject({ xid: 79, gpu: '0000:5d:00' });
    await stop();

    const third = await run();
    expect(third.context.events).toEqual([]);
    expect(await value(third.context, SERIES79)).toBe(1);
    expect(await value(third.context, SERIES79_OTHER_GPU)).toBe(1);
  });

  it('takes a second report of the same GPU off the bus in the same boot for the same fall: neither counted nor sent again', async () => {
    writeFileSync(log, XID79);
    const first = await run();
    appendFileSync(log, XID79_LATER);
    await new Promise((resolve) => setTimeout(resolve, FOLLOW_MS * 5));
    expect(first.context.events).toHaveLength(1);
    expect(await value(first.context, SERIES79)).toBe(1);
  });

  it('tells apart lines of the same text by their order: the second of two identical lines is still news', async () => {
    // Lines without a time stamp (a log of bare kernel messages) repeat exactly.
    const bare =
      "NVRM: Xid (PCI:0000:3b:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n";
    writeFileSync(log, bare);
    await run();
    await stop();
    appendFileSync(log, bare);
    const second = await run();
    expect(second.context.events).toHaveLength(1);
    await stop();
    expect((await run()).context.events).toEqual([]);
  });

  it('sends again after a restart a fatal Xid the controller never took (refused, or not sent before the agent stopped)', async () => {
    writeFileSync(log, XID79);
    await run('not_sent');
    await stop();
    expect(existsSync(stateFile)).toBe(false);
    const second = await run('refused');
    expect(second.context.events).toHaveLength(1);
    await stop();
    const third = await run();
    expect(third.context.events).toHaveLength(1);
  });

  it('after a reboot, treats what the log holds from before the boot banner as history, and sends what came after it', async () => {
    writeFileSync(log, BANNER + XID79);
    await run();
    await stop();
    // The node reboots (a new boot id); syslog appends the new boot to the same file.
    boot(BOOT_B);
    appendFileSync(log, XID48 + BANNER + XID79_LATER);
    const second = await run();
    expect(second.context.events).toEqual([expect.objectContaining({ xid: 79, message: 'GPU has fallen off the bus.' })]);
    expect(await value(second.context, SERIES79)).toBe(2);
  });

  it('without any state, still leaves out what the log holds from before the last boot', async () => {
    writeFileSync(log, BANNER + XID79 + BANNER + XID48);
    const { context } = await run();
    expect(context.events).toEqual([expect.objectContaining({ xid: 48 })]);
  });

  it('reads a rotated log (the reported Xid moved to kern.log.1) as news', async () => {
    writeFileSync(log, XID79);
    await run();
    await stop();
    renameSync(log, `${log}.1`);
    writeFileSync(log, XID79_LATER);
    const second = await run();
    expect(second.context.events).toEqual([expect.objectContaining({ xid: 79 })]);
  });

  it.each([
    ['not JSON', '{"version":1,'],
    ['of another shape', JSON.stringify({ version: 2, last: 'yesterday' })],
    ['empty', ''],
  ])('logs a state file that is %s and treats it as no state, without failing', async (_what, content) => {
    writeFileSync(log, XID79);
    mkdirSync(join(dir, 'state'), { recursive: true });
    writeFileSync(stateFile, content);
    const { context, xid, logs } = await run();
    expect(context.events).toHaveLength(1);
    await expect(xid.update()).resolves.toBeUndefined();
    expect(logs.some((line) => line.includes('xid state file ignored'))).toBe(true);
    await stop();
    // The next report replaced it with a good one.
    expect(await readXidState(stateFile)).toMatchObject({ state: { xid: 79 } });
  });

  it('creates a missing state directory, and keeps reporting when the state cannot be written at all', async () => {
    writeFileSync(log, XID79);
    const first = await run();
    expect(first.context.events).toHaveLength(1);
    await stop();
    expect(existsSync(stateFile)).toBe(true);

    // A directory where the file should be: reading and writing fail, the collector goes on.
    rmSync(join(dir, 'state'), { recursive: true });
    mkdirSync(stateFile, { recursive: true });
    const second = await run();
    expect(second.context.events).toHaveLength(1);
    await second.xid.update();
    await stop();
    expect(second.logs.some((line) => line.includes('xid state file ignored'))).toBe(true);
    expect(second.logs.some((line) => line.includes('cannot write xid state file'))).toBe(true);
  });

  it('ignores a state about another kernel log', async () => {
    writeFileSync(log, XID79);
    await run();
    await stop();
    const other = join(dir, 'other.log');
    writeFileSync(other, XID79);
    const state = JSON.parse(readFileSync(stateFile, 'utf8')) as Record<string, unknown>;
    writeFileSync(stateFile, JSON.stringify({ ...state, log: other }));
    const second = await run();
    expect(second.context.events).toHaveLength(1);
  });
});
