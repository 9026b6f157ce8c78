import { describe, expect, it } from 'vitest';
import { InputError } from '../../core/errors.js';
import { labLayout, ownedByPrefix } from '../../tryit/lab/layout.js';
import { renderHostsFile, renderSlurmConf } from '../../tryit/lab/slurm-conf.js';
import { slurmdCommand } from '../../tryit/lab/slurm.js';

/** The lab's names, addresses and files: pure, so `up`, `down` and `status` always agree. */
describe('lab layout', () => {
  it('names N nodes then K standbys, each with its namespace, veth pair and address on the bridge', () => {
    const layout = labLayout({ nodes: 2, standbys: 1, dir: '/tmp/lab-x' });
    expect(layout.nodes.map((node) => [node.name, node.role, node.address, node.netns, node.hostLink, node.nodeLink])).toEqual([
      ['node-1', 'compute', '10.201.0.11', 'sflab-node-1', 'sflab-h1', 'sflab-n1'],
      ['node-2', 'compute', '10.201.0.12', 'sflab-node-2', 'sflab-h2', 'sflab-n2'],
      ['node-3', 'standby', '10.201.0.13', 'sflab-node-3', 'sflab-h3', 'sflab-n3'],
    ]);
    expect(layout.bridge).toBe('sflab-br');
    expect(layout.bridgeAddress).toBe('10.201.0.1');
    expect(layout.stateFile).toBe('/tmp/lab-x/lab.json');
    // Linux refuses interface names over 15 characters.
    const wide = labLayout({ nodes: 40, standbys: 24, prefix: 'abcdefgh' });
    for (const node of wide.nodes) expect(node.hostLink.length).toBeLessThanOrEqual(15);
  });

  it('refuses public subnets, long prefixes and too many nodes', () => {
    expect(() => labLayout({ subnet: '8.8.8' })).toThrow(InputError);
    expect(() => labLayout({ subnet: '10.300.0' })).toThrow(InputError);
    expect(labLayout({ subnet: '192.168.77' }).bridgeAddress).toBe('192.168.77.1');
    expect(labLayout({ subnet: '172.20.1' }).bridgeAddress).toBe('172.20.1.1');
    expect(() => labLayout({ prefix: 'much-too-long' })).toThrow(InputError);
    expect(() => labLayout({ prefix: 'x;rm' })).toThrow(InputError);
    expect(() => labLayout({ nodes: 60, standbys: 10 })).toThrow(/at most 64/);
  });

  it('owns only names with its own prefix and a dash', () => {
    expect(ownedByPrefix('sf', 'sf-node-1')).toBe(true);
    expect(ownedByPrefix('sf', 'sflab-node-1')).toBe(false);
    expect(ownedByPrefix('sflab', 'eth0')).toBe(false);
  });

  it('writes a slurm.conf of real slurmd nodes on their own addresses, and hosts naming each', () => {
    const layout = labLayout({ nodes: 2, standbys: 1, dir: '/tmp/lab-x' });
    const conf = renderSlurmConf(layout, 'vm', 40000);
    expect(conf).toContain('SlurmctldHost=vm(10.201.0.1)\nSlurmctldPort=40000\n');
    expect(conf).toContain('NodeName=node-2 NodeAddr=10.201.0.12 NodeHostname=node-2 CPUs=1');
    expect(conf).not.toContain('CLOUD');
    for (const line of [
      'AuthType=auth/none',
      'CredType=cred/none',
      'SlurmdUser=root',
      'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none',
      'ReturnToService=2',
      'KillWait=5',
    ]) {
      expect(conf).toContain(`${line}\n`);
    }
    expect(conf).toContain('SlurmdSpoolDir=/tmp/lab-x/spool/%n\n');
    expect(conf).toContain('PartitionName=lab Nodes=node-1,node-2,node-3 Default=YES');
    expect(renderHostsFile(layout, 'vm')).toBe(
      '127.0.0.1 localhost\n10.201.0.1 vm steadfast-lab-host\n10.201.0.11 node-1\n10.201.0.12 node-2\n10.201.0.13 node-3\n',
    );
  });

  it('starts slurmd through nsenter and unshare with a constant script, the names as separate arguments', () => {
    const layout = labLayout({ nodes: 1, standbys: 0, dir: '/tmp/lab-x' });
    const node = layout.nodes[0];
    if (!node) throw new Error('no node');
    const { command, args } = slurmdCommand(layout, node);
    expect(command).toBe('nsenter');
    expect(args.slice(0, 6)).toEqual(['--net=/run/netns/sflab-node-1', '--', 'unshare', '--uts', '--mount', '--']);
    expect(args.slice(-9)).toEqual(['steadfast-lab-node', 'node-1', '/tmp/lab-x/hosts', 'slurmd', '-D', '-N', 'node-1', '-f', '/tmp/lab-x/slurm.conf']);
  });
});
