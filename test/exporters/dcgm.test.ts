import { readdirSync, readFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { InputError } from '../../core/errors.js';
import { CollectorSet, type Collector } from '../../exporters/collector.js';
import { parseDcgmExporterText, parseExpositionText, type DcgmGpuSample } from '../../exporters/sources/dcgm-exporter.js';
import { createGpuCollector, gpuCollectorFactory } from '../../exporters/collectors/gpu.js';
import { EXPECTED, REALWORLD, expectedText, normaliseExposition, promtoolCheckMetrics, seriesValue, testContext, waitFor } from './helpers.js';

const DCGM_SAMPLES = join(REALWORLD, 'dcgm-exporter');
const PROM_FILES = readdirSync(DCGM_SAMPLES).filter((name) => name.endsWith('.prom'));
const MiB = 1024 ** 2;
const MHz = 1e6;
const URL_FLAG = 'gpu.dcgm-exporter-url';
const POLL_SECONDS = 0.05;

function sample(name: string): string {
  return readFileSync(join(DCGM_SAMPLES, name), 'utf8');
}

function onlyGpu(name: string): DcgmGpuSample {
  const report = parseDcgmExporterText(sample(name));
  expect(report.gpus).toHaveLength(1);
  return report.gpus[0] as DcgmGpuSample;
}

/** A stand-in dcgm-exporter: serves whatever `reply` holds at the time of each request. */
interface FakeExporter {
  readonly url: string;
  reply: { status: number; body: string };
  requests: number;
}

const servers: Server[] = [];
const open: Collector[] = [];

afterEach(async () => {
  await Promise.all(open.splice(0).map((collector) => collector.close()));
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

async function fakeExporter(body: string, status = 200): Promise<FakeExporter> {
  const server = createServer();
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const exporter: FakeExporter = { url: `http://127.0.0.1:${port}/metrics`, reply: { status, body }, requests: 0 };
  server.on('request', (_request, response) => {
    exporter.requests += 1;
    response.writeHead(exporter.reply.status, { 'content-type': 'text/plain; version=0.0.4' });
    response.end(exporter.reply.body);
  });
  return exporter;
}

function dcgmCollector(url: string, pollIntervalSeconds = 5): { context: ReturnType<typeof testContext>; collector: Collector } {
  const context = testContext({ nvidiaSmi: '/nonexistent/nvidia-smi' }, pollIntervalSeconds, { [URL_FLAG]: url });
  const collector = createGpuCollector(context);
  open.push(collector);
  return { context, collector };
}

const L4_SERIES = '{gpu="0",pci_bus_id="0000:31:00"}';

describe('Prometheus text parser', () => {
  it('reads names, labels with every escape, values of every spelling and optional timestamps', () => {
    const text = [
      '# HELP up Whether it is up.',
      '# TYPE up gauge',
      'up 1',
      'a{x="quote \\" backslash \\\\ newline \\n end",y="",} -1.5e3 1700000000000',
      'b{ x = "1" , y="2" } +Inf',
      'c NaN',
      'd{} 0.000131\r',
      '',
      '# just a comment',
    ].join('\n');
    const parsed = parseExpositionText(text);
    expect(parsed.errors).toEqual([]);
    expect(parsed.types.get('up')).toBe('gauge');
    expect(parsed.samples).toEqual([
      { name: 'up', labels: {}, value: 1, timestampMs: undefined },
      { name: 'a', labels: { x: 'quote " backslash \\ newline \n end', y: '' }, value: -1500, timestampMs: 1700000000000 },
      { name: 'b', labels: { x: '1', y: '2' }, value: Number.POSITIVE_INFINITY, timestampMs: undefined },
      { name: 'c', labels: {}, value: Number.NaN, timestampMs: undefined },
      { name: 'd', labels: {}, value: 0.000131, timestampMs: undefined },
    ]);
  });

  it('skips each malformed line with its line number and keeps the good lines around it', () => {
    const parsed = parseExpositionText(
      ['good 1', 'bad{x="unterminated} 1', 'bad{x="1"}1', 'bad{x="1",x="2"} 1', 'bad 1 2 3', 'bad one', 'bad{x="\\q"} 1', '9bad 1', 'also_good{a="b"} 2'].join('\n'),
    );
    expect(parsed.samples.map((line) => line.name)).toEqual(['good', 'also_good']);
    expect(parsed.errors.map((error) => error.line)).toEqual([2, 3, 4, 5, 6, 7, 8]);
    expect(parsed.errorCount).toBe(7);
  });

  it('keeps only the first twenty errors of a body that is all garbage, but counts them all', () => {
    const parsed = parseExpositionText('<html>\n'.repeat(1000));
    expect(parsed.errors).toHaveLength(20);
    expect(parsed.errorCount).toBe(1000);
    expect(parsed.samples).toEqual([]);
  });

  it('never throws and always terminates, whatever the input', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 400 }), (input) => {
        const parsed = parseExpositionText(input);
        expect(parsed.samples.length + parsed.errorCount).toBeLessThanOrEqual(input.split('\n').length);
        parseDcgmExporterText(input);
      }),
      { numRuns: 200 },
    );
  });

  it('never throws on exposition-shaped lines built from the tokens the format uses', () => {
    const token = fc.constantFrom('DCGM_FI_DEV_GPU_TEMP', 'gpu', 'pci_bus_id', '{', '}', '=', '"', '\\', ',', ' ', '\t', '0', '1e9', 'NaN', '-Inf', '#', 'TYPE', '\n', '0000:3b:00.0');
    fc.assert(
      fc.property(fc.array(fc.oneof(token, fc.string({ maxLength: 4 })), { maxLength: 80 }), (tokens) => {
        const report = parseDcgmExporterText(tokens.join(''));
        expect(Array.isArray(report.gpus)).toBe(true);
      }),
      { numRuns: 300 },
    );
  });
});

describe('dcgm-exporter samples', () => {
  it('finds the six captured scrapes the README lists', () => {
    expect(PROM_FILES).toHaveLength(6);
  });

  it.each(PROM_FILES)('parses every line of %s', (name) => {
    const parsed = parseExpositionText(sample(name));
    expect(parsed.errors).toEqual([]);
    expect(parsed.samples.length).toBeGreaterThan(0);
  });

  it('maps the L4 full scrape onto the same fields nvidia-smi gives, in base units', () => {
    expect(onlyGpu('kops_L4_580.105.08_full-scrape.prom')).toEqual({
      index: 0,
      pciBusId: '0000:31:00',
      uuid: 'GPU-c2f76b33-7953-256e-8f33-1343419b1a1c',
      productName: 'NVIDIA L4',
      driverVersion: '580.105.08',
      temperatureCelsius: 31,
      // The L4 has no memory temperature sensor: DCGM reads 0, which is no reading.
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: 16.365,
      powerLimitWatts: undefined,
      utilizationRatio: 0,
      memoryUsedBytes: 0,
      memoryTotalBytes: (0 + 22563 + 470) * MiB,
      ecc: [],
      remappedRows: { correctable: 0, uncorrectable: 0, pending: undefined, failure: false },
      retiredPages: undefined,
      pcieLinkGeneration: undefined,
      pcieLinkWidth: undefined,
      pcieReplayErrors: 0,
      clocks: { sm: 210 * MHz, memory: 405 * MHz, video: undefined },
      maxClocks: undefined,
      throttleReasons: undefined,
      lastXid: undefined,
    });
  });

  it('maps the L40S scrape, adding the reserved frame buffer to the total', () => {
    expect(onlyGpu('upcloud_L40S_595.58.03_scrape.prom')).toMatchObject({
      pciBusId: '0000:00:07',
      productName: 'NVIDIA L40S',
      driverVersion: '595.58.03',
      temperatureCelsius: 32,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: 35.686,
      memoryUsedBytes: 0,
      memoryTotalBytes: (0 + 45459 + 608) * MiB,
      remappedRows: { correctable: 0, uncorrectable: 0, failure: false },
      clocks: { sm: 210 * MHz, memory: 405 * MHz },
    });
  });

  it('maps the T4 under load: utilisation as a ratio, clocks in Hz, and no HELP lines needed', () => {
    expect(onlyGpu('ericsson_T4_590.48.01_no-help-lines.prom')).toMatchObject({
      pciBusId: '0000:37:00',
      uuid: 'GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a',
      productName: 'Tesla T4',
      temperatureCelsius: 74,
      powerDrawWatts: 68.244,
      utilizationRatio: 0.91,
      memoryUsedBytes: 5120 * MiB,
      memoryTotalBytes: (5120 + 9791 + 447) * MiB,
      pcieReplayErrors: 0,
      clocks: { sm: 660 * MHz, memory: 5000 * MHz },
      // The T4 scrape has no remapped-row fields at all (pre-Ampere): absent, not zero.
      remappedRows: undefined,
    });
  });

  it.each([
    ['vks_GRID-A100-10C-vGPU_580.126.09_scrape.prom', 'GRID A100-10C', 9323 + 916],
    ['vks_GRID-A100-40C-vGPU_580.126.09_scrape.prom', 'GRID A100-40C', 37739 + 3220],
  ])('maps the vGPU scrape %s, which has no temperature or power fields, to no such readings', (name, model, totalMiB) => {
    expect(onlyGpu(name)).toMatchObject({
      pciBusId: '0000:03:00',
      productName: model,
      driverVersion: '580.126.09',
      temperatureCelsius: undefined,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: undefined,
      utilizationRatio: 0,
      memoryUsedBytes: 0,
      memoryTotalBytes: totalMiB * MiB,
      clocks: { sm: 1410 * MHz, memory: 1215 * MHz },
    });
  });

  it('places the GB200 GPUs by their non-zero PCI domains and counts the old-label-set series it cannot place', () => {
    const report = parseDcgmExporterText(sample('dcgm_excerpts_from_public_issues.prom'));
    expect(report.gpus.map((gpu) => [gpu.index, gpu.pciBusId])).toEqual([
      [0, '0008:01:00'],
      [1, '0009:01:00'],
      [2, '0018:01:00'],
      [3, '0019:01:00'],
    ]);
    // V100, A30 MIG, A800 and T400 excerpts predate the pci_bus_id label.
    expect(report.unidentifiedSeries).toBe(20);
  });
});

describe('dcgm field mapping', () => {
  const gpu = (series: string): string => `gpu="2",UUID="GPU-x",pci_bus_id="00000000:3B:00.0",modelName="NVIDIA H100 80GB HBM3"${series}`;

  it('maps ECC totals, retired pages, row remap state, PCIe link, power limit, max clocks, throttle bitmask and the last Xid', () => {
    const lines = [
      ['DCGM_FI_DEV_ECC_SBE_VOL_TOTAL', 5],
      ['DCGM_FI_DEV_ECC_DBE_VOL_TOTAL', 1],
      ['DCGM_FI_DEV_ECC_SBE_AGG_TOTAL', 50],
      ['DCGM_FI_DEV_ECC_DBE_AGG_TOTAL', 2],
      ['DCGM_FI_DEV_RETIRED_SBE', 3],
      ['DCGM_FI_DEV_RETIRED_DBE', 4],
      ['DCGM_FI_DEV_RETIRED_PENDING', 2],
      ['DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS', 7],
      ['DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS', 1],
      ['DCGM_FI_DEV_ROW_REMAP_PENDING', 1],
      ['DCGM_FI_DEV_ROW_REMAP_FAILURE', 0],
      ['DCGM_FI_DEV_PCIE_LINK_GEN', 5],
      ['DCGM_FI_DEV_PCIE_LINK_WIDTH', 16],
      ['DCGM_FI_DEV_POWER_MGMT_LIMIT', 700],
      ['DCGM_FI_DEV_MAX_SM_CLOCK', 1980],
      ['DCGM_FI_DEV_MAX_MEM_CLOCK', 2619],
      ['DCGM_FI_DEV_VIDEO_CLOCK', 1755],
      // sw_power_cap (0x4) | sw_thermal_slowdown (0x20)
      ['DCGM_FI_DEV_CLOCK_THROTTLE_REASONS', 0x24],
      ['DCGM_FI_DEV_XID_ERRORS', 79],
      ['DCGM_FI_DEV_MEMORY_TEMP', 41],
      ['DCGM_FI_DEV_FB_TOTAL', 81559],
      ['DCGM_FI_DEV_FB_USED', 100],
      ['DCGM_FI_DEV_FB_FREE', 80000],
    ] as const;
    const report = parseDcgmExporterText(lines.map(([field, value]) => `${field}{${gpu('')}} ${value}`).join('\n'));
    expect(report.gpus[0]).toMatchObject({
      index: 2,
      pciBusId: '0000:3b:00',
      ecc: [
        { scope: 'volatile', type: 'correctable', location: 'total', count: 5 },
        { scope: 'volatile', type: 'uncorrectable', location: 'total', count: 1 },
        { scope: 'aggregate', type: 'correctable', location: 'total', count: 50 },
        { scope: 'aggregate', type: 'uncorrectable', location: 'total', count: 2 },
      ],
      retiredPages: { singleBit: 3, doubleBit: 4, pending: true },
      remappedRows: { correctable: 7, uncorrectable: 1, pending: true, failure: false },
      pcieLinkGeneration: 5,
      pcieLinkWidth: 16,
      powerLimitWatts: 700,
      memoryTemperatureCelsius: 41,
      // DCGM_FI_DEV_FB_TOTAL, when exported, wins over used + free.
      memoryTotalBytes: 81559 * MiB,
      clocks: { video: 1755 * MHz },
      maxClocks: { sm: 1980 * MHz, memory: 2619 * MHz },
      throttleReasons: {
        gpu_idle: false,
        applications_clocks_setting: false,
        sw_power_cap: true,
        hw_slowdown: false,
        sync_boost: false,
        sw_thermal_slowdown: true,
        hw_thermal_slowdown: false,
        hw_power_brake_slowdown: false,
        display_clocks_setting: false,
      },
      lastXid: 79,
    });
  });

  it('treats DCGM blank sentinels and negative or non-finite values as no reading', () => {
    const report = parseDcgmExporterText(
      [
        `DCGM_FI_DEV_MEMORY_TEMP{${gpu('')}} 9223372036854775794`,
        `DCGM_FI_DEV_POWER_USAGE{${gpu('')}} 140737488355330.000000`,
        `DCGM_FI_DEV_GPU_TEMP{${gpu('')}} NaN`,
        `DCGM_FI_DEV_GPU_UTIL{${gpu('')}} -1`,
      ].join('\n'),
    );
    expect(report.gpus[0]).toMatchObject({ memoryTemperatureCelsius: undefined, powerDrawWatts: undefined, temperatureCelsius: undefined, utilizationRatio: undefined });
  });

  it('under MIG takes device-wide fields from any GPU-instance series but the frame buffer only from the whole GPU', () => {
    const report = parseDcgmExporterText(
      [
        `DCGM_FI_DEV_SM_CLOCK{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 1410`,
        `DCGM_FI_DEV_SM_CLOCK{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="5"')}} 1410`,
        `DCGM_FI_DEV_FB_USED{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 1000`,
        `DCGM_FI_DEV_FB_FREE{${gpu(',GPU_I_PROFILE="2g.20gb",GPU_I_ID="3"')}} 19000`,
      ].join('\n'),
    );
    expect(report.gpus).toHaveLength(1);
    expect(report.gpus[0]).toMatchObject({ clocks: { sm: 1410 * MHz }, memoryUsedBytes: undefined, memoryTotalBytes: undefined });
  });

  it('leaves out series that are not per GPU (no gpu label), such as NVSwitch and CPU families', () => {
    const report = parseDcgmExporterText('DCGM_FI_DEV_NVSWITCH_TEMPERATURE_CURRENT{nvswitch="0"} 40\nDCGM_FI_DEV_CPU_TEMP_CURRENT{cpu="0"} 50\n');
    expect(report).toMatchObject({ gpus: [], unidentifiedSeries: 0 });
  });
});

describe('gpu collector on dcgm-exporter', () => {
  it('declares --gpu.dcgm-exporter-url and refuses a value that is not an http(s) URL, naming the flag', () => {
    expect(gpuCollectorFactory.flags?.map((flag) => flag.name)).toContain(URL_FLAG);
    for (const bad of ['localhost:9400', 'file:///etc/passwd', '']) {
      const context = testContext({}, 5, { [URL_FLAG]: bad });
      expect(() => createGpuCollector(context)).toThrow(InputError);
      expect(() => createGpuCollector(context)).toThrow(/--gpu\.dcgm-exporter-url/);
    }
  });

  it('polls the endpoint instead of running nvidia-smi and exports the mapped L4 values', async () => {
    const exporter = await fakeExporter(sample('kops_L4_580.105.08_full-scrape.prom'));
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();
    const text = await context.registry.metrics();
    expect(seriesValue(text, `steadfast_gpu_temperature_celsius${L4_SERIES}`)).toBe(31);
    expect(seriesValue(text, 'steadfast_gpu_clock_hertz{gpu="0",pci_bus_id="0000:31:00",clock="sm"}')).toBe(210e6);
    expect(seriesValue(text, `steadfast_gpu_memory_total_bytes${L4_SERIES}`)).toBe(23033 * MiB);
    expect(seriesValue(text, `steadfast_gpu_memory_temperature_celsius${L4_SERIES}`)).toBeUndefined();
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(1);
    expect(exporter.requests).toBe(1);
  });

  it('fails update while the endpoint answers an error status, keeps the last values, and recovers', async () => {
    const exporter = await fakeExporter(sample('kops_L4_580.105.08_full-scrape.prom'));
    const { context, collector } = dcgmCollector(exporter.url, POLL_SECONDS);
    await collector.start();
    exporter.reply = { status: 503, body: 'DCGM not ready' };
    await waitFor(() => collector.update().then(() => false, () => true));
    await expect(collector.update()).rejects.toThrow(/cannot read dcgm-exporter at http:\/\/127\.0\.0\.1:\d+\/metrics: HTTP 503/);
    expect(seriesValue(await context.registry.metrics(), `steadfast_gpu_present${L4_SERIES}`)).toBe(1);
    exporter.reply = { status: 200, body: sample('kops_L4_580.105.08_full-scrape.prom') };
    await waitFor(() => collector.update().then(() => true, () => false));
  });

  it('fails, rather than reporting no GPUs, when no series carries a pci_bus_id label', async () => {
    const exporter = await fakeExporter(sample('dcgm_excerpts_from_public_issues.prom').replace(/pci_bus_id="[^"]*",/g, ''));
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/no pci_bus_id label; steadfast needs a dcgm-exporter that sets it/);
    expect(await context.registry.metrics()).not.toMatch(/^steadfast_gpu_\w+[{ ]/m);
  });

  it('reports failure while nothing listens at the URL', async () => {
    const exporter = await fakeExporter('');
    await new Promise((resolve) => servers.pop()?.close(resolve));
    const { collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/cannot read dcgm-exporter/);
  });

  it('turns a GPU that drops out of the dcgm-exporter scrape into present 0 with one gpu_lost event', async () => {
    const l4 = sample('kops_L4_580.105.08_full-scrape.prom');
    const t4 = sample('ericsson_T4_590.48.01_no-help-lines.prom');
    const exporter = await fakeExporter(`${l4}\n${t4}`);
    const { context, collector } = dcgmCollector(exporter.url, POLL_SECONDS);
    await collector.start();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_attached')).toBe(2);
    exporter.reply = { status: 200, body: l4 };
    await waitFor(async () => seriesValue(await context.registry.metrics(), 'steadfast_gpu_present{gpu="0",pci_bus_id="0000:37:00"}') === 0);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:37:00', message: expect.stringContaining('dcgm-exporter') })]);
  });

  it('exports the last Xid as a gauge of its code, not as a count', async () => {
    const series = 'gpu="0",UUID="GPU-x",pci_bus_id="00000000:31:00.0",modelName="NVIDIA L4"';
    const exporter = await fakeExporter(`DCGM_FI_DEV_XID_ERRORS{${series}} 79\nDCGM_FI_DEV_GPU_TEMP{${series}} 40\n`);
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    const text = await context.registry.metrics();
    expect(seriesValue(text, `steadfast_gpu_dcgm_last_xid${L4_SERIES}`)).toBe(79);
    expect(text).toContain('# TYPE steadfast_gpu_dcgm_last_xid gauge');
  });
});

describe('gpu collector exposition on dcgm-exporter samples', () => {
  it.each(PROM_FILES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const exporter = await fakeExporter(sample(name));
    const { context, collector } = dcgmCollector(exporter.url);
    const set = new CollectorSet([collector], context.registry, context.logger);
    await set.start();
    const text = normaliseExposition(await set.scrape());
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    const expected = expectedText(join(EXPECTED, 'gpu', `dcgm-${name}`), text);
    expect(text).toBe(expected);
    const lint = await promtoolCheckMetrics(expected);
    expect(lint.output).toBe('');
    expect(lint.code).toBe(0);
  });
});
