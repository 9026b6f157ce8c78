import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CommanderError } from 'commander';
import { afterEach, describe, expect, it } from 'vitest';
import { readBuildInfo } from '../../core/build-info.js';
import { InputError } from '../../core/errors.js';
import { silentLogger } from '../../core/log.js';
import { agentCommand } from '../../cli/agent.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { CollectorSet, type Collector } from '../../agent/collector.js';
import { COLLECTOR_FACTORIES, enabledFactories } from '../../agent/index.js';
import {
  EXPECTED,
  NVIDIA_SMI_XML,
  XID_LOGS,
  expectMatchesAndLints,
  normaliseExposition,
  promtoolCheckMetrics,
  seriesValue,
  testContext,
  waitFor,
} from './helpers.js';

const KMSG = join(XID_LOGS, 'gpud_xid_lines_h100_gb200.txt');
const XML = join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml');
const PATHS = { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: KMSG, nvidiaSmiXml: XML, nvidiaSmi: '/nonexistent/nvidia-smi' };

const agents: Agent[] = [];
const servers: Server[] = [];
afterEach(async () => {
  await Promise.all(agents.splice(0).map((agent) => agent.close()));
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

function agent(options: Partial<Parameters<typeof createAgent>[0]> = {}): Agent {
  const created = createAgent({
    node: 'node-1',
    listen: { host: '127.0.0.1', port: 0 },
    paths: PATHS,
    pollIntervalSeconds: 60,
    collectors: COLLECTOR_FACTORIES,
    logger: silentLogger(),
    ...options,
  });
  agents.push(created);
  return created;
}

function stubCollector(name: string, update: () => Promise<void>): Collector {
  return { name, start: async () => undefined, update, close: async () => undefined };
}

describe('collector framework', () => {
  it('marks a failing collector with success 0 while the scrape and the other collectors still succeed', async () => {
    const context = testContext();
    const set = new CollectorSet(
      [stubCollector('broken', () => Promise.reject(new Error('source unreadable'))), stubCollector('fine', () => Promise.resolve())],
      context.registry,
      context.logger,
    );
    const text = await set.scrape();
    expect(seriesValue(text, 'steadfast_collector_success{collector="broken"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_collector_success{collector="fine"}')).toBe(1);
  });

  it('enables each collector by default, and honours --collector.<name> and --no-collector.<name>', () => {
    const defaults = COLLECTOR_FACTORIES.filter((factory) => factory.defaultEnabled).map((factory) => factory.name);
    expect(defaults).toEqual(expect.arrayContaining(['gpu', 'xid']));
    expect(enabledFactories({}).map((factory) => factory.name)).toEqual(defaults);
    expect(enabledFactories({ xid: false }).map((factory) => factory.name)).toEqual(defaults.filter((name) => name !== 'xid'));
    expect(() => enabledFactories({ nosuch: true })).toThrow(InputError);
  });

  it('exports no series at all for a disabled collector', async () => {
    const text = await agent({ collectors: enabledFactories({ xid: false }) }).scrapeOnce();
    expect(text).not.toMatch(/^# TYPE steadfast_xid_errors_total /m);
    expect(text).not.toMatch(/^steadfast_xid_errors_total/m);
    expect(text).not.toContain('collector="xid"');
    expect(seriesValue(text, 'steadfast_collector_success{collector="gpu"}')).toBe(1);
  });

  it('shows an unreadable kernel log as xid success 0 without failing the scrape', async () => {
    const text = await agent({ paths: { ...PATHS, kmsg: '/nonexistent/kmsg' } }).scrapeOnce();
    expect(seriesValue(text, 'steadfast_collector_success{collector="xid"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_collector_success{collector="gpu"}')).toBe(1);
  });
});

describe('agent', () => {
  it('serves /metrics, /healthz, 404 for other paths and 405 for other methods', async () => {
    const running = agent();
    const { port } = await running.start();
    const base = `http://127.0.0.1:${port}`;
    const metrics = await fetch(`${base}/metrics`);
    expect(metrics.status).toBe(200);
    expect(metrics.headers.get('content-type')).toContain('text/plain');
    const text = await metrics.text();
    expect(seriesValue(text, 'steadfast_xid_errors_total{pci_bus_id="0000:9b:00",xid="119",severity="fatal"}')).toBe(5);
    expect(seriesValue(text, 'steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"}')).toBe(1);
    expect(await (await fetch(`${base}/healthz`)).text()).toBe('ok\n');
    expect((await fetch(`${base}/nope`)).status).toBe(404);
    expect((await fetch(`${base}/metrics`, { method: 'POST' })).status).toBe(405);
    await running.close();
    await running.close();
  });

  it('serves its own process metrics and steadfast_build_info on /metrics, which promtool accepts, and keeps them out of a one-shot scrape', async () => {
    const running = agent();
    const { port } = await running.start();
    const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(seriesValue(text, 'process_resident_memory_bytes')).toBeGreaterThan(1024 * 1024);
    expect(seriesValue(text, 'process_cpu_seconds_total')).toBeGreaterThan(0);
    expect(seriesValue(text, 'process_open_fds')).toBeGreaterThan(0);
    const { version } = readBuildInfo();
    expect(version).toMatch(/^\d+\.\d+\.\d+/);
    expect(seriesValue(text, `steadfast_build_info{version="${version}",nodejs="${process.versions.node}"}`)).toBe(1);
    expect(seriesValue(text, 'steadfast_collector_success{collector="xid"}')).toBe(1);
    // promtool parses it all; its only lint complaints are prom-client's three Node.js gauges that
    // end in _total, kept under the names every Node.js service exports them by.
    const lint = await promtoolCheckMetrics(text);
    const complaints = lint.output.split('\n').filter((line) => line !== '');
    expect(
      complaints.filter((line) => !/^nodejs_active_(handles|requests|resources)_total non-counter metrics should not have "_total" suffix$/.test(line)),
    ).toEqual([]);
    const once = await running.scrapeOnce();
    expect(once).not.toContain('process_resident_memory_bytes');
    expect(once).not.toContain('steadfast_build_info');
  });

  it('answers /metrics before the first GPU poll is done, with the poll age and no GPU series, then with the GPUs', async () => {
    // An nvidia-smi that answers only once the test lets it: a first query slow as on a real node.
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-slow-smi-'));
    const release = join(dir, 'release');
    const smi = join(dir, 'nvidia-smi');
    writeFileSync(
      smi,
      `#!/bin/sh\n[ "$1" = "-q" ] || exit 0\ni=0\nwhile [ ! -e ${release} ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\nexec cat ${XML}\n`,
      { mode: 0o755 },
    );
    try {
      const served = agent({ paths: { ...PATHS, nvidiaSmiXml: undefined, nvidiaSmi: smi } });
      const { port } = await served.start();
      const first = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      expect(seriesValue(first, 'steadfast_gpu_poll_age_seconds')).toBeGreaterThanOrEqual(0);
      expect(first).not.toMatch(/^steadfast_gpu_(present|attached|last_poll_timestamp_seconds)\b/m);
      // Not read yet is not a failed read.
      expect(seriesValue(first, 'steadfast_collector_success{collector="gpu"}')).toBe(1);
      writeFileSync(release, '');
      await waitFor(async () => seriesValue(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text(), 'steadfast_gpu_attached') === 1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('sends fatal Xids from the kernel log to the controller with the bearer token', async () => {
    const bodies: unknown[] = [];
    const authorizations: (string | undefined)[] = [];
    const server = createServer((request, response) => {
      let body = '';
      request.on('data', (chunk: Buffer) => (body += chunk.toString()));
      request.on('end', () => {
        bodies.push(JSON.parse(body) as unknown);
        authorizations.push(request.headers.authorization);
        response.writeHead(202).end();
      });
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const token = 'agent-token-0123456789';
    const running = agent({
      controllerUrl: `http://127.0.0.1:${port}`,
      controllerToken: token,
      paths: { ...PATHS, kmsg: join(XID_LOGS, 'gpud_dmesg-T_xid119_gsp-timeout_h100-xe9680.log') },
    });
    await running.scrapeOnce();
    await waitFor(() => bodies.flat().length >= 5);
    expect(bodies.flat()).toHaveLength(5);
    expect(bodies.flat()[0]).toMatchObject({ kind: 'xid', node: 'node-1', gpu: '0000:9b:00', xid: 119 });
    expect(new Set(authorizations)).toEqual(new Set([`Bearer ${token}`]));
  });
});

describe('agent exposition end to end', () => {
  it('prints one scrape of every default collector on real samples, matching the expected file that promtool accepts', async () => {
    const text = normaliseExposition(await agent({ pollIntervalSeconds: 5, collectors: enabledFactories({}) }).scrapeOnce());
    await expectMatchesAndLints(join(EXPECTED, 'agent-once.prom'), text);
  });
});

describe('steadfast agent command', () => {
  function command(stdout: string[], stderr: string[] = []): ReturnType<typeof agentCommand> {
    return agentCommand({ stdout: (text) => stdout.push(text), logger: silentLogger(), env: {} })
      .exitOverride()
      .configureOutput({ writeErr: (text) => stderr.push(text), writeOut: (text) => stdout.push(text) });
  }

  it('prints one scrape with --once', async () => {
    const stdout: string[] = [];
    await command(stdout).parseAsync(['--once', '--node', 'gpu-node-07', '--path.kmsg', KMSG, '--nvidia-smi.xml', XML], { from: 'user' });
    const text = stdout.join('');
    expect(seriesValue(text, 'steadfast_collector_success{collector="gpu"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_collector_success{collector="xid"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_gpu_attached')).toBe(1);
  });

  it('leaves a collector out with --no-collector.<name>', async () => {
    const stdout: string[] = [];
    await command(stdout).parseAsync(['--once', '--no-collector.gpu', '--path.kmsg', KMSG], { from: 'user' });
    expect(stdout.join('')).not.toContain('collector="gpu"');
  });

  it.each([
    [['--gpu.poll-interval', 'often'], '--gpu.poll-interval'],
    [['--web.listen-address', 'localhost'], '--web.listen-address'],
    [['--node', '-rf /'], '--node'],
    [['--controller.url', 'ftp://controller'], '--controller.url'],
    [['--controller.url', 'http://controller:9400'], '--controller.token-file'],
    [['--gpu.source', 'gpud'], '--gpu.source: must be one of auto, nvml, nvidia-smi, dcgm-exporter'],
    [['--gpu.source', 'dcgm-exporter'], '--gpu.dcgm-exporter-url'],
    [['--gpu.dcgm-exporter-url', 'ftp://dcgm:9400/metrics'], '--gpu.dcgm-exporter-url: must be an http:// or https:// URL'],
  ])('rejects %j with exit code 2 and a message naming %s', async (args, flag) => {
    const stderr: string[] = [];
    const error = await command([], stderr)
      .parseAsync(['--once', ...args], { from: 'user' })
      .then(
        () => undefined,
        (caught: unknown) => caught,
      );
    expect(error).toBeInstanceOf(CommanderError);
    expect((error as CommanderError).exitCode).toBe(2);
    expect(stderr.join('')).toContain(flag);
  });

  it('describes itself and every flag in --help', async () => {
    const stdout: string[] = [];
    const error = await command(stdout)
      .parseAsync(['--help'], { from: 'user' })
      .then(
        () => undefined,
        (caught: unknown) => caught,
      );
    expect((error as CommanderError).exitCode).toBe(0);
    const help = stdout.join('');
    for (const flag of [
      '--web.listen-address',
      '--path.kmsg',
      '--nvidia-smi.xml',
      '--gpu.source',
      '--gpu.nvml-library',
      '--collector.xid',
      '--no-collector.gpu',
      '--controller.token-file',
      '--once',
    ]) {
      expect(help).toContain(flag);
    }
    expect(help).toContain('Run the node agent');
  });
});
