import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { SlurmBackend } from '../../actuators/slurm.js';
import { LabError, run, runQuietly } from './command.js';
import type { LabDaemons } from './daemons.js';
import type { LabLayout, LabNode } from './layout.js';

/**
 * Slurm in the lab: slurmctld on the host, one slurmd per node namespace, the standby
 * reservation, and the client commands (always with SLURM_CONF pointing at the lab's file).
 */

export function slurmEnv(conf: string): Record<string, string> {
  return { SLURM_CONF: conf };
}

/**
 * Runs inside the node's fresh UTS and mount namespaces, before slurmd: the node's own hostname,
 * and the lab's hosts file over /etc/hosts (private to that mount namespace, so the host's file
 * is untouched). A constant script; the node name, file and command arrive as its arguments.
 */
const NODE_INIT = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"';

/**
 * A command run as a process of the node: in its network namespace, with its hostname and hosts
 * file. `ip netns exec` would be simpler, but it remounts /sys and hides /sys/fs/cgroup, and
 * slurmd then refuses to start; nsenter only joins the network namespace.
 */
export function nodeCommand(layout: LabLayout, node: LabNode, argv: readonly string[]): { command: string; args: string[] } {
  return {
    command: 'nsenter',
    args: [
      `--net=/run/netns/${node.netns}`,
      '--',
      'unshare',
      '--uts',
      '--mount',
      '--',
      'sh',
      '-c',
      NODE_INIT,
      'steadfast-lab-node',
      node.name,
      layout.hostsFile,
      ...argv,
    ],
  };
}

export function slurmdCommand(layout: LabLayout, node: LabNode): { command: string; args: string[] } {
  return nodeCommand(layout, node, ['slurmd', '-D', '-N', node.name, '-f', layout.conf]);
}

export function startSlurmctld(layout: LabLayout, daemons: LabDaemons): number {
  return daemons.start('slurmctld', 'slurmctld', ['-D', '-f', layout.conf], join(layout.logDir, 'slurmctld.out'), slurmEnv(layout.conf));
}

export function startSlurmd(layout: LabLayout, node: LabNode, daemons: LabDaemons): number {
  const { command, args } = slurmdCommand(layout, node);
  return daemons.start(`slurmd-${node.name}`, command, args, join(layout.logDir, `slurmd-${node.name}.out`), slurmEnv(layout.conf));
}

export interface SinfoNode {
  readonly name: string;
  /** sinfo's long state (`idle`, `allocated`, `maint`, `down*`, …). */
  readonly state: string;
  readonly reason: string;
}

export async function sinfoNodes(conf: string, timeoutMs = 5000): Promise<SinfoNode[]> {
  const out = await run('sinfo', ['--noheader', '--Node', '--format=%N|%T|%E'], { env: slurmEnv(conf), timeoutMs });
  const byName = new Map<string, SinfoNode>();
  for (const line of out.split('\n')) {
    const [name = '', state = '', reason = ''] = line.trim().split('|');
    // A node in two partitions is listed twice; once is enough.
    if (name) byName.set(name, { name, state, reason: reason === 'none' ? '' : reason });
  }
  return [...byName.values()];
}

/** Polls until `check` holds, failing with what was last seen. */
async function poll<T>(
  what: string,
  read: () => Promise<T>,
  check: (value: T) => boolean,
  timeoutMs: number,
  describe: (value: T | undefined) => string,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: T | undefined;
  let lastError = '';
  while (Date.now() < deadline) {
    try {
      last = await read();
      if (check(last)) return last;
    } catch (error) {
      lastError = error instanceof Error ? error.message : String(error);
    }
    await sleep(200);
  }
  throw new LabError(`timed out after ${timeoutMs} ms waiting for ${what}: ${describe(last)}${lastError ? ` (last error: ${lastError})` : ''}`);
}

export async function waitForSlurmctld(layout: LabLayout, daemons: LabDaemons, timeoutMs = 20_000): Promise<void> {
  await poll(
    'slurmctld to answer',
    async () => {
      if (!daemons.isRunning('slurmctld')) throw new LabError(`slurmctld exited; see ${join(layout.logDir, 'slurmctld.log')}`);
      return sinfoNodes(layout.conf);
    },
    (nodes) => nodes.length === layout.nodes.length,
    timeoutMs,
    (nodes) => `${nodes?.length ?? 0} of ${layout.nodes.length} nodes listed`,
  );
}

/** Every node registered and taking work: `idle` (no `*`, which means not responding). */
export async function waitForNodesIdle(layout: LabLayout, daemons: LabDaemons, timeoutMs = 30_000): Promise<SinfoNode[]> {
  return poll(
    'every slurmd to register',
    async () => {
      for (const node of layout.nodes) {
        if (!daemons.isRunning(`slurmd-${node.name}`))
          throw new LabError(`slurmd of ${node.name} exited; see ${join(layout.logDir, `slurmd-${node.name}.log`)} and .out`);
      }
      return sinfoNodes(layout.conf);
    },
    (nodes) => nodes.length === layout.nodes.length && nodes.every((node) => node.state === 'idle'),
    timeoutMs,
    (nodes) => (nodes ?? []).map((node) => `${node.name} ${node.state}`).join(', ') || 'nothing listed',
  );
}

/**
 * Holds the standbys in the maintenance reservation through the controller's own Slurm backend,
 * so a controller pointed at the lab finds them exactly where it keeps standbys.
 */
export async function holdStandbys(layout: LabLayout): Promise<void> {
  const backend = new SlurmBackend({
    scontrol: 'scontrol',
    sinfo: 'sinfo',
    env: slurmEnv(layout.conf),
    timeoutMs: 10_000,
    standbyReservation: layout.options.reservation,
  });
  for (const node of layout.nodes.filter((candidate) => candidate.role === 'standby')) await backend.holdStandby(node.name);
}

/**
 * slurmctld shows a node in a maintenance reservation as `maint` only once the reservation has
 * taken effect, a moment after it is made; `up` waits for it so it returns a settled cluster.
 */
export async function waitForStandbysHeld(layout: LabLayout, timeoutMs = 15_000): Promise<void> {
  const standbys = new Set(layout.nodes.filter((node) => node.role === 'standby').map((node) => node.name));
  await poll(
    'the standbys to show as maint',
    () => sinfoNodes(layout.conf),
    (nodes) => nodes.filter((node) => standbys.has(node.name)).every((node) => node.state.startsWith('maint')),
    timeoutMs,
    (nodes) =>
      (nodes ?? [])
        .filter((node) => standbys.has(node.name))
        .map((node) => `${node.name} ${node.state}`)
        .join(', '),
  );
}

/** The reservation's nodes, expanded; empty when there is none. */
export async function reservedNodes(layout: LabLayout, conf: string): Promise<string[]> {
  const backend = new SlurmBackend({
    scontrol: 'scontrol',
    sinfo: 'sinfo',
    env: slurmEnv(conf),
    timeoutMs: 5000,
    standbyReservation: layout.options.reservation,
  });
  return backend.standbys();
}

export async function jobIds(conf: string): Promise<string[]> {
  const out = await run('squeue', ['--noheader', '--format=%i'], { env: slurmEnv(conf), timeoutMs: 5000 });
  // Only job ids (`12`, an array task `12_3`) go on to scancel's command line.
  return out
    .split('\n')
    .map((line) => line.trim())
    .filter((id) => /^\d+(_\d+)?$/.test(id));
}

/**
 * Cancels every job while the daemons still run: slurmstepd ignores SIGTERM, so a job is only
 * ended cleanly by slurmctld and slurmd together (SIGTERM to the tasks, SIGKILL after KillWait).
 * Returns the jobs still listed at the deadline.
 */
export async function cancelAllJobs(conf: string, timeoutMs = 15_000): Promise<string[]> {
  let ids = await jobIds(conf).catch(() => []);
  if (ids.length === 0) return [];
  await runQuietly('scancel', ids, { env: slurmEnv(conf), timeoutMs: 5000 });
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    ids = await jobIds(conf).catch(() => []);
    if (ids.length === 0) return [];
    await sleep(250);
  }
  return ids;
}
