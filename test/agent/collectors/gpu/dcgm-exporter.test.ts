import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { InputError } from '../../../../core/errors.js';
import type { Collector } from '../../../../agent/collector.js';
import { createGpuCollector, gpuCollectorFactory } from '../../../../agent/collectors/gpu/collector.js';
import { DCGM_SCRAPES, EXPECTED, dcgmScrape, expectMatchesAndLints, scrapeOne, seriesValue, testContext, waitFor } from '../../helpers.js';

const MiB = 1024 ** 2;
const URL_FLAG = 'gpu.dcgm-exporter-url';
const POLL_SECONDS = 0.05;

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

const L4_SERIES = '{gpu="0",pci_bus_id="0000:31:00",UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"}';

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
    const exporter = await fakeExporter(dcgmScrape('kops_L4_580.105.08_full-scrape.prom'));
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();
    const text = await context.registry.metrics();
    expect(seriesValue(text, `steadfast_gpu_temperature_celsius${L4_SERIES}`)).toBe(31);
    expect(seriesValue(text, 'steadfast_gpu_clock_hertz{gpu="0",pci_bus_id="0000:31:00",UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",clock="sm"}')).toBe(
      210e6,
    );
    expect(seriesValue(text, `steadfast_gpu_memory_total_bytes${L4_SERIES}`)).toBe(23033 * MiB);
    expect(seriesValue(text, `steadfast_gpu_memory_temperature_celsius${L4_SERIES}`)).toBeUndefined();
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(1);
    expect(exporter.requests).toBe(1);
  });

  it('fails update while the endpoint answers an error status, keeps the last values, and recovers', async () => {
    const exporter = await fakeExporter(dcgmScrape('kops_L4_580.105.08_full-scrape.prom'));
    const { context, collector } = dcgmCollector(exporter.url, POLL_SECONDS);
    await collector.start();
    exporter.reply = { status: 503, body: 'DCGM not ready' };
    await waitFor(() =>
      collector.update().then(
        () => false,
        () => true,
      ),
    );
    await expect(collector.update()).rejects.toThrow(/cannot read dcgm-exporter at http:\/\/127\.0\.0\.1:\d+\/metrics: HTTP 503/);
    expect(seriesValue(await context.registry.metrics(), `steadfast_gpu_present${L4_SERIES}`)).toBe(1);
    exporter.reply = { status: 200, body: dcgmScrape('kops_L4_580.105.08_full-scrape.prom') };
    await waitFor(() =>
      collector.update().then(
        () => true,
        () => false,
      ),
    );
  });

  it('places GPUs by UUID in a scrape without pci_bus_id labels, and loses none of them', async () => {
    // The V100 node of a public issue: a real scrape from a dcgm-exporter that sets no pci_bus_id.
    const v100 = dcgmScrape('dcgm_excerpts_from_public_issues.prom')
      .split('\n')
      .filter((line) => line.includes('Hostname="r6i3n0"'))
      .join('\n');
    const exporter = await fakeExporter(`${v100}\n`);
    const { context, collector } = dcgmCollector(exporter.url, POLL_SECONDS);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(4);
    expect(seriesValue(text, 'steadfast_gpu_power_limit_watts{gpu="2",UUID="GPU-a9079f15-493e-6c1c-c78c-73ec2b840cba"}')).toBe(300);
    expect(seriesValue(text, 'steadfast_gpu_pcie_replay_errors_total{gpu="1",UUID="GPU-8d5053b3-9280-7d1a-751b-4fd2fdd547c5"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_gpu_present{gpu="0",UUID="GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"}')).toBe(1);
    expect(text).not.toContain('pci_bus_id=');
    // A GPU that drops out shows as present 0 under its UUID; with no PCI id there is no fast-path event to name it.
    exporter.reply = {
      status: 200,
      body: `${v100
        .split('\n')
        .filter((line) => !line.includes('GPU-a6158b59'))
        .join('\n')}\n`,
    };
    await waitFor(
      async () => seriesValue(await context.registry.metrics(), 'steadfast_gpu_present{gpu="0",UUID="GPU-a6158b59-2c1e-1e63-0068-9178c4298abd"}') === 0,
    );
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_attached')).toBe(3);
    expect(context.events).toEqual([]);
  });

  it('fails, rather than reporting no GPUs, when no series carries a pci_bus_id or a UUID label', async () => {
    const exporter = await fakeExporter(dcgmScrape('dcgm_excerpts_from_public_issues.prom').replace(/(pci_bus_id|UUID)="[^"]*",/g, ''));
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/have neither a pci_bus_id nor a UUID label/);
    const text = await context.registry.metrics();
    // No GPU series; only the count of the failed query.
    expect(text).not.toMatch(/^steadfast_gpu_(?!query_failures_total|poll_age_seconds|source_info)\w+[{ ]/m);
    // The age counts from the start of polling: nothing was ever read.
    expect(seriesValue(text, 'steadfast_gpu_poll_age_seconds')).toBeGreaterThanOrEqual(0);
    expect(seriesValue(text, 'steadfast_gpu_query_failures_total{command="dcgm-exporter",reason="error"}')).toBe(1);
  });

  it('reports failure while nothing listens at the URL', async () => {
    const exporter = await fakeExporter('');
    await new Promise((resolve) => servers.pop()?.close(resolve));
    const { collector } = dcgmCollector(exporter.url);
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/cannot read dcgm-exporter/);
  });

  it('turns a GPU that drops out of the dcgm-exporter scrape into present 0 with one gpu_lost event', async () => {
    const l4 = dcgmScrape('kops_L4_580.105.08_full-scrape.prom');
    const t4 = dcgmScrape('ericsson_T4_590.48.01_no-help-lines.prom');
    const exporter = await fakeExporter(`${l4}\n${t4}`);
    const { context, collector } = dcgmCollector(exporter.url, POLL_SECONDS);
    await collector.start();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_attached')).toBe(2);
    exporter.reply = { status: 200, body: l4 };
    await waitFor(
      async () =>
        seriesValue(
          await context.registry.metrics(),
          'steadfast_gpu_present{gpu="0",pci_bus_id="0000:37:00",UUID="GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"}',
        ) === 0,
    );
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:37:00', message: expect.stringContaining('dcgm-exporter') })]);
  });

  it('exports the last Xid as a gauge of its code, not as a count', async () => {
    const series = 'gpu="0",UUID="GPU-x",pci_bus_id="00000000:31:00.0",modelName="NVIDIA L4"';
    const exporter = await fakeExporter(`DCGM_FI_DEV_XID_ERRORS{${series}} 79\nDCGM_FI_DEV_GPU_TEMP{${series}} 40\n`);
    const { context, collector } = dcgmCollector(exporter.url);
    await collector.start();
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_gpu_dcgm_last_xid{gpu="0",pci_bus_id="0000:31:00",UUID="GPU-x"}')).toBe(79);
    expect(text).toContain('# TYPE steadfast_gpu_dcgm_last_xid gauge');
  });
});

describe('gpu collector exposition on dcgm-exporter samples', () => {
  it.each(DCGM_SCRAPES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const exporter = await fakeExporter(dcgmScrape(name));
    const { context, collector } = dcgmCollector(exporter.url);
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'gpu', `dcgm-${name}`), text);
  });
});
