import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { CollectorSet, type Collector } from '../../exporters/collector.js';
import { parseMountstats, type NfsMount } from '../../exporters/sources/mountstats.js';
import { createNfsCollector, identifyMounts, nfsCollectorFactory } from '../../exporters/collectors/nfs.js';
import { EXPECTED, REALWORLD, expectedText, normaliseExposition, promtoolCheckMetrics, seriesValue, testContext } from './helpers.js';

const MOUNTSTATS = join(REALWORLD, 'procfs-nfs-infiniband', 'mountstats');
const SAMPLES = readdirSync(MOUNTSTATS).sort();
const PROCFS_26231 = 'procfs_fixtures_proc_26231_mountstats';
const NODE_EXPORTER_10 = 'node_exporter_fixtures_proc_10_mountstats';
const RDMA_NCONNECT16 = 'procfs_test_nfs3_rdma_nconnect16_multi-xprt.mountstats';
const RDMA_SINGLE = 'procfs_test_nfs3_rdma_single-xprt.mountstats';
const NFS41_9FIELD = 'procfs_test_nfs4.1_k8s_pv_statvers1.1_9field-perop.mountstats';

function sample(name: string): string {
  return readFileSync(join(MOUNTSTATS, name), 'utf8');
}

function only<T>(items: readonly T[]): T {
  expect(items).toHaveLength(1);
  const [item] = items;
  if (item === undefined) throw new Error('unreachable: length checked');
  return item;
}

function operation(mount: NfsMount, name: string) {
  return mount.operations.find((candidate) => candidate.name === name);
}

describe('mountstats parser on real samples', () => {
  it.each(SAMPLES)('parses %s into at least one NFS mount, each with a transport and per-op lines', (name) => {
    const mounts = parseMountstats(sample(name));
    expect(mounts.length).toBeGreaterThan(0);
    for (const mount of mounts) {
      expect(mount.transports.length).toBeGreaterThan(0);
      expect(mount.operations.length).toBeGreaterThan(0);
    }
  });

  it('reads the NFSv4.0 tcp mount of the procfs fixture, ignores rootfs/sysfs/proc/ext4, and keeps the wrapped 64-bit queue time exact', () => {
    const mount = only(parseMountstats(sample(PROCFS_26231)));
    expect(mount).toMatchObject({ device: '192.168.1.1:/srv/test', mountpoint: '/mnt/nfs/test', fstype: 'nfs4', statsVersion: '1.1', ageSeconds: 13968n });
    expect(mount.options.get('vers')).toBe('4.0');
    expect(mount.options.get('hard')).toBe('');
    expect(mount.rpcProgramVersion).toBe('4');
    expect(mount.bytes).toEqual({
      normalRead: 1207640230n,
      normalWrite: 0n,
      directRead: 0n,
      directWrite: 0n,
      serverRead: 1210214218n,
      serverWrite: 0n,
      readPages: 295483n,
      writePages: 0n,
    });
    expect(mount.events).toHaveLength(27);
    expect(only(mount.transports)).toEqual({
      protocol: 'tcp',
      port: 832n,
      bindCount: 0n,
      connectCount: 1n,
      connectTimeSeconds: 0n,
      idleTimeSeconds: 11n,
      sends: 6428n,
      receives: 6428n,
      badXids: 0n,
      cumulativeOutstanding: 12154n,
      cumulativeBacklog: 0n,
      maxSlots: 24n,
      cumulativeSending: 26n,
      cumulativePending: 5726n,
    });
    expect(mount.operations.map((op) => op.name)).toEqual(['NULL', 'READ', 'WRITE', 'ACCESS']);
    expect(operation(mount, 'READ')).toMatchObject({ operations: 1298n, bytesReceived: 1210292152n, executeMilliseconds: 79407n });
    // Eight fields per op (before kernel 5.6): no error count, rather than a made-up 0.
    expect(operation(mount, 'READ')?.errors).toBeUndefined();
    // 2^64 − 154467947070: a negative kernel sum printed unsigned, kept to the last digit.
    expect(operation(mount, 'ACCESS')?.queueMilliseconds).toBe(18446743919241604546n);
  });

  it('reads the udp transport of the node_exporter fixture with its 10 numbers and no connection fields', () => {
    const mounts = parseMountstats(sample(NODE_EXPORTER_10));
    expect(mounts.map((mount) => [mount.mountpoint, mount.fstype])).toEqual([
      ['/mnt/nfs/test', 'nfs4'],
      ['/mnt/nfs/test-dupe', 'nfs4'],
      ['/mnt/nfs/test-dupe', 'nfs'],
    ]);
    expect(only(mounts[2]?.transports ?? [])).toEqual({
      protocol: 'udp',
      port: 832n,
      bindCount: 0n,
      sends: 6428n,
      receives: 6428n,
      badXids: 0n,
      cumulativeOutstanding: 12154n,
      cumulativeBacklog: 0n,
      maxSlots: 24n,
      cumulativeSending: 26n,
      cumulativePending: 5726n,
    });
  });

  it('reads all 16 rdma transports of the nconnect=16 mount, with the 17 rdma-only counters after the common ten', () => {
    const mount = only(parseMountstats(sample(RDMA_NCONNECT16)));
    expect(mount.options.get('nconnect')).toBe('16');
    expect(mount.transports).toHaveLength(16);
    expect(mount.transports.every((transport) => transport.protocol === 'rdma' && transport.maxSlots === undefined)).toBe(true);
    expect(mount.transports[0]).toMatchObject({ connectCount: 5808n, sends: 494490723n, receives: 494490687n, badXids: 36n, cumulativeOutstanding: 10032963746n, cumulativeBacklog: 1282789n });
    expect(mount.transports[15]).toMatchObject({ idleTimeSeconds: 0n, sends: 466611083n, cumulativeOutstanding: 8540498291n });
    expect(mount.transports[15]?.rdmaCounters).toHaveLength(17);
    expect(mount.transports[15]?.rdmaCounters?.slice(-2)).toEqual([1n, 76n]);
    expect(mount.transports.reduce((sum, transport) => sum + transport.sends, 0n)).toBe(7_729_061_226n);
    expect(mount.bytes?.normalRead).toBe(3104202770327296n);
    expect(operation(mount, 'READ')).toMatchObject({ operations: 2654501510n, bytesReceived: 2013540728551504n, errors: 0n });
    expect(operation(mount, 'LOOKUP')?.errors).toBe(346n);
  });

  it('reads the single-xprt rdma mount, whose per-op block has only NULL', () => {
    const mount = only(parseMountstats(sample(RDMA_SINGLE)));
    expect(mount.transports).toHaveLength(1);
    expect(only(mount.operations)).toMatchObject({ name: 'NULL', operations: 16n, rttMilliseconds: 11n, errors: 0n });
  });

  it('reads the NFSv4.1 Kubernetes PV mount with its ninth per-op field (errors) and mixed tab/space indentation', () => {
    const mount = only(parseMountstats(sample(NFS41_9FIELD)));
    expect(mount.device).toBe('fs.example.com:/volume4/apps/home-automation/node-red-data');
    expect(mount.options.get('vers')).toBe('4.1');
    expect(mount.operations).toHaveLength(63);
    expect(operation(mount, 'FREE_STATEID')?.errors).toBe(10413n);
    expect(operation(mount, 'LOOKUP')?.errors).toBe(3546n);
    expect(operation(mount, 'WRITE')).toMatchObject({ operations: 322308n, bytesSent: 39161277084n, queueMilliseconds: 401718334n, errors: 0n });
    expect(mount.bytes).toMatchObject({ normalWrite: 39056395530n, serverWrite: 39087991255n });
    expect(mount.events?.[21]).toBe(34n); // silly_rename
    expect(only(mount.transports)).toMatchObject({ protocol: 'tcp', port: 940n, maxSlots: 32n, cumulativePending: 10823602n });
  });
});

describe('mountstats parser on edge cases', () => {
  it('accepts statvers 1.0 transports (udp 7, tcp 10 numbers) without max_slots, decodes \\040 in names, and skips garbage lines', () => {
    const text = [
      'device srv:/with\\040space mounted on /mnt/a\\040b with fstype nfs statvers=1.0',
      '\topts:\trw,vers=3,proto=udp',
      '\tage:\tnot-a-number',
      '\tbytes:\t1 2 3',
      '\txprt:\tudp 1 2 3 4 5 6 7',
      '\txprt:\ttcp 1 2 3 4 5 6 7 8 9 10',
      '\txprt:\ttcp 1 2 3',
      '\txprt:\tsctp 1 2 3 4 5 6 7 8 9 10',
      '\tper-op statistics',
      '\t        READ: 1 1 0 10 20 3 4 5',
      '\t        WRITE: 1 1 0 10 20 3 4',
      '\t        GETATTR: 1 1 0 10 20 3 4 x',
      'garbage that is not a device line',
      'device tmpfs mounted on /tmp with fstype tmpfs',
      '\txprt:\ttcp 1 2 3 4 5 6 7 8 9 10',
    ].join('\n');
    const mount = only(parseMountstats(text));
    expect(mount).toMatchObject({ device: 'srv:/with space', mountpoint: '/mnt/a b', statsVersion: '1.0', ageSeconds: undefined, bytes: undefined });
    expect(mount.transports.map((transport) => [transport.protocol, transport.sends, transport.maxSlots])).toEqual([
      ['udp', 3n, undefined],
      ['tcp', 6n, undefined],
    ]);
    expect(only(mount.operations)).toMatchObject({ name: 'READ', executeMilliseconds: 5n });
    expect(mount.operations[0]?.errors).toBeUndefined();
  });

  it('never throws and always terminates on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 2000 }), (text) => {
        expect(Array.isArray(parseMountstats(text))).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it('never throws on mountstats-shaped lines in any order and mixture', () => {
    const fragment = fc.constantFrom(
      'device a:/b mounted on /m with fstype nfs4 statvers=1.1',
      'device x mounted on /y with fstype ext4',
      '\txprt:\ttcp',
      '\txprt:\trdma 0 0',
      '\tper-op statistics',
      '\tREAD: 1 2 3 4 5 6 7 8 9 10 11',
      '\tbytes:\t18446744073709551616 0 0 0 0 0 0 0',
      '\tevents:\t',
      '\topts:\t,,=,',
      '\\\\040',
    );
    fc.assert(
      fc.property(fc.array(fc.oneof(fragment, fc.string({ maxLength: 40 })), { maxLength: 60 }), (lines) => {
        expect(Array.isArray(parseMountstats(lines.join('\n')))).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it.each(SAMPLES)('never throws on shuffled subsets or truncations of %s', (name) => {
    const lines = sample(name).split('\n');
    fc.assert(
      fc.property(fc.shuffledSubarray(lines), fc.nat({ max: lines.join('\n').length }), (subset, cut) => {
        expect(Array.isArray(parseMountstats(subset.join('\n')))).toBe(true);
        expect(Array.isArray(parseMountstats(lines.join('\n').slice(0, cut)))).toBe(true);
      }),
      { numRuns: 100 },
    );
  });
});

describe('mount identity', () => {
  it('gives repeated mounts of one export and kind one id exported once, and a different kind of the same export a #2 id', () => {
    const ids = identifyMounts(parseMountstats(sample(NODE_EXPORTER_10))).map(({ id, mount, exportsSeries }) => [id, mount.mountpoint, exportsSeries]);
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
    writeFileSync(file, tcpSnapshot([{ sends: 1000, outstanding: 5000, backlog: 0 }, { sends: 500, outstanding: 900, backlog: 0 }]));
    const { context, collector } = collectorOn();
    await collector.update();
    let text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_nfs_transport_max_slots{mount="srv:/ckpt",transport="1"}')).toBe(64);

    // Transport 0: 100 sends with 64 requests on the wire each, 10 waiting for a slot each.
    // Transport 1: 50 sends with 32 on the wire each, none waiting. (64 + 32) / (64 + 64) = 0.75.
    writeFileSync(file, tcpSnapshot([{ sends: 1100, outstanding: 5000 + 6400, backlog: 1000 }, { sends: 550, outstanding: 900 + 1600, backlog: 0 }]));
    await collector.update();
    text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBe(0.75);
    expect(seriesValue(text, 'steadfast_nfs_rpc_backlog_average{mount="srv:/ckpt"}')).toBe(10);
    expect(seriesValue(text, 'steadfast_nfs_transport_outstanding_requests_total{mount="srv:/ckpt",transport="0"}')).toBe(11400);

    // Nothing sent since: nothing measured, so no gauge rather than a made-up 0.
    await collector.update();
    expect(seriesValue(await context.registry.metrics(), 'steadfast_nfs_rpc_slot_utilization_ratio{mount="srv:/ckpt"}')).toBeUndefined();

    // Counters that went backwards (a remount) give no gauge for that scrape.
    writeFileSync(file, tcpSnapshot([{ sends: 10, outstanding: 10, backlog: 0 }, { sends: 10, outstanding: 10, backlog: 0 }]));
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
    const { context, collector } = collectorOn({ 'nfs.mountstats': join(MOUNTSTATS, PROCFS_26231) });
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

  it.each(SAMPLES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({}, 5, { 'nfs.mountstats': join(MOUNTSTATS, name) });
    const collector = createNfsCollector(context);
    open.push(collector);
    const set = new CollectorSet([collector], context.registry, context.logger);
    await set.start();
    const text = normaliseExposition(await set.scrape());
    expect(text).toContain('steadfast_collector_success{collector="nfs"} 1');
    const expected = expectedText(join(EXPECTED, 'nfs', name.replace(/(\.mountstats)?$/, '.prom')), text);
    expect(text).toBe(expected);
    const lint = await promtoolCheckMetrics(expected);
    expect(lint.output).toBe('');
    expect(lint.code).toBe(0);
  });

  it('leaves out the ACCESS queue time that wrapped past 2^63 but keeps the operation\'s other counters', async () => {
    const context = testContext({}, 5, { 'nfs.mountstats': join(MOUNTSTATS, PROCFS_26231) });
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
