import { cpSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../core/paths.js';
import { createSimulatedNodes } from './cluster.js';

/**
 * A whole GPU node as files, built from the real captured samples: 8 GPUs (`nvidia-smi -q -x`),
 * 8 InfiniBand ports (ConnectX-7 sysfs trees), 4 NFS mounts in /proc/self/mountstats (one of
 * them NFSv3 over RDMA with nconnect=16) and a kernel log. The scrape benchmark and the
 * agent-fixture-node test run the agent on it; node_exporter reads the same trees.
 */

const SAMPLES = join(repoRoot(), 'test', 'fixtures', 'realworld', 'procfs-nfs-infiniband');
const FIXTURE_PID = 4242;

export interface FixtureNode {
  readonly root: string;
  readonly sysfs: string;
  readonly procfs: string;
  readonly kmsg: string;
  readonly nvidiaSmiXml: string;
}

/** Takes the NFS block that starts at `device <device> mounted on <mountpoint>` from a sample. */
function nfsBlock(file: string, device: string, mountpoint: string, rename: { device: string; mountpoint: string }): string {
  const lines = readFileSync(join(SAMPLES, 'mountstats', file), 'utf8').split('\n');
  const start = lines.findIndex((line) => line.startsWith(`device ${device} mounted on ${mountpoint} `));
  if (start < 0) throw new Error(`${file} has no mount ${device} on ${mountpoint}`);
  const end = lines.findIndex((line, index) => index > start && line.startsWith('device '));
  // The kernel ends each NFS block with an empty line; parsers rely on it.
  const block = `${lines
    .slice(start, end < 0 ? undefined : end)
    .join('\n')
    .trimEnd()}\n`;
  return block.replace(`device ${device} mounted on ${mountpoint} `, `device ${rename.device} mounted on ${rename.mountpoint} `);
}

/**
 * A TCP mount with nconnect=N, as the kernel prints it: one `xprt:` line per connection. Derived
 * from a real single-connection block by spreading its counters over N connections (the real
 * nconnect=16 sample is over RDMA, which node_exporter 1.5's parser rejects).
 */
function nconnectBlock(block: string, connections: number): string {
  return block.replace(/(\topts:\t[^\n]*)/, '$1,nconnect=' + String(connections)).replace(/^\txprt:\ttcp ([\d ]+)$/m, (_line, numbers: string) => {
    const values = numbers.trim().split(/\s+/).map(Number);
    return Array.from({ length: connections }, (_, index) => {
      // port, bind count, connect count, connect time, idle time stay; the rest is shared out.
      const spread = values.map((value, position) => (position < 5 ? value + (position === 0 ? index : 0) : Math.floor(value / connections)));
      return `\txprt:\ttcp ${spread.join(' ')}`;
    }).join('\n');
  });
}

export function buildFixtureNode(root: string, options: { ibPorts?: number } = {}): FixtureNode {
  const sysfs = join(root, 'sys');
  const procfs = join(root, 'proc');
  const infiniband = join(sysfs, 'class', 'infiniband');
  mkdirSync(infiniband, { recursive: true });
  const hca = join(SAMPLES, 'sys-class-infiniband', 'gpud_h100_cluster', 'mlx5_0');
  for (let index = 0; index < (options.ibPorts ?? 8); index += 1) cpSync(hca, join(infiniband, `mlx5_${index}`), { recursive: true });

  // node_exporter finds /proc/self through the `self` symlink, as on a real system.
  mkdirSync(join(procfs, String(FIXTURE_PID)), { recursive: true });
  symlinkSync(String(FIXTURE_PID), join(procfs, 'self'));
  const mountstats = [
    'device rootfs mounted on / with fstype rootfs',
    'device proc mounted on /proc with fstype proc',
    'device /dev/nvme0n1p1 mounted on / with fstype ext4',
    nfsBlock('procfs_fixtures_proc_26231_mountstats', '192.168.1.1:/srv/test', '/mnt/nfs/test', { device: 'nfs1:/home', mountpoint: '/home' }),
    // (The NFSv4.1 sample with 9-field op lines is left out: node_exporter 1.5 cannot parse it,
    // and the benchmark needs both exporters to read the same file.)
    nfsBlock('node_exporter_fixtures_proc_10_mountstats', '192.168.1.1:/srv/test', '/mnt/nfs/test', { device: 'nfs2:/datasets', mountpoint: '/data' }),
    nfsBlock('node_exporter_fixtures_proc_10_mountstats', '192.168.1.1:/srv/test', '/mnt/nfs/test-dupe', { device: 'nfs3:/scratch', mountpoint: '/scratch' }),
    nconnectBlock(
      nfsBlock('procfs_fixtures_proc_26231_mountstats', '192.168.1.1:/srv/test', '/mnt/nfs/test', { device: 'nfs4:/checkpoints', mountpoint: '/checkpoints' }),
      16,
    ),
  ];
  const text = `${mountstats.join('\n')}\n`;
  writeFileSync(join(procfs, String(FIXTURE_PID), 'mountstats'), text);
  // node_exporter also reads mountinfo, to join a mount to its options.
  const mountinfo = [...text.matchAll(/^device (\S+) mounted on (\S+) with fstype (\S+)/gm)].map(
    ([, device = '', mountpoint = '', fstype = ''], index) =>
      `${30 + index} 1 0:${50 + index} / ${mountpoint} rw,relatime shared:${index + 1} - ${fstype} ${device} rw`,
  );
  writeFileSync(join(procfs, String(FIXTURE_PID), 'mountinfo'), `${mountinfo.join('\n')}\n`);

  const [gpuNode] = createSimulatedNodes(root, 1, 8);
  if (!gpuNode) throw new Error('could not build the GPU fixture');
  return { root, sysfs, procfs, kmsg: gpuNode.kmsgPath, nvidiaSmiXml: gpuNode.xmlPath };
}
