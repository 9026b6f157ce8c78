import { copyFileSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { createGpuCollector } from '../../../../agent/collectors/gpu/collector.js';
import { EXPECTED, FIXTURES, NVIDIA_SMI_XML, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor } from '../../helpers.js';

const TWO_GPUS = join(FIXTURES, 'exporters', 'two-gpus.xml');
const ONE_GPU = join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml');
const GPU1_PRESENT = 'steadfast_gpu_present{gpu="1",pci_bus_id="0000:00:1f",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e95"}';
const GPU0_PRESENT = 'steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"}';
/** Fast enough for a test, slow enough not to burn the shared CPUs. */
const POLL_SECONDS = 0.05;

let dir: string;
let collector: Collector | undefined;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-gpu-'));
});

afterEach(async () => {
  await collector?.close();
  collector = undefined;
  rmSync(dir, { recursive: true, force: true });
});

describe('gpu collector', () => {
  it('turns a GPU that vanishes from nvidia-smi into present 0 and sends one gpu_lost fast-path event per disappearance', async () => {
    const xml = join(dir, 'nvidia-smi.xml');
    copyFileSync(TWO_GPUS, xml);
    const context = testContext({ nvidiaSmiXml: xml }, POLL_SECONDS);
    collector = createGpuCollector(context);
    await collector.start();
    let text = await context.registry.metrics();
    expect(seriesValue(text, GPU1_PRESENT)).toBe(1);
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(2);
    expect(
      seriesValue(
        text,
        'steadfast_gpu_remapped_rows_total{gpu="1",pci_bus_id="0000:00:1f",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e95",type="correctable"}',
      ),
    ).toBe(3);

    copyFileSync(ONE_GPU, xml);
    await waitFor(async () => seriesValue(await context.registry.metrics(), GPU1_PRESENT) === 0);
    // A few more polls with the GPU still gone must not repeat the event.
    await new Promise((resolve) => setTimeout(resolve, POLL_SECONDS * 1000 * 4));
    text = await context.registry.metrics();
    expect(seriesValue(text, GPU0_PRESENT)).toBe(1);
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(1);
    // The lost GPU keeps only its presence series; its readings are gone, not frozen.
    expect(
      seriesValue(text, 'steadfast_gpu_temperature_celsius{gpu="1",pci_bus_id="0000:00:1f",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e95"}'),
    ).toBeUndefined();
    expect(context.events).toEqual([
      expect.objectContaining({ kind: 'gpu_lost', node: 'node-1', gpu: '0000:00:1f', message: expect.stringContaining('no longer listed') }),
    ]);
    await expect(collector.update()).resolves.toBeUndefined();

    copyFileSync(TWO_GPUS, xml);
    await waitFor(async () => seriesValue(await context.registry.metrics(), GPU1_PRESENT) === 1);
    copyFileSync(ONE_GPU, xml);
    await waitFor(() => context.events.length === 2);
    expect(context.events[1]).toMatchObject({ kind: 'gpu_lost', gpu: '0000:00:1f' });
  });

  it('fails update while the file cannot be parsed, keeps the last values, and recovers when it can', async () => {
    const xml = join(dir, 'nvidia-smi.xml');
    copyFileSync(ONE_GPU, xml);
    const context = testContext({ nvidiaSmiXml: xml }, POLL_SECONDS);
    collector = createGpuCollector(context);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();

    writeFileSync(xml, '<nvidia_smi_log><gpu id="00000000:00:1E.0">');
    await waitFor(() =>
      collector!.update().then(
        () => false,
        () => true,
      ),
    );
    await expect(collector.update()).rejects.toThrow(/incomplete/);
    // A half-written file is not a lost GPU.
    expect(seriesValue(await context.registry.metrics(), GPU0_PRESENT)).toBe(1);
    expect(context.events).toEqual([]);

    copyFileSync(ONE_GPU, xml);
    await waitFor(() =>
      collector!.update().then(
        () => true,
        () => false,
      ),
    );
  });

  it('computes steadfast_gpu_poll_age_seconds at scrape time, so the age grows between polls while the timestamp stays put', async () => {
    const context = testContext({ nvidiaSmiXml: ONE_GPU }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    const first = await context.registry.metrics();
    await new Promise((resolve) => setTimeout(resolve, 300));
    const second = await context.registry.metrics();
    const polledAt = seriesValue(first, 'steadfast_gpu_last_poll_timestamp_seconds');
    expect(seriesValue(second, 'steadfast_gpu_last_poll_timestamp_seconds')).toBe(polledAt);
    const firstAge = seriesValue(first, 'steadfast_gpu_poll_age_seconds') ?? Number.NaN;
    const secondAge = seriesValue(second, 'steadfast_gpu_poll_age_seconds') ?? Number.NaN;
    expect(firstAge).toBeGreaterThanOrEqual(0);
    expect(firstAge).toBeLessThan(5);
    expect(secondAge - firstAge).toBeGreaterThanOrEqual(0.25);
  });

  it('exports clocks in Hz and throttle reasons as 1/0 from nvidia-smi', async () => {
    const context = testContext({ nvidiaSmiXml: ONE_GPU }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_gpu_clock_hertz{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",clock="memory"}')).toBe(
      405e6,
    );
    expect(seriesValue(text, 'steadfast_gpu_clock_max_hertz{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",clock="sm"}')).toBe(
      1710e6,
    );
    expect(
      seriesValue(text, 'steadfast_gpu_throttle_reason{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",reason="gpu_idle"}'),
    ).toBe(1);
    expect(
      seriesValue(text, 'steadfast_gpu_throttle_reason{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",reason="hw_slowdown"}'),
    ).toBe(0);
  });

  it('reports failure, and no GPU series, while the captured file does not exist', async () => {
    const context = testContext({ nvidiaSmiXml: join(dir, 'missing.xml') }, POLL_SECONDS);
    collector = createGpuCollector(context);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/cannot read nvidia-smi/);
    const text = await context.registry.metrics();
    // Only the count of the failed query itself, and which source was chosen.
    expect(text).not.toMatch(/^steadfast_gpu_(?!query_failures_total|poll_age_seconds|source_info)\w+[{ ]/m);
    // The age counts from the start of polling: nothing was ever read.
    expect(seriesValue(text, 'steadfast_gpu_poll_age_seconds')).toBeGreaterThanOrEqual(0);
    expect(seriesValue(text, 'steadfast_gpu_query_failures_total{command="nvidia-smi -q -x",reason="error"}')).toBe(1);
  });

  it('runs the nvidia-smi binary with -q -x when no captured file is given', async () => {
    const context = testContext({ nvidiaSmi: join(FIXTURES, 'exporters', 'fake-nvidia-smi.sh') }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_attached')).toBe(2);
  });

  it('gives up on an nvidia-smi that hangs, after the command timeout, and reports failure', async () => {
    const context = testContext({ nvidiaSmi: join(FIXTURES, 'exporters', 'hanging-nvidia-smi.sh') }, 60);
    collector = createGpuCollector(context, { commandTimeoutMs: 200 });
    const started = Date.now();
    await collector.start();
    expect(Date.now() - started).toBeLessThan(5000);
    await expect(collector.update()).rejects.toThrow(/cannot read nvidia-smi/);
    // A hang is a signal: counted as a timeout, which SteadfastGpuQueryStuck alerts on.
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_query_failures_total{command="nvidia-smi -q -x",reason="timeout"}')).toBe(1);
  });

  it('reports failure when the nvidia-smi binary does not exist', async () => {
    const context = testContext({ nvidiaSmi: join(dir, 'no-such-nvidia-smi') }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/ENOENT/);
  });
});

describe('gpu collector exposition', () => {
  const xmlFiles = readdirSync(NVIDIA_SMI_XML).filter((name) => name.endsWith('.xml'));

  it.each(xmlFiles)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({ nvidiaSmiXml: join(NVIDIA_SMI_XML, name) });
    collector = createGpuCollector(context);
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'gpu', name.replace(/\.xml$/, '.prom')), text);
  });
});
