import { residentKiB, runs } from './daemons.js';
import { labLayout, type LabOptionsInput } from './layout.js';
import { labNetworkLeftovers, listNetns, netnsPids } from './network.js';
import { jobIds, reservedNodes, sinfoNodes, type SinfoNode } from './slurm.js';
import { readLabState, type LabState } from './state.js';

/** `steadfast lab status`: what the state file says, checked against the machine. */

export interface LabProcessStatus {
  readonly what: string;
  readonly pid: number;
  readonly running: boolean;
  readonly rssKiB?: number | undefined;
}

export interface LabNamespaceStatus {
  readonly node: string;
  readonly role: 'compute' | 'standby';
  readonly netns: string;
  readonly address: string;
  readonly exists: boolean;
  /** Processes inside it (slurmd, and slurmstepd and tasks while a job runs). */
  readonly processes: number;
}

export interface LabStatus {
  readonly dir: string;
  /** `none`: no state file; `starting`: an `up` is running or died half-way; `up`. */
  readonly phase: 'none' | LabState['phase'];
  /** Set SLURM_CONF to this to use sinfo, sbatch, scancel on the lab. */
  readonly slurmConf?: string | undefined;
  readonly controller?: string | undefined;
  readonly nodes: SinfoNode[];
  readonly standbyReservation?: { name: string; nodes: string[] } | undefined;
  readonly jobs: string[];
  readonly processes: LabProcessStatus[];
  readonly namespaces: LabNamespaceStatus[];
  /** Namespaces and links with the lab's prefix that no state file accounts for. */
  readonly strays: { netns: string[]; links: string[] };
  /** Why sinfo or squeue could not be read, when they could not. */
  readonly slurmError?: string | undefined;
}

export async function labStatus(input: LabOptionsInput = {}): Promise<LabStatus> {
  const requested = labLayout(input);
  const state = readLabState(requested.stateFile);
  if (!state)
    return {
      dir: requested.dir,
      phase: 'none',
      nodes: [],
      jobs: [],
      processes: [],
      namespaces: [],
      strays: await labNetworkLeftovers(requested.options.prefix),
    };
  const layout = labLayout({ ...state.options, dir: state.dir });
  const leftovers = await labNetworkLeftovers(layout.options.prefix);
  const existing = new Set(await listNetns());
  const namespaces = await Promise.all(
    layout.nodes.map(async (node) => ({
      node: node.name,
      role: node.role,
      netns: node.netns,
      address: node.address,
      exists: existing.has(node.netns),
      processes: existing.has(node.netns) ? (await netnsPids(node.netns)).length : 0,
    })),
  );
  const records = [
    ...(state.slurmctld ? [{ what: 'slurmctld', ...state.slurmctld }] : []),
    ...Object.entries(state.slurmd).map(([node, record]) => ({ what: `slurmd ${node}`, ...record })),
  ];
  const processes = records.map((record) => {
    const running = runs(record.pid, record.marker);
    return { what: record.what, pid: record.pid, running, rssKiB: running ? residentKiB(record.pid) : undefined };
  });
  let nodes: SinfoNode[] = [];
  let jobs: string[] = [];
  let reservation: string[] = [];
  let slurmError: string | undefined;
  if (processes.some((entry) => entry.what === 'slurmctld' && entry.running)) {
    try {
      [nodes, jobs, reservation] = await Promise.all([sinfoNodes(state.conf), jobIds(state.conf), reservedNodes(layout, state.conf)]);
    } catch (error) {
      slurmError = error instanceof Error ? error.message : String(error);
    }
  }
  const known = new Set([...layout.nodes.map((node) => node.netns), ...layout.nodes.map((node) => node.hostLink), layout.bridge]);
  return {
    dir: state.dir,
    phase: state.phase,
    slurmConf: state.conf,
    controller: `${layout.bridgeAddress}:${state.controllerPort}`,
    nodes,
    standbyReservation: { name: layout.options.reservation, nodes: reservation },
    jobs,
    processes,
    namespaces,
    strays: { netns: leftovers.netns.filter((name) => !known.has(name)), links: leftovers.links.filter((name) => !known.has(name)) },
    slurmError,
  };
}

/** The status as a person reads it. */
export function formatLabStatus(status: LabStatus): string {
  const lines: string[] = [];
  if (status.phase === 'none') {
    lines.push(`no lab in ${status.dir}`);
  } else {
    lines.push(`lab in ${status.dir}: ${status.phase}`, `  export SLURM_CONF=${status.slurmConf ?? ''}   # slurmctld on ${status.controller ?? '?'}`, '');
    lines.push('NODE        ROLE     ADDRESS        NETNS                    PROCS  SLURM STATE');
    for (const ns of status.namespaces) {
      const slurm = status.nodes.find((node) => node.name === ns.node);
      const state = slurm ? `${slurm.state}${slurm.reason ? ` (${slurm.reason})` : ''}` : '-';
      lines.push(
        `${ns.node.padEnd(11)} ${ns.role.padEnd(8)} ${ns.address.padEnd(14)} ${(ns.exists ? ns.netns : `${ns.netns} (missing)`).padEnd(24)} ${String(ns.processes).padStart(5)}  ${state}`,
      );
    }
    if (status.standbyReservation) lines.push('', `reservation ${status.standbyReservation.name}: ${status.standbyReservation.nodes.join(', ') || '(none)'}`);
    lines.push(`jobs in the queue: ${status.jobs.join(', ') || '(none)'}`, '', 'PROCESS          PID      RUNNING  RSS');
    for (const entry of status.processes) {
      lines.push(
        `${entry.what.padEnd(16)} ${String(entry.pid).padEnd(8)} ${(entry.running ? 'yes' : 'no').padEnd(8)} ${entry.rssKiB === undefined ? '-' : `${(entry.rssKiB / 1024).toFixed(1)} MiB`}`,
      );
    }
    if (status.slurmError) lines.push('', `slurm: ${status.slurmError}`);
  }
  const strays = [...status.strays.netns, ...status.strays.links];
  if (strays.length > 0) lines.push('', `not accounted for by a state file: ${strays.join(', ')} (\`steadfast lab down\` removes them)`);
  return `${lines.join('\n')}\n`;
}
