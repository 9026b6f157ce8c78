import { cpSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { pino } from 'pino';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CollectorSet } from '../../exporters/collector.js';
import {
  infinibandClassDir,
  packetCount,
  parseCounter,
  parsePortState,
  parseRate,
  readInfinibandClass,
  type InfinibandDevice,
  type InfinibandPort,
} from '../../exporters/sources/infiniband.js';
import { createRdmaCollector, rdmaCollectorFactory } from '../../exporters/collectors/rdma.js';
import { EXPECTED, REALWORLD, expectedText, normaliseExposition, promtoolCheckMetrics, seriesValue, testContext } from './helpers.js';

/** Each sample is a directory of `<device>/...` trees, as /sys/class/infiniband holds them. */
const SAMPLES_ROOT = join(REALWORLD, 'procfs-nfs-infiniband', 'sys-class-infiniband');
const SAMPLES = {
  procfs_fixtures: ['hfi1_0', 'mlx4_0', 'mlx5_0'],
  gpud_h100_cluster: ['mlx5_0', 'mlx5_1', 'mlx5_bond_0'],
} as const;
type Sample = keyof typeof SAMPLES;
const SAMPLE_NAMES = Object.keys(SAMPLES) as Sample[];

let dir: string;

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-rdma-'));
});

afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

/** A sysfs root whose class/infiniband is the sample itself (read-only use). */
function linkedSysfs(sample: Sample): string {
  const sysfs = join(dir, 'sys');
  mkdirSync(join(sysfs, 'class'), { recursive: true });
  symlinkSync(join(SAMPLES_ROOT, sample), infinibandClassDir(sysfs));
  return sysfs;
}

/** A sysfs root holding a writable copy of the sample, for tests that change files. */
function copiedSysfs(sample: Sample): { sysfs: string; classDir: string } {
  const sysfs = join(dir, 'sys');
  const classDir = infinibandClassDir(sysfs);
  cpSync(join(SAMPLES_ROOT, sample), classDir, { recursive: true });
  return { sysfs, classDir };
}

function findPort(devices: readonly InfinibandDevice[], device: string, port: string): InfinibandPort {
  const found = devices.find((candidate) => candidate.name === device)?.ports.find((candidate) => candidate.port === port);
  if (!found) throw new Error(`no port ${device}/${port}`);
  return found;
}

async function scrape(sysfs: string, context = testContext({ sysfs })): Promise<string> {
  const set = new CollectorSet([createRdmaCollector(context)], context.registry, context.logger);
  await set.start();
  return normaliseExposition(await set.scrape());
}

describe('reading /sys/class/infiniband', () => {
  it.each(SAMPLE_NAMES)('parses every device and port of the %s sample with state, rate and link layer and no problems', async (sample) => {
    const reading = await readInfinibandClass(join(SAMPLES_ROOT, sample));
    expect(reading.problems).toEqual([]);
    expect(reading.devices.map((device) => device.name)).toEqual(SAMPLES[sample]);
    for (const device of reading.devices) {
      expect(device.ports.length).toBeGreaterThan(0);
      expect(device.firmwareVersion).toBeDefined();
      expect(device.boardId).toBeDefined();
      for (const port of device.ports) {
        expect(port.state).toEqual({ code: 4, name: 'ACTIVE' });
        expect(port.physicalState?.code).toBeGreaterThan(0);
        expect(port.rateBytesPerSecond).toBeGreaterThan(0);
        expect(port.linkLayer).toMatch(/^(InfiniBand|Ethernet)$/);
        expect(port.counters.port_rcv_data).toBeGreaterThan(0);
      }
    }
  });

  it('reads exact raw counter values, identity files, and both ports of a dual-port card in port order', async () => {
    const { devices } = await readInfinibandClass(join(SAMPLES_ROOT, 'procfs_fixtures'));
    const mlx4 = devices.find((device) => device.name === 'mlx4_0');
    expect(mlx4).toMatchObject({ hcaType: 'MT4099', firmwareVersion: '2.31.5050', boardId: 'SM_1141000001000' });
    expect(mlx4?.ports.map((port) => port.port)).toEqual(['1', '2']);
    // The file is `InfiniBand` followed by two newlines.
    expect(findPort(devices, 'mlx4_0', '2').linkLayer).toBe('InfiniBand');
    expect(findPort(devices, 'mlx4_0', '2').counters).toMatchObject({ port_rcv_data: 2460436784, port_xmit_wait: 3846 });
    expect(findPort(devices, 'mlx4_0', '1').rateBytesPerSecond).toBe(5e9);
    const hfi1 = devices.find((device) => device.name === 'hfi1_0');
    expect(hfi1?.hcaType).toBeUndefined();
    expect(hfi1?.boardId).toBe('HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter');
  });

  it('reads files that have no trailing newline, as the gpud capture has them', async () => {
    const { devices } = await readInfinibandClass(join(SAMPLES_ROOT, 'gpud_h100_cluster'));
    const port = findPort(devices, 'mlx5_1', '1');
    expect(port.counters).toMatchObject({ port_rcv_data: 205128687774249, link_downed: 255, excessive_buffer_overrun_errors: 15 });
    expect(port.physicalState).toEqual({ code: 5, name: 'LinkUp' });
    expect(port.rateBytesPerSecond).toBe(50e9);
    expect(devices.find((device) => device.name === 'mlx5_1')).toMatchObject({ hcaType: 'MT4129', firmwareVersion: '28.41.1000' });
  });

  it('sees the BlueField-3 bond as a RoCE port: link layer Ethernet at 200 Gb/s', async () => {
    const { devices } = await readInfinibandClass(join(SAMPLES_ROOT, 'gpud_h100_cluster'));
    const bond = findPort(devices, 'mlx5_bond_0', '1');
    expect(bond.linkLayer).toBe('Ethernet');
    expect(bond.rateBytesPerSecond).toBe(25e9);
    expect(devices.find((device) => device.name === 'mlx5_bond_0')?.hcaType).toBe('MT41692');
  });

  it('has hw_counters only for ports whose driver writes a hw_counters directory, and only the files that exist', async () => {
    const { devices } = await readInfinibandClass(join(SAMPLES_ROOT, 'procfs_fixtures'));
    expect(findPort(devices, 'hfi1_0', '1').hwCounters).toBeUndefined();
    expect(findPort(devices, 'mlx4_0', '1').hwCounters).toBeUndefined();
    expect(findPort(devices, 'mlx5_0', '1').hwCounters).toEqual({
      roce_adp_retrans: 99,
      local_ack_timeout_err: 131,
      out_of_sequence: 1,
      packet_seq_err: 1,
      out_of_buffer: 0,
    });
  });

  it('leaves a counter that reads N/A (no PMA) absent without calling it a problem', async () => {
    const { classDir } = copiedSysfs('procfs_fixtures');
    writeFileSync(join(classDir, 'mlx4_0', 'ports', '1', 'counters', 'port_rcv_data'), 'N/A (no PMA)\n');
    const reading = await readInfinibandClass(classDir);
    expect(reading.problems).toEqual([]);
    const port = findPort(reading.devices, 'mlx4_0', '1');
    expect(port.counters.port_rcv_data).toBeUndefined();
    expect(port.counters.port_xmit_data).toBe(26509113295);
  });

  it('leaves a garbled counter or state absent and names the file as a problem', async () => {
    const { classDir } = copiedSysfs('procfs_fixtures');
    const portDir = join(classDir, 'mlx5_0', 'ports', '1');
    writeFileSync(join(portDir, 'counters', 'symbol_error'), '12abc\n');
    writeFileSync(join(portDir, 'state'), 'ACTIVE\n');
    const reading = await readInfinibandClass(classDir);
    const port = findPort(reading.devices, 'mlx5_0', '1');
    expect(port.counters.symbol_error).toBeUndefined();
    expect(port.state).toBeUndefined();
    expect(reading.problems.map((problem) => problem.path).sort()).toEqual([join(portDir, 'counters', 'symbol_error'), join(portDir, 'state')]);
  });

  it('has no devices when the class directory does not exist, and rejects when it cannot be listed', async () => {
    await expect(readInfinibandClass(join(dir, 'missing'))).resolves.toEqual({ devices: [], problems: [] });
    const notADirectory = join(dir, 'infiniband');
    writeFileSync(notADirectory, '');
    await expect(readInfinibandClass(notADirectory)).rejects.toThrow(/cannot list/);
  });
});

describe('parsing sysfs values', () => {
  it('parses port states and physical states into their code and name', () => {
    expect(parsePortState('4: ACTIVE')).toEqual({ code: 4, name: 'ACTIVE' });
    expect(parsePortState('5: LinkUp\n')).toEqual({ code: 5, name: 'LinkUp' });
    expect(parsePortState('1: DOWN')).toEqual({ code: 1, name: 'DOWN' });
    expect(parsePortState('3: Disabled')).toEqual({ code: 3, name: 'Disabled' });
    expect(parsePortState('7')).toEqual({ code: 7, name: '' });
    expect(parsePortState('ACTIVE')).toBeUndefined();
    expect(parsePortState('')).toBeUndefined();
  });

  it('turns rate strings in Gb/sec into bytes per second', () => {
    expect(parseRate('400 Gb/sec (4X NDR)')).toBe(50e9);
    expect(parseRate('200 Gb/sec (2X NDR)')).toBe(25e9);
    expect(parseRate('100 Gb/sec (4X EDR)')).toBe(12.5e9);
    expect(parseRate('2.5 Gb/sec (1X SDR)')).toBe(312_500_000);
    expect(parseRate('10 Gb/sec (4X)')).toBe(1.25e9);
    expect(parseRate('fast')).toBeUndefined();
    expect(parseRate('Gb/sec')).toBeUndefined();
  });

  it('tells counter values, N/A (no PMA), and garbage apart', () => {
    expect(parseCounter('230539874932483')).toEqual({ kind: 'value', value: 230539874932483 });
    expect(parseCounter('0\n')).toEqual({ kind: 'value', value: 0 });
    expect(parseCounter('N/A (no PMA)\n')).toEqual({ kind: 'unavailable' });
    expect(parseCounter('-1')).toEqual({ kind: 'invalid' });
    expect(parseCounter('0x10')).toEqual({ kind: 'invalid' });
    expect(parseCounter('9'.repeat(400))).toEqual({ kind: 'invalid' });
  });

  it('never throws on arbitrary text, and yields only finite non-negative numbers', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.string({ unit: 'binary' }), fc.stringMatching(/^\d{0,400}(\.\d*)? ?[MGTK]?b\/sec.*$/)), (text) => {
        const reading = parseCounter(text);
        if (reading.kind === 'value') expect(Number.isFinite(reading.value) && reading.value >= 0).toBe(true);
        const state = parsePortState(text);
        if (state !== undefined) expect(Number.isSafeInteger(state.code) && state.code >= 0).toBe(true);
        const rate = parseRate(text);
        if (rate !== undefined) expect(Number.isFinite(rate) && rate >= 0).toBe(true);
      }),
      { numRuns: 1000 },
    );
  });

  it('counts packets from port_*_packets, else from unicast plus multicast when both exist, else not at all', () => {
    const port = (counters: InfinibandPort['counters']): InfinibandPort => ({ device: 'mlx5_0', port: '1', counters });
    expect(packetCount(port({ port_rcv_packets: 10, unicast_rcv_packets: 7, multicast_rcv_packets: 1 }), 'received')).toBe(10);
    expect(packetCount(port({ unicast_rcv_packets: 7, multicast_rcv_packets: 1 }), 'received')).toBe(8);
    expect(packetCount(port({ unicast_xmit_packets: 5, multicast_xmit_packets: 2 }), 'transmitted')).toBe(7);
    expect(packetCount(port({ unicast_rcv_packets: 7 }), 'received')).toBeUndefined();
    expect(packetCount(port({}), 'transmitted')).toBeUndefined();
  });
});

describe('rdma collector', () => {
  it('is named rdma and enabled by default', () => {
    expect(rdmaCollectorFactory).toMatchObject({ name: 'rdma', defaultEnabled: true });
  });

  it.each(SAMPLE_NAMES)('exports the %s sample exactly as the expected file, which promtool accepts', async (sample) => {
    const text = await scrape(linkedSysfs(sample));
    expect(text).toContain('steadfast_collector_success{collector="rdma"} 1');
    const expected = expectedText(join(EXPECTED, 'rdma', `${sample}.prom`), text);
    expect(text).toBe(expected);
    const lint = await promtoolCheckMetrics(expected);
    expect(lint.output).toBe('');
    expect(lint.code).toBe(0);
  });

  it('exports data counters in bytes (4-octet words times 4), rate in bytes per second, and counters typed as counters', async () => {
    const text = await scrape(linkedSysfs('gpud_h100_cluster'));
    const mlx50 = '{device="mlx5_0",port="1"}';
    expect(seriesValue(text, `steadfast_rdma_port_data_received_bytes_total${mlx50}`)).toBe(230539874932483 * 4);
    expect(seriesValue(text, `steadfast_rdma_port_data_transmitted_bytes_total${mlx50}`)).toBe(230442669431839 * 4);
    expect(seriesValue(text, `steadfast_rdma_port_packets_received_total${mlx50}`)).toBe(317548853677);
    expect(seriesValue(text, `steadfast_rdma_port_rate_bytes_per_second${mlx50}`)).toBe(50e9);
    expect(seriesValue(text, `steadfast_rdma_port_state${mlx50}`)).toBe(4);
    expect(seriesValue(text, `steadfast_rdma_port_physical_state${mlx50}`)).toBe(5);
    expect(seriesValue(text, `steadfast_rdma_port_up${mlx50}`)).toBe(1);
    expect(seriesValue(text, 'steadfast_rdma_port_link_downed_total{device="mlx5_1",port="1"}')).toBe(255);
    expect(seriesValue(text, `steadfast_rdma_port_retransmits_total${mlx50}`)).toBe(3);
    expect(text).toContain(
      'steadfast_rdma_port_info{device="mlx5_bond_0",port="1",link_layer="Ethernet",hca_type="MT41692",fw_ver="32.38.3056",board_id="MT_0000000884"} 1',
    );
    expect(text).toContain('# TYPE steadfast_rdma_port_data_received_bytes_total counter');
    // No sample has congestion-control counters, so those series are absent, not 0.
    expect(text).not.toMatch(/^steadfast_rdma_port_cnp_sent_total\{/m);
  });

  it('exports hw_counters series only for ports that have the files', async () => {
    const text = await scrape(linkedSysfs('procfs_fixtures'));
    expect(seriesValue(text, 'steadfast_rdma_port_ack_timeouts_total{device="mlx5_0",port="1"}')).toBe(131);
    expect(seriesValue(text, 'steadfast_rdma_port_retransmits_total{device="mlx5_0",port="1"}')).toBe(99);
    expect(seriesValue(text, 'steadfast_rdma_port_retransmits_total{device="mlx4_0",port="1"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_rdma_port_symbol_errors_total{device="mlx4_0",port="2"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_rdma_port_info{device="hfi1_0",port="1",link_layer="InfiniBand",hca_type="",fw_ver="1.27.0",board_id="HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"}')).toBe(1);
  });

  it('reports a port whose physical state is not LinkUp as not up', async () => {
    // The procfs capture has phys_state `4: ACTIVE` for mlx5_0, i.e. physical state 4 (training).
    const text = await scrape(linkedSysfs('procfs_fixtures'));
    expect(seriesValue(text, 'steadfast_rdma_port_physical_state{device="mlx5_0",port="1"}')).toBe(4);
    expect(seriesValue(text, 'steadfast_rdma_port_up{device="mlx5_0",port="1"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_rdma_port_up{device="mlx4_0",port="2"}')).toBe(1);
  });

  it('removes the series of a port and of a device that vanish between scrapes', async () => {
    const { sysfs, classDir } = copiedSysfs('procfs_fixtures');
    const context = testContext({ sysfs });
    const collector = createRdmaCollector(context);
    await collector.update();
    let text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_rdma_port_state{device="mlx4_0",port="2"}')).toBe(4);
    expect(seriesValue(text, 'steadfast_rdma_port_state{device="hfi1_0",port="1"}')).toBe(4);

    rmSync(join(classDir, 'mlx4_0', 'ports', '2'), { recursive: true });
    rmSync(join(classDir, 'hfi1_0'), { recursive: true });
    await collector.update();
    text = await context.registry.metrics();
    expect(text).not.toContain('port="2"');
    expect(text).not.toContain('hfi1_0');
    expect(seriesValue(text, 'steadfast_rdma_port_state{device="mlx4_0",port="1"}')).toBe(4);
  });

  it('leaves out a counter that reads N/A (no PMA) instead of exporting 0', async () => {
    const { sysfs, classDir } = copiedSysfs('procfs_fixtures');
    writeFileSync(join(classDir, 'hfi1_0', 'ports', '1', 'counters', 'port_xmit_data'), 'N/A (no PMA)\n');
    const text = await scrape(sysfs);
    expect(seriesValue(text, 'steadfast_rdma_port_data_transmitted_bytes_total{device="hfi1_0",port="1"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_rdma_port_data_received_bytes_total{device="hfi1_0",port="1"}')).toBe(345091702026 * 4);
  });

  it('falls back to unicast plus multicast packets when port_rcv_packets is missing', async () => {
    const { sysfs, classDir } = copiedSysfs('procfs_fixtures');
    unlinkSync(join(classDir, 'mlx5_0', 'ports', '1', 'counters', 'port_rcv_packets'));
    unlinkSync(join(classDir, 'hfi1_0', 'ports', '1', 'counters', 'port_rcv_packets'));
    const text = await scrape(sysfs);
    expect(seriesValue(text, 'steadfast_rdma_port_packets_received_total{device="mlx5_0",port="1"}')).toBe(541889824);
    // hfi1 has no unicast/multicast split to fall back to.
    expect(seriesValue(text, 'steadfast_rdma_port_packets_received_total{device="hfi1_0",port="1"}')).toBeUndefined();
  });

  it('logs a garbled counter file once at debug and leaves its series out', async () => {
    const { sysfs, classDir } = copiedSysfs('procfs_fixtures');
    const garbled = join(classDir, 'mlx4_0', 'ports', '1', 'counters', 'link_downed');
    writeFileSync(garbled, 'garbage\n');
    const lines: string[] = [];
    const context = { ...testContext({ sysfs }), logger: pino({ level: 'debug' }, { write: (line: string) => lines.push(line) }) };
    const collector = createRdmaCollector(context);
    await collector.update();
    await collector.update();
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_rdma_port_link_downed_total{device="mlx4_0",port="1"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_rdma_port_link_downed_total{device="mlx4_0",port="2"}')).toBe(0);
    const logged = lines.map((line) => JSON.parse(line) as { level: number; path?: string; collector?: string }).filter((entry) => entry.path === garbled);
    expect(logged).toHaveLength(1);
    expect(logged[0]).toMatchObject({ level: 20, collector: 'rdma' });
  });

  it('succeeds with no series on a node without /sys/class/infiniband', async () => {
    mkdirSync(join(dir, 'sys', 'class'), { recursive: true });
    const text = await scrape(join(dir, 'sys'));
    expect(text).toContain('steadfast_collector_success{collector="rdma"} 1');
    expect(text).not.toMatch(/^steadfast_rdma_\w+\{/m);
  });

  it('fails the collector, with no stale series, when a directory cannot be listed', async () => {
    const { sysfs, classDir } = copiedSysfs('procfs_fixtures');
    const context = testContext({ sysfs });
    const collector = createRdmaCollector(context);
    const set = new CollectorSet([collector], context.registry, context.logger);
    expect(await set.scrape()).toContain('steadfast_collector_success{collector="rdma"} 1');

    const portsDir = join(classDir, 'mlx4_0', 'ports');
    rmSync(portsDir, { recursive: true });
    writeFileSync(portsDir, '');
    await expect(collector.update()).rejects.toThrow(/cannot list .*mlx4_0\/ports/);
    const text = await set.scrape();
    expect(text).toContain('steadfast_collector_success{collector="rdma"} 0');
    expect(text).not.toMatch(/^steadfast_rdma_\w+\{/m);
  });
});
