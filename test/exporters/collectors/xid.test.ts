import { constants, accessSync, appendFileSync, mkdtempSync, readdirSync, renameSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../exporters/collector.js';
import { createXidCollector } from '../../../exporters/collectors/xid.js';
import { EXPECTED, XID_LOGS, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor } from '../helpers.js';

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
  collector = createXidCollector(context, { followIntervalMs: FOLLOW_MS });
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
    await waitFor(() => xid.update().then(() => true, () => false));
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
    collector = createXidCollector(context);
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="xid"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'xid', name.replace(/\.(log|txt)$/, '.prom')), text);
  });
});
