import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import type { CollectorSettings } from '../../../../agent/flags.js';
import { createAgent } from '../../../../agent/agent.js';
import { createGpuCollector, gpuCollectorFactory } from '../../../../agent/collectors/gpu/collector.js';
import { createNvlinkCollector, nvlinkCollectorFactory } from '../../../../agent/collectors/nvlink.js';
import { silentLogger } from '../../../../core/log.js';
import { GpuProcessBoard } from '../../../../agent/gpu-processes.js';
import { GpuSourceChoice } from '../../../../agent/gpu-source.js';
import { StandInNvml } from '../../../../tryit/nvml/stand-in.js';
import {
  FIXTURES,
  NVIDIA_SMI_XML,
  normaliseExposition,
  scrapeOne,
  seriesValue,
  tempDirPerTest,
  testContext,
  waitFor,
  type TestContext,
} from '../../helpers.js';

/**
 * The gpu collector reading NVML through koffi, against the stand-in libnvidia-ml.so.1
 * (tryit/nvml/stand-in.c): dlopen, calls on worker threads, structs and out-parameters all run for
 * real. Its states in test/fixtures/nvml/ are real nvidia-smi captures written out as NVML
 * answers them, so the two paths are held against each other on the same GPU.
 */

const STATES = join(FIXTURES, 'nvml');
const POLL_SECONDS = 0.05;
const dir = tempDirPerTest('steadfast-nvml-');
let collectors: Collector[] = [];

afterEach(async () => {
  await Promise.all(collectors.map((collector) => collector.close()));
  collectors = [];
});

function state(name: string): string {
  return readFileSync(join(STATES, name), 'utf8');
}

function nvmlSettings(standIn: StandInNvml): CollectorSettings {
  return { 'gpu.source': 'nvml', 'gpu.nvml-library': standIn.library };
}

function gpu(context: TestContext, options: Parameters<typeof createGpuCollector>[1] = {}): Collector {
  const collector = createGpuCollector(context, options);
  collectors.push(collector);
  return collector;
}

/** One scrape of a lone gpu collector, without what says which source it used and how (NVML's entry points, its events). */
async function scrapeGpu(context: TestContext): Promise<string> {
  const text = await scrapeOne(context, gpu(context));
  return text
    .split('\n')
    .filter((line) => !/steadfast_gpu_(source_info|nvml_function_info|nvml_events_up)/.test(line))
    .join('\n')
    .replace(/\n{3,}/g, '\n\n');
}

const H200 = 'steadfast_gpu_temperature_celsius{gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"}';
const H200_LABELS = 'gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"';

describe('gpu collector on NVML', () => {
  for (const [stateFile, xml] of [
    ['h200_580.159.04.state', 'h200_580.159.04_v13.xml'],
    ['a10g_515.105.01.state', 'telegraf_a10g_515.105.01.xml'],
    // MIG on: volatile counters per MIG device, aggregate SRAM/DRAM for the GPU (by architecture, not a probe).
    ['a100-mig_510.47.03.state', 'netdata_a100-sxm4-40gb-mig_510.47.03_v11.xml'],
    // Pascal: ECC per memory unit.
    ['p100_510.47.03.state', 'netdata_tesla-p100_510.47.03.xml'],
  ] as const) {
    it(`exports through NVML exactly the series nvidia-smi's XML gives for the same GPU (${xml})`, async () => {
      const standIn = await StandInNvml.create(join(dir(), 'nvml'), state(stateFile));
      const viaNvml = await scrapeGpu(testContext({}, 60, nvmlSettings(standIn)));
      const viaXml = await scrapeGpu(testContext({ nvidiaSmiXml: join(NVIDIA_SMI_XML, xml) }, 60));
      expect(viaNvml).toContain('steadfast_gpu_throttle_reason{');
      expect(normaliseExposition(viaNvml)).toBe(normaliseExposition(viaXml));
    });
  }

  it('says which source it reads, and auto falls back to nvidia-smi where the library does not load', async () => {
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), state('h200_580.159.04.state'));
    const nvml = testContext({}, 60, nvmlSettings(standIn));
    const text = await scrapeOne(nvml, gpu(nvml));
    expect(seriesValue(text, 'steadfast_gpu_source_info{source="nvml"}')).toBe(1);
    const auto = testContext({ nvidiaSmiXml: undefined, nvidiaSmi: 'nvidia-smi' }, 60, { 'gpu.nvml-library': join(dir(), 'missing', 'libnvidia-ml.so.1') });
    const fallback = await scrapeOne(auto, gpu(auto));
    expect(seriesValue(fallback, 'steadfast_gpu_source_info{source="nvidia-smi"}')).toBe(1);
  });

  it('fails every poll, saying why, when --gpu.source=nvml names a library that does not load or is not NVML', async () => {
    for (const [library, reason] of [
      [join(dir(), 'missing.so'), /cannot load .*missing\.so/],
      ['libc.so.6', /not an NVIDIA management library/],
    ] as const) {
      const context = testContext({}, 60, { 'gpu.source': 'nvml', 'gpu.nvml-library': library });
      const collector = gpu(context);
      const text = await scrapeOne(context, collector);
      await expect(collector.update()).rejects.toThrow(reason);
      expect(seriesValue(text, 'steadfast_gpu_query_failures_total{command="nvml",reason="error"}')).toBe(1);
      expect(seriesValue(text, 'steadfast_collector_success{collector="gpu"}')).toBe(0);
    }
  });

  it('rejects an unknown source and dcgm-exporter without its URL, naming the flag', () => {
    expect(() => new GpuSourceChoice(testContext({}, 60, { 'gpu.source': 'gpud' }))).toThrow(
      /--gpu\.source: must be one of auto, nvml, nvidia-smi, dcgm-exporter, got "gpud"/,
    );
    expect(() => new GpuSourceChoice(testContext({}, 60, { 'gpu.source': 'dcgm-exporter' }))).toThrow(/needs --gpu\.dcgm-exporter-url/);
  });

  it('lists the GPU processes with their names, merged C+G, and hands them to the process board', async () => {
    const standIn = await StandInNvml.create(
      join(dir(), 'nvml'),
      `${state('h200_580.159.04.state')}0 proc.compute 4242 2147483648\n0 proc.compute 4243 1073741824\n0 proc.graphics 4243 1073741824\nprocname.4242 /usr/bin/python3\n`,
    );
    const board = new GpuProcessBoard();
    const context = { ...testContext({}, 60, nvmlSettings(standIn)), gpuProcesses: board };
    const text = await scrapeOne(context, gpu(context));
    expect(seriesValue(text, `steadfast_gpu_process_info{${H200_LABELS},pid="4242",type="C",name="/usr/bin/python3"}`)).toBe(1);
    // No name for 4243 (NVML_ERROR_NOT_FOUND): the series has an empty name, as nvidia-smi's list would lack it.
    expect(seriesValue(text, `steadfast_gpu_process_info{${H200_LABELS},pid="4243",type="C+G",name=""}`)).toBe(1);
    expect(seriesValue(text, `steadfast_gpu_process_used_memory_bytes{${H200_LABELS},pid="4242"}`)).toBe(2147483648);
    expect(board.gpusOf(4242)).toEqual([expect.objectContaining({ gpu: '0', pciBusId: '0000:00:06', type: 'C' })]);
    expect([...board.computePids()].sort()).toEqual([4242, 4243]);
  });

  it('counts a call that fails and leaves its value out; a GPU whose handle is lost shows as not present and goes on the fast path', async () => {
    const twoGpus = `${state('h200_580.159.04.state').replace('gpus 1', 'gpus 2')}1 pci 00000000:00:07.0\n1 minor 1\n1 uuid GPU-11111111-0000-0000-0000-000000000000\n1 temp 40\n`;
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), `${twoGpus}0 fail.power 999\n`);
    const context = testContext({}, POLL_SECONDS, nvmlSettings(standIn));
    const collector = gpu(context);
    const text = await scrapeOne(context, collector);
    expect(seriesValue(text, H200)).toBe(37);
    expect(seriesValue(text, `steadfast_gpu_power_watts{${H200_LABELS}}`)).toBeUndefined();
    expect(seriesValue(text, 'steadfast_gpu_nvml_errors_total{function="nvmlDeviceGetPowerUsage",error="unknown"}')).toBeGreaterThanOrEqual(1);
    // A value the GPU does not support is not an error.
    expect(text).not.toMatch(/steadfast_gpu_nvml_errors_total\{function="nvmlDeviceGetRetiredPages"/);
    await expect(collector.update()).resolves.toBeUndefined();

    await standIn.setState(`${twoGpus}1 fail.handle 15\n`);
    const gpu1 = 'steadfast_gpu_present{gpu="1",pci_bus_id="0000:00:07",UUID="GPU-11111111-0000-0000-0000-000000000000"}';
    await waitFor(async () => seriesValue(await context.registry.metrics(), gpu1) === 0);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:00:07', message: expect.stringContaining('NVML') })]);
    const after = await context.registry.metrics();
    expect(seriesValue(after, 'steadfast_gpu_nvml_errors_total{function="nvmlDeviceGetHandleByIndex_v2",error="gpu_is_lost"}')).toBeGreaterThanOrEqual(1);
  });

  it('retries nvmlInit_v2 at every poll until the driver is loaded', async () => {
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), `${state('h200_580.159.04.state')}fail.init 9\n`);
    const context = testContext({}, POLL_SECONDS, nvmlSettings(standIn));
    const collector = gpu(context);
    await scrapeOne(context, collector);
    await expect(collector.update()).rejects.toThrow(/nvmlInit_v2 returned 9 \(Driver Not Loaded\)/);
    await standIn.setState(state('h200_580.159.04.state'));
    await waitFor(async () => seriesValue(await context.registry.metrics(), H200) === 37);
    await expect(collector.update()).resolves.toBeUndefined();
  });

  it('counts a call stuck in the driver as a timed-out poll, queues nothing behind it, and reads again once it returns', async () => {
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), state('h200_580.159.04.state'));
    const context = testContext({}, POLL_SECONDS, nvmlSettings(standIn));
    const collector = gpu(context, { nvmlTimeoutMs: 300 });
    await scrapeOne(context, collector);
    await standIn.setState(`${state('h200_580.159.04.state').replace('0 temp 37', '0 temp 38')}0 hang.temp 1\n`);
    const timeouts = 'steadfast_gpu_query_failures_total{command="nvml",reason="timeout"}';
    await waitFor(async () => (seriesValue(await context.registry.metrics(), timeouts) ?? 0) >= 3, 10_000);
    await expect(collector.update()).rejects.toThrow(/nvmlDeviceGetTemperature/);
    // The last good values stay exported while the driver hangs.
    expect(seriesValue(await context.registry.metrics(), H200)).toBe(37);
    await standIn.release();
    await waitFor(async () => seriesValue(await context.registry.metrics(), H200) === 38, 10_000);
  });

  it('reads the NVLink counters of the active links through NVML when the GPUs are read through it', async () => {
    const links = [
      '0 nvlink.0 1',
      '0 nvlink.0.0 2353',
      '0 nvlink.0.1 0',
      '0 nvlink.0.2 65535',
      '0 nvlink.1 0',
      '0 nvlink.2 1',
      '0 nvlink.2.0 0',
      '0 nvlink.2.1 1',
      '0 nvlink.2.2 0',
    ];
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), `${state('h200_580.159.04.state')}${links.join('\n')}\n`);
    const context = testContext({}, 60, nvmlSettings(standIn));
    const collector = createNvlinkCollector(context);
    collectors.push(collector);
    const text = await scrapeOne(context, collector);
    const uuid = 'GPU-00000000-0000-0000-0000-000000000000';
    expect(seriesValue(text, `steadfast_gpu_nvlink_errors_total{gpu="0",UUID="${uuid}",link="0",type="replay"}`)).toBe(2353);
    expect(seriesValue(text, `steadfast_gpu_nvlink_errors_total{gpu="0",UUID="${uuid}",link="0",type="crc"}`)).toBe(65535);
    expect(seriesValue(text, `steadfast_gpu_nvlink_errors_total{gpu="0",UUID="${uuid}",link="2",type="recovery"}`)).toBe(1);
    // Link 1 is down: no counters, as nvidia-smi lists only the active links' counts.
    expect(text).not.toContain('link="1"');
  });

  it('keeps answering /metrics while an NVML call hangs in the driver, then exports the GPU once it returns', async () => {
    const standIn = await StandInNvml.create(join(dir(), 'nvml'), `${state('h200_580.159.04.state')}0 hang.temp 1\n`);
    const agent = createAgent({
      node: 'node-1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: 'nvidia-smi' },
      pollIntervalSeconds: POLL_SECONDS,
      collectors: [gpuCollectorFactory, nvlinkCollectorFactory],
      settings: nvmlSettings(standIn),
      logger: silentLogger(),
    });
    try {
      const { port } = await agent.start();
      const scrape = async (): Promise<string> => (await fetch(`http://127.0.0.1:${port}/metrics`, { signal: AbortSignal.timeout(5_000) })).text();
      for (let attempt = 0; attempt < 3; attempt++) {
        const text = await scrape();
        expect(seriesValue(text, 'steadfast_gpu_poll_age_seconds')).toBeGreaterThanOrEqual(0);
        expect(seriesValue(text, H200)).toBeUndefined();
      }
      await standIn.release();
      await waitFor(async () => seriesValue(await scrape(), H200) === 37, 10_000);
    } finally {
      await agent.close();
    }
  });
});
