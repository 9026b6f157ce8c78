import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import type { FastPathEvent } from '../../../../core/fast-path-event.js';
import { silentLogger } from '../../../../core/log.js';
import type { Collector, CollectorContext } from '../../../../agent/collector.js';
import { createGpuCollector } from '../../../../agent/collectors/gpu/collector.js';
import { XID_STATE_FILE_FLAG, createKernelLogCollector } from '../../../../agent/collectors/kernel-log/collector.js';
import { GpuSourceChoice } from '../../../../agent/gpu-source.js';
import { XidLedger } from '../../../../agent/xid-ledger.js';
import { StandInNvml } from '../../../../tryit/nvml/stand-in.js';
import { FIXTURES, seriesValue, tempDirPerTest, waitFor } from '../../helpers.js';

/**
 * Xids reach the agent twice: a kernel log line (xid collector) and an NVML event (gpu
 * collector on NVML, here the stand-in library raising them). Each occurrence is counted and
 * sent on the fast path once, whichever arrives first, and the kernel log's state file still
 * records an Xid that NVML reported first, so that a restarted agent does not send it again.
 */

const dir = tempDirPerTest('steadfast-xid-nvml-');
const H200_STATE = readFileSync(join(FIXTURES, 'nvml', 'h200_580.159.04.state'), 'utf8');
const GPU = '0000:00:06';
const LINE79 = `[ 200.000001] NVRM: Xid (PCI:${GPU}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n`;
const LINE13 = `[ 100.000001] NVRM: Xid (PCI:${GPU}): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp Exception\n`;
const FATAL79 = `steadfast_xid_errors_total{pci_bus_id="${GPU}",xid="79",severity="fatal"}`;
const WARNING13 = `steadfast_xid_errors_total{pci_bus_id="${GPU}",xid="13",severity="warning"}`;

let collectors: Collector[] = [];

afterEach(async () => {
  await Promise.all(collectors.map((collector) => collector.close()));
  collectors = [];
});

interface Node {
  readonly context: CollectorContext;
  readonly events: FastPathEvent[];
  readonly standIn: StandInNvml;
  readonly log: string;
  readonly stateFile: string;
}

/** An agent's gpu (NVML) and xid collectors sharing one ledger; the controller takes every fast-path event. */
async function node(kernelLog: 'readable' | 'unreadable' = 'readable'): Promise<Node> {
  const standIn = await StandInNvml.create(join(dir(), 'nvml'), H200_STATE);
  const log = join(dir(), 'kern.log');
  if (kernelLog === 'readable') writeFileSync(log, '');
  const stateFile = join(dir(), 'xid-state.json');
  const registry = new Registry();
  const events: FastPathEvent[] = [];
  const settings = { 'gpu.source': 'nvml', 'gpu.nvml-library': standIn.library, [XID_STATE_FILE_FLAG]: stateFile };
  const base = {
    registry,
    paths: { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: log, nvidiaSmi: 'nvidia-smi' },
    logger: silentLogger(),
    node: 'node-1',
    fastPath: (event: FastPathEvent, onOutcome?: (outcome: 'delivered') => void) => {
      events.push(event);
      onOutcome?.('delivered');
    },
    pollIntervalSeconds: 0.05,
    settings,
  };
  const context: CollectorContext = { ...base, gpuSource: new GpuSourceChoice(base), xids: new XidLedger(registry) };
  return { context, events, standIn, log, stateFile };
}

async function start(context: CollectorContext, which: 'gpu' | 'xid'): Promise<Collector> {
  const collector = which === 'gpu' ? createGpuCollector(context) : createKernelLogCollector(context, { followIntervalMs: 20 });
  collectors.push(collector);
  await collector.start();
  return collector;
}

/** The Xid the kernel log's state file records as last reported, if any. */
function recordedXid(stateFile: string): number | undefined {
  try {
    return (JSON.parse(readFileSync(stateFile, 'utf8')) as { xid?: number }).xid;
  } catch {
    return undefined;
  }
}

async function value(context: CollectorContext, series: string): Promise<number | undefined> {
  return seriesValue(await context.registry.metrics(), series);
}

/** Waits until the stand-in's events are registered (the gpu collector's first poll is done by start()). */
async function listening(context: CollectorContext): Promise<void> {
  await waitFor(async () => (await context.registry.metrics()).includes('# TYPE steadfast_xid_errors_total counter'));
}

describe('Xids from NVML events and the kernel log', () => {
  it('counts and sends an Xid NVML reports first once, when its kernel log line follows, and records the line as reported', async () => {
    const { context, events, standIn, log, stateFile } = await node();
    await start(context, 'xid');
    await start(context, 'gpu');
    await listening(context);
    await standIn.raiseXid(0, 79);
    await waitFor(() => events.length === 1);
    expect(events[0]).toMatchObject({ kind: 'xid', node: 'node-1', gpu: GPU, xid: 79, message: expect.stringContaining('NVML') });
    appendFileSync(log, LINE79);
    await waitFor(() => recordedXid(stateFile) === 79);
    expect(await value(context, FATAL79)).toBe(1);
    expect(events).toHaveLength(1);

    // A restarted agent reads the line back from the log: already reported, not sent again.
    await Promise.all(collectors.map((collector) => collector.close()));
    collectors = [];
    const restartedEvents: FastPathEvent[] = [];
    const restarted: CollectorContext = {
      ...context,
      registry: new Registry(),
      gpuSource: undefined,
      xids: undefined,
      fastPath: (event) => restartedEvents.push(event),
    };
    await start(restarted, 'xid');
    await waitFor(async () => (await value(restarted, FATAL79)) === 1);
    expect(restartedEvents).toEqual([]);
  });

  it('counts and sends an Xid the kernel log reports first once, when NVML reports it after', async () => {
    const { context, events, standIn, log } = await node();
    await start(context, 'xid');
    await start(context, 'gpu');
    await listening(context);
    appendFileSync(log, LINE79);
    await waitFor(() => events.length === 1);
    expect(events[0]).toMatchObject({ kind: 'xid', xid: 79, message: 'GPU has fallen off the bus.' });
    await standIn.raiseXid(0, 79);
    // The stand-in delivers its event within a wait; a second Xid 79 after it shows the first was taken.
    await standIn.raiseXid(0, 13);
    await waitFor(async () => (await value(context, WARNING13)) === 1);
    expect(await value(context, FATAL79)).toBe(1);
    expect(events).toHaveLength(1);
  });

  it('pairs a burst one to one: five Xid 13 seen by both sources count five, none on the fast path', async () => {
    const { context, events, standIn, log } = await node();
    await start(context, 'xid');
    await start(context, 'gpu');
    await listening(context);
    for (let index = 0; index < 5; index++) await standIn.raiseXid(0, 13);
    await waitFor(async () => (await value(context, WARNING13)) === 5);
    appendFileSync(log, LINE13.repeat(5));
    // A sixth, from the log alone, is a new occurrence.
    appendFileSync(log, LINE13);
    await waitFor(async () => (await value(context, WARNING13)) === 6);
    expect(events).toEqual([]);
  });

  it('still counts and sends Xids where the kernel log cannot be read (a pod without CAP_SYSLOG)', async () => {
    const { context, events, standIn } = await node('unreadable');
    const xid = await start(context, 'xid');
    await expect(xid.update()).rejects.toThrow(/cannot read kernel log/);
    await start(context, 'gpu');
    await listening(context);
    await standIn.raiseXid(0, 79);
    await waitFor(() => events.length === 1);
    expect(await value(context, FATAL79)).toBe(1);
  });
});

describe('xid ledger', () => {
  const report = { pciBusId: GPU, xid: 79, severity: 'fatal' as const };

  it('pairs reports of the other source within the window only, one to one', async () => {
    let now = 0;
    const registry = new Registry();
    const ledger = new XidLedger(registry, 10_000, () => now);
    ledger.register(); // as the collectors that count into it do
    expect(ledger.observe('nvml', report).news).toBe(true);
    // The same source twice is two occurrences.
    expect(ledger.observe('nvml', report).news).toBe(true);
    now = 5_000;
    const first = ledger.observe('kernel-log', report);
    expect(first.news).toBe(false);
    expect(ledger.observe('kernel-log', report).news).toBe(false);
    // Both NVML reports are paired: a third line is news.
    expect(ledger.observe('kernel-log', report).news).toBe(true);
    now = 20_000;
    // Past the window, the kernel log's unpaired line no longer absorbs an NVML report.
    expect(ledger.observe('nvml', report).news).toBe(true);
    expect(seriesValue(await registry.metrics(), FATAL79)).toBe(4);
  });
});
