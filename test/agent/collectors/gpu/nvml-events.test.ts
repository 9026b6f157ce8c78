import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { createGpuCollector } from '../../../../agent/collectors/gpu/collector.js';
import { StandInNvml } from '../../../../tryit/nvml/stand-in.js';
import { FIXTURES, seriesValue, tempDirPerTest, testContext, waitFor, type TestContext } from '../../helpers.js';

/**
 * NVML Xid events for the GPU that just failed: every GPU a poll has read stays registered, under
 * the identity it was read with, for the event set's life (an Xid 79 from a GPU the last poll
 * could not read still names it; a GPU missing when the set was made is registered once a poll
 * reads it), and a failing event wait is reported once, shown as the events being down, and
 * makes the collector poll at once, so that a GPU off the bus shows as not present.
 */

const dir = tempDirPerTest('steadfast-nvml-events-');
const H200_STATE = readFileSync(join(FIXTURES, 'nvml', 'h200_580.159.04.state'), 'utf8');
const TWO_GPUS = `${H200_STATE.replace('gpus 1', 'gpus 2')}1 pci 00000000:00:07.0\n1 minor 1\n1 uuid GPU-11111111-0000-0000-0000-000000000000\n1 temp 40\n1 events 0x8\n`;
const GPU1_PRESENT = 'steadfast_gpu_present{gpu="1",pci_bus_id="0000:00:07",UUID="GPU-11111111-0000-0000-0000-000000000000"}';
const EVENTS_UP = 'steadfast_gpu_nvml_events_up';
const WAIT_LOST = 'steadfast_gpu_nvml_errors_total{function="nvmlEventSetWait_v2",error="gpu_is_lost"}';
let collectors: Collector[] = [];

afterEach(async () => {
  await Promise.all(collectors.map((collector) => collector.close()));
  collectors = [];
});

async function start(state: string, pollSeconds: number): Promise<{ context: TestContext; standIn: StandInNvml }> {
  const standIn = await StandInNvml.create(join(dir(), 'nvml'), state);
  const context = testContext({}, pollSeconds, { 'gpu.source': 'nvml', 'gpu.nvml-library': standIn.library });
  const collector = createGpuCollector(context);
  collectors.push(collector);
  await collector.start();
  await waitFor(async () => seriesValue(await context.registry.metrics(), EVENTS_UP) === 1, 10_000);
  return { context, standIn };
}

async function metric(context: TestContext, series: string): Promise<number | undefined> {
  return seriesValue(await context.registry.metrics(), series);
}

describe('NVML Xid events', () => {
  it('sends an Xid 79 from a GPU that the last poll could not read, named as it was registered', async () => {
    const { context, standIn } = await start(TWO_GPUS, 0.05);
    await standIn.setState(`${TWO_GPUS}1 lost 1\n`);
    await waitFor(async () => (await metric(context, GPU1_PRESENT)) === 0);
    await standIn.raiseXid(1, 79);
    await waitFor(() => context.events.some((event) => event.kind === 'xid'));
    expect(context.events.filter((event) => event.kind === 'xid')).toEqual([expect.objectContaining({ gpu: '0000:00:07', xid: 79 })]);
  });

  it('registers a GPU missing when the events started once a poll reads it', async () => {
    const { context, standIn } = await start(`${TWO_GPUS}1 fail.handle 15\n`, 0.05);
    expect(await metric(context, GPU1_PRESENT)).toBeUndefined();
    await standIn.setState(TWO_GPUS);
    await waitFor(async () => (await metric(context, GPU1_PRESENT)) === 1);
    await standIn.raiseXid(1, 48);
    await waitFor(() => context.events.some((event) => event.kind === 'xid'));
    expect(context.events.filter((event) => event.kind === 'xid')).toEqual([expect.objectContaining({ gpu: '0000:00:07', xid: 48 })]);
  });

  it('reports a failing wait once, shows the events down, polls at once to find the lost GPU, and says when the wait answers again', async () => {
    // Polls a minute apart: only the poll the failed wait asks for can find the lost GPU in time.
    const { context, standIn } = await start(TWO_GPUS, 60);
    await standIn.setState(`${TWO_GPUS}1 lost 1\nfail.wait 15\n`);
    await waitFor(async () => (await metric(context, EVENTS_UP)) === 0);
    await waitFor(async () => (await metric(context, GPU1_PRESENT)) === 0);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:00:07' })]);
    // The wait keeps failing every check: still one error counted for the run.
    await waitFor(async () => (await standIn.waitFailures()) >= 10, 20_000);
    expect(await metric(context, WAIT_LOST)).toBe(1);

    await standIn.setState(`${TWO_GPUS}1 lost 1\n`);
    await waitFor(async () => (await metric(context, EVENTS_UP)) === 1);
    expect(await metric(context, WAIT_LOST)).toBe(1);
    // A new run of failures is a new report.
    await standIn.setState(`${TWO_GPUS}1 lost 1\nfail.wait 15\n`);
    await waitFor(async () => (await metric(context, WAIT_LOST)) === 2);
  });
});
