import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import {
  dataBytes,
  multicastPackets,
  packetCount,
  unicastPackets,
  parseCounter,
  parsePortState,
  parseRate,
  readInfinibandClass,
  type InfinibandDevice,
  type InfinibandPort,
} from '../../../agent/sources/infiniband.js';
import { INFINIBAND_SAMPLES, INFINIBAND_SAMPLES_ROOT, INFINIBAND_SAMPLE_NAMES, copiedInfinibandSysfs, tempDirPerTest } from '../helpers.js';

const dir = tempDirPerTest('steadfast-infiniband-');

function findPort(devices: readonly InfinibandDevice[], device: string, port: string): InfinibandPort {
  const found = devices.find((candidate) => candidate.name === device)?.ports.find((candidate) => candidate.port === port);
  if (!found) throw new Error(`no port ${device}/${port}`);
  return found;
}

describe('reading /sys/class/infiniband', () => {
  it.each(INFINIBAND_SAMPLE_NAMES)('parses every device and port of the %s sample with state, rate and link layer and no problems', async (sample) => {
    const reading = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, sample));
    expect(reading.problems).toEqual([]);
    expect(reading.devices.map((device) => device.name)).toEqual(INFINIBAND_SAMPLES[sample]);
    for (const device of reading.devices) {
      expect(device.ports.length).toBeGreaterThan(0);
      expect(device.firmwareVersion).toBeDefined();
      expect(device.boardId).toBeDefined();
      for (const port of device.ports) {
        expect(port.state).toEqual({ code: 4, name: 'ACTIVE' });
        expect(port.physicalState?.code).toBeGreaterThan(0);
        expect(port.rateBytesPerSecond).toBeGreaterThan(0);
        expect(port.linkLayer).toMatch(/^(InfiniBand|Ethernet)$/);
        expect(dataBytes(port, 'received')).toBeGreaterThan(0);
      }
    }
  });

  it('reads exact raw counter values, identity files, and both ports of a dual-port card in port order', async () => {
    const { devices } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'procfs_fixtures'));
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

  it('reads the 64-bit counters_ext files and port_rcv_discards where the driver writes them (mlx4)', async () => {
    const { devices } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'node_exporter_fixtures'));
    const first = findPort(devices, 'mlx4_0', '1');
    expect(first.extCounters).toEqual({
      port_rcv_data_64: 4631917,
      port_xmit_data_64: 3733440,
      port_rcv_packets_64: 0,
      port_xmit_packets_64: 0,
      port_unicast_rcv_packets: 61148,
      port_unicast_xmit_packets: 61239,
      port_multicast_rcv_packets: 93,
      port_multicast_xmit_packets: 16,
    });
    expect(first.counters.port_rcv_discards).toBe(0);
    // Port 2's 32-bit counters read 0; its 64-bit ones are what the port carried.
    const second = findPort(devices, 'mlx4_0', '2');
    expect(second.counters.port_rcv_data).toBe(0);
    expect(dataBytes(second, 'received')).toBe(4631917 * 4);
    expect(dataBytes(second, 'transmitted')).toBe(3733440 * 4);
    expect(unicastPackets(second, 'received')).toBe(0);
    expect(multicastPackets(second, 'transmitted')).toBe(0);
    // The procfs mlx4 capture has no counters_ext: the 32-bit counters stand.
    const { devices: older } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'procfs_fixtures'));
    expect(findPort(older, 'mlx4_0', '2').extCounters).toBeUndefined();
    expect(dataBytes(findPort(older, 'mlx4_0', '2'), 'received')).toBe(2460436784 * 4);
  });

  it('reads files that have no trailing newline, as the gpud capture has them', async () => {
    const { devices } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'gpud_h100_cluster'));
    const port = findPort(devices, 'mlx5_1', '1');
    expect(port.counters).toMatchObject({ port_rcv_data: 205128687774249, link_downed: 255, excessive_buffer_overrun_errors: 15 });
    expect(port.physicalState).toEqual({ code: 5, name: 'LinkUp' });
    expect(port.rateBytesPerSecond).toBe(50e9);
    expect(devices.find((device) => device.name === 'mlx5_1')).toMatchObject({ hcaType: 'MT4129', firmwareVersion: '28.41.1000' });
  });

  it('sees the BlueField-3 bond as a RoCE port: link layer Ethernet at 200 Gb/s', async () => {
    const { devices } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'gpud_h100_cluster'));
    const bond = findPort(devices, 'mlx5_bond_0', '1');
    expect(bond.linkLayer).toBe('Ethernet');
    expect(bond.rateBytesPerSecond).toBe(25e9);
    expect(devices.find((device) => device.name === 'mlx5_bond_0')?.hcaType).toBe('MT41692');
  });

  it('has hw_counters only for ports whose driver writes a hw_counters directory, and only the files that exist', async () => {
    const { devices } = await readInfinibandClass(join(INFINIBAND_SAMPLES_ROOT, 'procfs_fixtures'));
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
    const { classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
    writeFileSync(join(classDir, 'mlx4_0', 'ports', '1', 'counters', 'port_rcv_data'), 'N/A (no PMA)\n');
    const reading = await readInfinibandClass(classDir);
    expect(reading.problems).toEqual([]);
    const port = findPort(reading.devices, 'mlx4_0', '1');
    expect(port.counters.port_rcv_data).toBeUndefined();
    expect(port.counters.port_xmit_data).toBe(26509113295);
  });

  it('leaves a garbled counter or state absent and names the file as a problem', async () => {
    const { classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
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
    await expect(readInfinibandClass(join(dir(), 'missing'))).resolves.toEqual({ devices: [], problems: [] });
    const notADirectory = join(dir(), 'infiniband');
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
    const extended = (extCounters: InfinibandPort['extCounters'], counters: InfinibandPort['counters'] = {}): InfinibandPort => ({
      device: 'mlx4_0',
      port: '1',
      counters,
      extCounters,
    });
    expect(packetCount(extended({ port_rcv_packets_64: 5_000_000_000 }, { port_rcv_packets: 4_294_967_295 }), 'received')).toBe(5_000_000_000);
    expect(packetCount(extended({ port_unicast_xmit_packets: 9, port_multicast_xmit_packets: 1 }), 'transmitted')).toBe(10);
    expect(unicastPackets(extended({ port_unicast_rcv_packets: 9 }, { unicast_rcv_packets: 8 }), 'received')).toBe(8);
  });
});
