import { mkdirSync, rmSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { CollectorSet } from '../../../agent/collector.js';
import { createRdmaCollector, rdmaCollectorFactory } from '../../../agent/collectors/rdma.js';
import { infinibandClassDir } from '../../../agent/sources/infiniband.js';
import {
  EXPECTED,
  INFINIBAND_SAMPLE_NAMES,
  INFINIBAND_SAMPLES_ROOT,
  copiedInfinibandSysfs,
  expectMatchesAndLints,
  normaliseExposition,
  seriesValue,
  tempDirPerTest,
  testContext,
  type InfinibandSample,
} from '../helpers.js';

const dir = tempDirPerTest('steadfast-rdma-');

/** A sysfs root whose class/infiniband is the sample itself (read-only use). */
function linkedSysfs(sample: InfinibandSample): string {
  const sysfs = join(dir(), 'sys');
  mkdirSync(join(sysfs, 'class'), { recursive: true });
  symlinkSync(join(INFINIBAND_SAMPLES_ROOT, sample), infinibandClassDir(sysfs));
  return sysfs;
}

async function scrape(sysfs: string, context = testContext({ sysfs })): Promise<string> {
  const set = new CollectorSet([createRdmaCollector(context)], context.registry, context.logger);
  await set.start();
  return normaliseExposition(await set.scrape());
}

describe('rdma collector', () => {
  it('is named rdma and enabled by default', () => {
    expect(rdmaCollectorFactory).toMatchObject({ name: 'rdma', defaultEnabled: true });
  });

  it.each(INFINIBAND_SAMPLE_NAMES)('exports the %s sample exactly as the expected file, which promtool accepts', async (sample) => {
    const text = await scrape(linkedSysfs(sample));
    expect(text).toContain('steadfast_collector_success{collector="rdma"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'rdma', `${sample}.prom`), text);
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
    expect(
      seriesValue(
        text,
        'steadfast_rdma_port_info{device="hfi1_0",port="1",link_layer="InfiniBand",hca_type="",fw_ver="1.27.0",board_id="HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"}',
      ),
    ).toBe(1);
  });

  it('reports a port whose physical state is not LinkUp as not up', async () => {
    // The procfs capture has phys_state `4: ACTIVE` for mlx5_0, i.e. physical state 4 (training).
    const text = await scrape(linkedSysfs('procfs_fixtures'));
    expect(seriesValue(text, 'steadfast_rdma_port_physical_state{device="mlx5_0",port="1"}')).toBe(4);
    expect(seriesValue(text, 'steadfast_rdma_port_up{device="mlx5_0",port="1"}')).toBe(0);
    expect(seriesValue(text, 'steadfast_rdma_port_up{device="mlx4_0",port="2"}')).toBe(1);
  });

  it('removes the series of a port and of a device that vanish between scrapes', async () => {
    const { sysfs, classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
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
    const { sysfs, classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
    writeFileSync(join(classDir, 'hfi1_0', 'ports', '1', 'counters', 'port_xmit_data'), 'N/A (no PMA)\n');
    const text = await scrape(sysfs);
    expect(seriesValue(text, 'steadfast_rdma_port_data_transmitted_bytes_total{device="hfi1_0",port="1"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_rdma_port_data_received_bytes_total{device="hfi1_0",port="1"}')).toBe(345091702026 * 4);
  });

  it('falls back to unicast plus multicast packets when port_rcv_packets is missing', async () => {
    const { sysfs, classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
    unlinkSync(join(classDir, 'mlx5_0', 'ports', '1', 'counters', 'port_rcv_packets'));
    unlinkSync(join(classDir, 'hfi1_0', 'ports', '1', 'counters', 'port_rcv_packets'));
    const text = await scrape(sysfs);
    expect(seriesValue(text, 'steadfast_rdma_port_packets_received_total{device="mlx5_0",port="1"}')).toBe(541889824);
    // hfi1 has no unicast/multicast split to fall back to.
    expect(seriesValue(text, 'steadfast_rdma_port_packets_received_total{device="hfi1_0",port="1"}')).toBeUndefined();
  });

  it('logs a garbled counter file once at debug and leaves its series out', async () => {
    const { sysfs, classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
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
    mkdirSync(join(dir(), 'sys', 'class'), { recursive: true });
    const text = await scrape(join(dir(), 'sys'));
    expect(text).toContain('steadfast_collector_success{collector="rdma"} 1');
    expect(text).not.toMatch(/^steadfast_rdma_\w+\{/m);
  });

  it('fails the collector, with no stale series, when a directory cannot be listed', async () => {
    const { sysfs, classDir } = copiedInfinibandSysfs(dir(), 'procfs_fixtures');
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
