import { join } from 'node:path';
import type { LabLayout } from './layout.js';

/**
 * The lab's slurm.conf and the hosts file every node sees as its /etc/hosts. Unlike the demo's
 * slurmctld (tryit/parts.ts: CLOUD nodes on loopback, no slurmd), each lab node is a real slurmd
 * on its own address, so jobs really run; authentication stays auth/none (no munge) because
 * everything is one machine and root.
 */

/** Where slurmd listens inside each node's namespace; one port serves all, each has its own stack. */
export const LAB_SLURMD_PORT = 6818;
export const LAB_PARTITION = 'lab';

export function renderSlurmConf(layout: LabLayout, controllerHost: string, controllerPort: number): string {
  const nodeList = layout.nodes.map((node) => node.name).join(',');
  const lines = [
    '# Written by `steadfast lab up`; removed with the lab.',
    'ClusterName=steadfast-lab',
    `SlurmctldHost=${controllerHost}(${layout.bridgeAddress})`,
    `SlurmctldPort=${controllerPort}`,
    `SlurmdPort=${LAB_SLURMD_PORT}`,
    'AuthType=auth/none',
    'CredType=cred/none',
    'SlurmUser=root',
    'SlurmdUser=root',
    'MailProg=/bin/true',
    `StateSaveLocation=${layout.slurmStateDir}`,
    `SlurmctldPidFile=${join(layout.dir, 'slurmctld.pid')}`,
    `SlurmctldLogFile=${join(layout.logDir, 'slurmctld.log')}`,
    // %n: one spool directory, pid file and log per node, all daemons sharing this file system.
    `SlurmdSpoolDir=${join(layout.spoolDir, '%n')}`,
    `SlurmdPidFile=${join(layout.spoolDir, 'slurmd-%n.pid')}`,
    `SlurmdLogFile=${join(layout.logDir, 'slurmd-%n.log')}`,
    'ProctrackType=proctrack/linuxproc',
    'TaskPlugin=task/none',
    'JobAcctGatherType=jobacct_gather/none',
    'SwitchType=switch/none',
    'MpiDefault=none',
    'SelectType=select/cons_tres',
    'SelectTypeParameters=CR_CPU',
    // A node whose slurmd comes back (a fault scenario restarting it) takes work again by itself.
    'ReturnToService=2',
    // slurmstepd sends SIGTERM, then SIGKILL this many seconds later, when a job is cancelled.
    'KillWait=5',
    // Quick to notice a killed slurmd in fault scenarios, yet not flapping on a busy laptop.
    'SlurmdTimeout=30',
    ...layout.nodes.map((node) => `NodeName=${node.name} NodeAddr=${node.address} NodeHostname=${node.name} CPUs=1 State=UNKNOWN`),
    `PartitionName=${LAB_PARTITION} Nodes=${nodeList} Default=YES MaxTime=INFINITE State=UP`,
  ];
  return `${lines.join('\n')}\n`;
}

/**
 * Each node's hostname must resolve to its own bridge address: PyTorch's gloo rendezvous
 * advertises what the hostname resolves to, and 127.0.0.1 would send peers to themselves.
 */
export function renderHostsFile(layout: LabLayout, controllerHost: string): string {
  const lines = [
    '127.0.0.1 localhost',
    `${layout.bridgeAddress} ${controllerHost} steadfast-lab-host`,
    ...layout.nodes.map((node) => `${node.address} ${node.name}`),
  ];
  return `${lines.join('\n')}\n`;
}
