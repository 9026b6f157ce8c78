import { appendFileSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { createKernelLogCollector } from '../../../../agent/collectors/kernel-log/collector.js';
import { EXPECTED, HOST_LOGS, XID_LOGS, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor } from '../../helpers.js';

/** Real lines (sources in the samples' READMEs). */
const BOOT = readFileSync(join(XID_LOGS, 'boot-banner_firecracker-vm_dmesg-formats.log'), 'utf8').split('\n')[0] + '\n';
const RM_INIT =
  (readFileSync(join(HOST_LOGS, 'host_lines_from_public_reports.txt'), 'utf8')
    .split('\n')
    .find((line) => line.includes('0000:04:01.0: RmInitAdapter')) ?? '') + '\n';
const RM_INIT_SERIES = 'steadfast_gpu_driver_events_total{pci_bus_id="0000:04:01",event="init_failed"}';

let dir: string;
let collector: Collector | undefined;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-host-kernel-'));
});

afterEach(async () => {
  await collector?.close();
  collector = undefined;
  rmSync(dir, { recursive: true, force: true });
});

describe('host kernel counters in the xid collector', () => {
  const samples = readdirSync(HOST_LOGS).filter((name) => name !== 'README.md');

  it.each(samples)('exports the host events of %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({ kmsg: join(HOST_LOGS, name) });
    collector = createKernelLogCollector(context);
    const text = await scrapeOne(context, collector);
    await expectMatchesAndLints(join(EXPECTED, 'host-kernel', name.replace(/\.(log|txt)$/, '.prom')), text);
  });

  it('counts AER errors by port and severity, NVIDIA hangs and fatal SXids from the real samples', async () => {
    const context = testContext({ kmsg: join(HOST_LOGS, 'host_lines_from_public_reports.txt') });
    collector = createKernelLogCollector(context);
    const text = await scrapeOne(context, collector);
    expect(seriesValue(text, 'steadfast_pcie_aer_errors_total{pci_address="0000:00:03.0",severity="fatal"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_pcie_aer_errors_total{pci_address="0000:00:03.1",severity="corrected"}')).toBe(2);
    expect(seriesValue(text, 'steadfast_kernel_events_total{kind="hung_task_nvidia"}')).toBe(2);
    expect(seriesValue(text, 'steadfast_machine_check_events_total{severity="logged"}')).toBe(2);
  });

  it('sends a GPU the driver cannot initialise on the fast path as lost, when the line arrives', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, BOOT);
    const context = testContext({ kmsg: log });
    collector = createKernelLogCollector(context, { followIntervalMs: 20 });
    await collector.start();
    expect(context.events).toEqual([]);
    appendFileSync(log, RM_INIT);
    await waitFor(async () => seriesValue(await context.registry.metrics(), RM_INIT_SERIES) === 1);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', node: 'node-1', gpu: '0000:04:01' })]);
  });

  it('sends an adapter failure found at start only when it follows the last boot', async () => {
    const log = join(dir, 'kern.log');
    writeFileSync(log, RM_INIT + BOOT);
    const before = testContext({ kmsg: log });
    collector = createKernelLogCollector(before, { followIntervalMs: 20 });
    await collector.start();
    expect(seriesValue(await before.registry.metrics(), RM_INIT_SERIES)).toBe(1);
    expect(before.events).toEqual([]);
    await collector.close();

    writeFileSync(log, BOOT + RM_INIT);
    const after = testContext({ kmsg: log });
    collector = createKernelLogCollector(after, { followIntervalMs: 20 });
    await collector.start();
    expect(after.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:04:01' })]);
  });

  it('counts an AER report as soon as its lines are read, its detail lines not again when they come in a later read', async () => {
    const block =
      readFileSync(join(HOST_LOGS, 'aer_reports_from_public_reports.txt'), 'utf8')
        .split('### ')
        .find((text) => text.includes('kwizart')) ?? '';
    const [headline = '', ...rest] = block
      .split('\n')
      .slice(1)
      .filter((line) => line !== '');
    const series = 'steadfast_pcie_aer_errors_total{pci_address="0000:01:00.0",severity="uncorrected_nonfatal"}';
    const log = join(dir, 'kern.log');
    writeFileSync(log, BOOT);
    const context = testContext({ kmsg: log });
    collector = createKernelLogCollector(context, { followIntervalMs: 20 });
    await collector.start();
    appendFileSync(log, `${headline}\n`);
    await waitFor(async () => seriesValue(await context.registry.metrics(), series) === 1);
    appendFileSync(log, `${rest.join('\n')}\n`);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(seriesValue(await context.registry.metrics(), series)).toBe(1);
  });

  it('counts each host event kind of the new samples once per event', async () => {
    const context = testContext({ kmsg: join(HOST_LOGS, 'oom_soft-lockup_kmsg-record_from_public_reports.txt') });
    collector = createKernelLogCollector(context);
    const text = await scrapeOne(context, collector);
    expect(seriesValue(text, 'steadfast_kernel_events_total{kind="oom_kill"}')).toBe(6);
    expect(seriesValue(text, 'steadfast_kernel_events_total{kind="soft_lockup"}')).toBe(2);
  });
});
