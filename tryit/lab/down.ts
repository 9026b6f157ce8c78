import { InputError } from '../../core/errors.js';
import { LabError } from './command.js';
import { daemonsUsingConf, isAlive, labProcesses, runs, stopPid } from './daemons.js';
import { labLayout, ownedByPrefix, type LabLayout, type LabOptionsInput } from './layout.js';
import { listNetns, netnsPids, removeLabNetwork } from './network.js';
import { cancelAllJobs } from './slurm.js';
import { readLabState, removeLabState, type LabState } from './state.js';

/**
 * `steadfast lab down`: cancel the jobs, stop every slurmd, kill whatever is left in the node
 * namespaces, stop slurmctld, delete the namespaces, veths and bridge. It works from the state
 * file when there is one and from the well-known names (the prefix, the conf path) when there
 * is not, and running it twice is harmless. Logs stay in the directory for a post-mortem.
 */

export interface LabDownReport {
  readonly dir: string;
  /** Jobs still listed when cancelling gave up (their processes were killed anyway). */
  readonly jobsNotCancelled: string[];
  readonly stopped: { pid: number; what: string }[];
  /** What could not be removed; empty on success. */
  readonly leftovers: { processes: number[]; netns: string[]; links: string[] };
}

/** The lab's layout as `up` made it (from the state file), or as the options name it. */
function resolveLab(input: LabOptionsInput): { layout: LabLayout; state: LabState | undefined } {
  const requested = labLayout(input);
  let state: LabState | undefined;
  try {
    state = readLabState(requested.stateFile);
  } catch (error) {
    // A damaged state file must not stop the clean-up; the names still find everything.
    if (!(error instanceof InputError)) throw error;
  }
  return { layout: state ? labLayout({ ...state.options, dir: state.dir }) : requested, state };
}

async function killNamespaces(layout: LabLayout, stopped: LabDownReport['stopped']): Promise<number[]> {
  const existing = new Set(await listNetns());
  const names = [...new Set([...layout.nodes.map((node) => node.netns), ...[...existing].filter((name) => ownedByPrefix(layout.options.prefix, name))])];
  const remaining: number[] = [];
  for (const netns of names.filter((name) => existing.has(name))) {
    const pids = await netnsPids(netns);
    // Everything in a lab namespace was started by the lab: slurmstepd (which ignores SIGTERM),
    // the job's tasks, anything they forked.
    await Promise.all(pids.map((pid) => stopPid(pid, undefined, 0, 'SIGKILL')));
    for (const pid of pids) stopped.push({ pid, what: `process in ${netns}` });
    remaining.push(...(await netnsPids(netns)).filter(isAlive));
  }
  return remaining;
}

export async function labDown(input: LabOptionsInput = {}): Promise<LabDownReport> {
  const { layout, state } = resolveLab(input);
  const conf = state?.conf ?? layout.conf;
  const stopped: LabDownReport['stopped'] = [];
  const scanned = daemonsUsingConf(conf);

  const controller = state?.slurmctld;
  const controllerUp =
    (controller !== undefined && runs(controller.pid, controller.marker)) || scanned.some((daemon) => daemon.program.startsWith('slurmctld'));
  const jobsNotCancelled = controllerUp ? await cancelAllJobs(conf) : [];

  const slurmds = [
    ...Object.entries(state?.slurmd ?? {}).map(([node, record]) => ({ ...record, what: `slurmd ${node}` })),
    ...scanned.filter((daemon) => daemon.program.startsWith('slurmd')).map((daemon) => ({ pid: daemon.pid, marker: conf, what: daemon.program })),
  ];
  await Promise.all(
    slurmds.map(async (daemon) => {
      if (!runs(daemon.pid, daemon.marker)) return;
      await stopPid(daemon.pid, daemon.marker, 5000);
      stopped.push({ pid: daemon.pid, what: daemon.what });
    }),
  );
  const stragglers = await killNamespaces(layout, stopped);

  const controllers = [
    ...(controller ? [controller] : []),
    ...scanned.filter((daemon) => daemon.program.startsWith('slurmctld')).map((daemon) => ({ pid: daemon.pid, marker: conf })),
  ];
  for (const daemon of controllers) {
    if (!runs(daemon.pid, daemon.marker)) continue;
    await stopPid(daemon.pid, daemon.marker, 5000);
    stopped.push({ pid: daemon.pid, what: 'slurmctld' });
  }

  const network = await removeLabNetwork(layout);
  const processes = [...stragglers, ...labProcesses(conf)];
  const leftovers = { processes: [...new Set(processes)], netns: network.netns, links: network.links };
  if (processes.length === 0 && network.netns.length === 0 && network.links.length === 0) removeLabState(layout.stateFile);
  return { dir: layout.dir, jobsNotCancelled, stopped: dedupe(stopped), leftovers };
}

/** The first reason each pid was stopped for (a slurmd is also a process in its namespace). */
function dedupe(stopped: LabDownReport['stopped']): LabDownReport['stopped'] {
  const byPid = new Map<number, LabDownReport['stopped'][number]>();
  for (const entry of stopped) if (!byPid.has(entry.pid)) byPid.set(entry.pid, entry);
  return [...byPid.values()];
}

/** Throws when `down` could not remove everything, naming what is left. */
export function assertClean(report: LabDownReport): void {
  const { processes, netns, links } = report.leftovers;
  if (processes.length + netns.length + links.length === 0) return;
  throw new LabError(
    `lab down left behind: ${[...processes.map((pid) => `pid ${pid}`), ...netns.map((name) => `netns ${name}`), ...links.map((name) => `link ${name}`)].join(', ')}`,
  );
}
