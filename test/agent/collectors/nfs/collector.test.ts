import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CollectorSet, type Collector } from '../../../../agent/collector.js';
import { createNfsCollector, nfsCollectorFactory } from '../../../../agent/collectors/nfs/collector.js';
import { identifyMounts } from '../../../../agent/collectors/nfs/mounts.js';
import { parseMountstats } from '../../../../agent/sources/mountstats.js';
import { EXPECTED, MOUNTSTATS_FILES, MOUNTSTATS_SAMPLES, expectMatchesAndLints, mountstatsSample, scrapeOne, seriesValue, testContext } from '../../helpers.js';

const PROCFS_26231 = 'procfs_fixtures_proc_26231_mountstats';
const NODE_EXPORTER_10 = 'node_exporter_fixtures_proc_10_mountstats';

describe('mount identity', () => {
  it('gives repeated mounts of one export and kind one id exported once, and a different kind of the same export a #2 id', () => {
    const ids = identifyMounts(parseMountstats(mountstatsSample(NODE_EXPORTER_10))).map(({ id, mount, exportsSeries }) => [
      id,
      mount.mountpoint,
      exportsSeries,
    ]);
    expect(ids).toEqual([
      ['192.168.1.1:/srv/test', '/mnt/nfs/test', true],
      ['192.168.1.1:/srv/test', '/mnt/nfs/test-dupe', false],
      ['192.168.1.1:/srv/test#2', '/mnt/nfs/test-dupe', true],
    ]);
  });
});

/** A two-connection tcp mount (nconnect=2, 64 slots each) whose transport counters the test sets. */
function tcpSnapshot(transports: readonly { sends: number; outstanding: number; backlog: number }[]): string {
  return [
    'device srv:/ckpt mounted on /ckpt with fstype nfs4 statvers=1.1',
    '\topts:\trw,vers=4.2,proto=tcp,nconnect=2',
    '\tage:\t100',
    ...transports.map(({ sends, outstanding, backlog }) => `\txprt:\ttcp 900 1 1 0 0 ${sends} ${sends} 0 ${outstanding} ${backlog} 64 0 0`),
    '\tper-op statistics',
    '\t        WRITE: 5 5 0 100 100 1 2 3 0',
    '',
  ].join('\n');
}

function rdmaSnapshot(sends: number, outstanding: number, backlog: number): string {
  const rdmaOnly = Array.from({ length: 17 }, () => '0').join(' ');
  return [
    'device srv:/data mounted on /data with fstype nfs statvers=1.1',
    '\topts:\tro,vers=3,proto=rdma',
    `\txprt:\trdma 0 0 1 0 0 ${sends} ${sends} 0 ${outstanding} ${backlog} ${rdmaOnly}`,
    '\tper-op statistics',
    '\t        READ: 5 5 0 100 100 1 2 3 0',
    '',
  ].join('\n');
}

describe('nfs collector', () => {
  let dir: string;
  const open: Collector[] = [];

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'steadfast-nfs-'));
    mkdirSync(join(dir, 'self'));
  });

  afterEach(async () => {
    await Promise.all(open.splice(0).map((collector) => collector.close()));
    rmSync(dir, { recursive: true, force: true });
  });

  function collectorOn(settings: Record<string, string> = {}) {
    const context = testContext({ procfs: dir }, 5, settings);
    const collector = createNfsCollector(context);
    open.push(collector);
    return { context, collector };
  }

  it('computes slot utilisation over both nconnect transports from the counter deltas between two scrapes, absent on the first', async () => {
    const file = join(dir, 'self', 'mountstats');
    writeFileSync(
      file,
      tcpSnapshot([
        { sends: 1000, outstanding: 5000, backlog: 0 },
        { sends: 500, outstanding: 900, backlog: 0 },
      ]),
    );
    const { context, collector } = collectorOn();
    await collector.update();
    let text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_nfs_transport_max_slots{mount="srv:/ckpt",transport="1"}')).toBe(64);

    // Transport 0: 100 sends with 64 requests on the wire each, 10 waiting for a slot each.
    // Transport 1: 50 sends with 32 on the wire each, none waiting. (64 + 32) / (64 + 64) = 0.75.
    writeFileSync(
      file,
      tcpSnapshot([
        { sends: 1100, outstanding: 5000 + 6400, backlog: 1000 },
        { sends: 550, outstanding: 900 + 1600, backlog: 0 },
      ]),
    );
    await collector.update();
    text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBe(0.75);
    expect(seriesValue(text, 'steadfast_nfs_rpc_backlog_average{mount="srv:/ckpt"}')).toBe(10);
    expect(seriesValue(text, 'steadfast_nfs_transport_outstanding_requests_total{mount="srv:/ckpt",transport="0"}')).toBe(11400);

    // Nothing sent since: nothing measured, so no gauge rather than a made-up 0.
    await collector.update();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBeUndefined();

    // Counters that went backwards (a remount) give no gauge for that scrape.
    writeFileSync(
      file,
      tcpSnapshot([
        { sends: 10, outstanding: 10, backlog: 0 },
        { sends: 10, outstanding: 10, backlog: 0 },
      ]),
    );
    await collector.update();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBeUndefined();
  });

  it('divides rdma in-flight requests by the rdma_slot_table_entries sysctl, since rdma xprt lines carry no max_slots', async () => {
    const file = join(dir, 'self', 'mountstats');
    writeFileSync(file, rdmaSnapshot(100, 1000, 0));
    const { context, collector } = collectorOn();
    await collector.update();
    writeFileSync(file, rdmaSnapshot(110, 1000 + 640, 30));
    await collector.update();
    let text = await context.registry.metrics();
    // Without the sysctl there is no slot count: only the backlog average.
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/data"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_nfs_rpc_backlog_average{mount="srv:/data"}')).toBe(3);

    mkdirSync(join(dir, 'sys', 'sunrpc'), { recursive: true });
    writeFileSync(join(dir, 'sys', 'sunrpc', 'rdma_slot_table_entries'), '128\n');
    writeFileSync(file, rdmaSnapshot(120, 1640 + 640, 30));
    await collector.update();
    text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/data"}')).toBe(0.5);
  });

  it('reads the file named by the nfs.mountstats flag instead of <procfs>/self/mountstats', async () => {
    expect(nfsCollectorFactory.flags?.map((flag) => flag.name)).toEqual(['nfs.mountstats']);
    const { context, collector } = collectorOn({ 'nfs.mountstats': join(MOUNTSTATS_SAMPLES, PROCFS_26231) });
    await collector.update();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_nfs_operations_total{mount="192.168.1.1:/srv/test",operation="READ"}')).toBe(1298);
  });

  it('fails the update when the file cannot be read, which the scrape reports as success 0 with no stale series', async () => {
    const file = join(dir, 'self', 'mountstats');
    writeFileSync(file, tcpSnapshot([{ sends: 1, outstanding: 1, backlog: 0 }]));
    const { context, collector } = collectorOn();
    const set = new CollectorSet([collector], context.registry, context.logger);
    expect(await set.scrape()).toContain('steadfast_collector_success{collector="nfs"} 1');
    rmSync(file);
    await expect(collector.update()).rejects.toThrow(/cannot read .*mountstats/);
    const text = await set.scrape();
    expect(text).toContain('steadfast_collector_success{collector="nfs"} 0');
    expect(text).not.toMatch(/^steadfast_nfs_/m);
  });
});

describe('nfs collector exposition', () => {
  const open: Collector[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((collector) => collector.close()));
  });

  it.each(MOUNTSTATS_FILES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({}, 5, { 'nfs.mountstats': join(MOUNTSTATS_SAMPLES, name) });
    const collector = createNfsCollector(context);
    open.push(collector);
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="nfs"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'nfs', name.replace(/(\.mountstats)?$/, '.prom')), text);
  });

  it("leaves out the ACCESS queue time that wrapped past 2^63 but keeps the operation's other counters", async () => {
    const context = testContext({}, 5, { 'nfs.mountstats': join(MOUNTSTATS_SAMPLES, PROCFS_26231) });
    const collector = createNfsCollector(context);
    open.push(collector);
    await collector.update();
    const text = await context.registry.metrics();
    const access = '{mount="192.168.1.1:/srv/test",operation="ACCESS"}';
    expect(seriesValue(text, `steadfast_nfs_queue_seconds_total${access}`)).toBeUndefined();
    expect(seriesValue(text, `steadfast_nfs_rtt_seconds_total${access}`)).toBe(1667369447 / 1000);
    expect(seriesValue(text, `steadfast_nfs_operations_total${access}`)).toBe(2927395007);
    // Operations never called (WRITE 0) have no series.
    expect(text).not.toContain('operation="WRITE"');
    expect(seriesValue(text, 'steadfast_nfs_read_bytes_total{mount="192.168.1.1:/srv/test"}')).toBe(1207640230);
  });
});
