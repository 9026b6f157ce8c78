import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseMountstats, type NfsMount } from '../../../agent/sources/mountstats.js';
import { MOUNTSTATS_FILES, mountstatsSample } from '../helpers.js';

const PROCFS_26231 = 'procfs_fixtures_proc_26231_mountstats';
const NODE_EXPORTER_10 = 'node_exporter_fixtures_proc_10_mountstats';
const RDMA_NCONNECT16 = 'procfs_test_nfs3_rdma_nconnect16_multi-xprt.mountstats';
const RDMA_SINGLE = 'procfs_test_nfs3_rdma_single-xprt.mountstats';
const NFS41_9FIELD = 'procfs_test_nfs4.1_k8s_pv_statvers1.1_9field-perop.mountstats';

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
  it.each(MOUNTSTATS_FILES)('parses %s into at least one NFS mount, each with a transport and per-op lines', (name) => {
    const mounts = parseMountstats(mountstatsSample(name));
    expect(mounts.length).toBeGreaterThan(0);
    for (const mount of mounts) {
      expect(mount.transports.length).toBeGreaterThan(0);
      expect(mount.operations.length).toBeGreaterThan(0);
    }
  });

  it('reads the NFSv4.0 tcp mount of the procfs fixture, ignores rootfs/sysfs/proc/ext4, and keeps the wrapped 64-bit queue time exact', () => {
    const mount = only(parseMountstats(mountstatsSample(PROCFS_26231)));
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
    const mounts = parseMountstats(mountstatsSample(NODE_EXPORTER_10));
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
    const mount = only(parseMountstats(mountstatsSample(RDMA_NCONNECT16)));
    expect(mount.options.get('nconnect')).toBe('16');
    expect(mount.transports).toHaveLength(16);
    expect(mount.transports.every((transport) => transport.protocol === 'rdma' && transport.maxSlots === undefined)).toBe(true);
    expect(mount.transports[0]).toMatchObject({
      connectCount: 5808n,
      sends: 494490723n,
      receives: 494490687n,
      badXids: 36n,
      cumulativeOutstanding: 10032963746n,
      cumulativeBacklog: 1282789n,
    });
    expect(mount.transports[15]).toMatchObject({ idleTimeSeconds: 0n, sends: 466611083n, cumulativeOutstanding: 8540498291n });
    expect(mount.transports[15]?.rdmaCounters).toHaveLength(17);
    expect(mount.transports[15]?.rdmaCounters?.slice(-2)).toEqual([1n, 76n]);
    expect(mount.transports.reduce((sum, transport) => sum + transport.sends, 0n)).toBe(7_729_061_226n);
    expect(mount.bytes?.normalRead).toBe(3104202770327296n);
    expect(operation(mount, 'READ')).toMatchObject({ operations: 2654501510n, bytesReceived: 2013540728551504n, errors: 0n });
    expect(operation(mount, 'LOOKUP')?.errors).toBe(346n);
  });

  it('reads the single-xprt rdma mount, whose per-op block has only NULL', () => {
    const mount = only(parseMountstats(mountstatsSample(RDMA_SINGLE)));
    expect(mount.transports).toHaveLength(1);
    expect(only(mount.operations)).toMatchObject({ name: 'NULL', operations: 16n, rttMilliseconds: 11n, errors: 0n });
  });

  it('reads the NFSv4.1 Kubernetes PV mount with its ninth per-op field (errors) and mixed tab/space indentation', () => {
    const mount = only(parseMountstats(mountstatsSample(NFS41_9FIELD)));
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

  it.each(MOUNTSTATS_FILES)('never throws on shuffled subsets or truncations of %s', (name) => {
    const lines = mountstatsSample(name).split('\n');
    fc.assert(
      fc.property(fc.shuffledSubarray(lines), fc.nat({ max: lines.join('\n').length }), (subset, cut) => {
        expect(Array.isArray(parseMountstats(subset.join('\n')))).toBe(true);
        expect(Array.isArray(parseMountstats(lines.join('\n').slice(0, cut)))).toBe(true);
      }),
      { numRuns: 100 },
    );
  });
});
