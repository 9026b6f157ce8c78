import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, openSync, readFileSync, readdirSync } from 'node:fs';
import { basename } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * The lab's daemons outlive the `steadfast lab up` that starts them, so they cannot be the
 * demo's ProcessGroup children (which die with their parent). This is the same discipline for
 * long-lived processes: while `up` runs, every daemon it started is tracked and killed if `up`
 * fails or its process exits; once `up` succeeds they are released and recorded by pid in the
 * state file, and `down` stops them by pid, after checking the pid still runs that daemon.
 */

export class LabDaemons {
  private readonly children = new Map<string, ChildProcess>();
  private readonly killOnExit = (): void => {
    for (const child of this.children.values()) child.kill('SIGKILL');
  };

  constructor() {
    process.once('exit', this.killOnExit);
  }

  /**
   * Starts `command` in its own session (so a Ctrl-C at the terminal does not reach it), with
   * stdout and stderr in `logFile`: a file, not a pipe, so nothing breaks when `up` exits.
   */
  start(name: string, command: string, args: readonly string[], logFile: string, env: Readonly<Record<string, string>> = {}): number {
    const fd = openSync(logFile, 'a');
    try {
      const child = spawn(command, [...args], { detached: true, stdio: ['ignore', fd, fd], env: { ...process.env, ...env } });
      if (child.pid === undefined) throw new Error(`could not start ${command}`);
      this.children.set(name, child);
      child.once('exit', () => {
        if (this.children.get(name) === child) this.children.delete(name);
      });
      return child.pid;
    } finally {
      closeSync(fd);
    }
  }

  isRunning(name: string): boolean {
    const child = this.children.get(name);
    return child !== undefined && child.exitCode === null && child.signalCode === null;
  }

  /** Lets the daemons run on after this process exits. */
  release(): void {
    for (const child of this.children.values()) child.unref();
    this.children.clear();
    process.removeListener('exit', this.killOnExit);
  }

  /** Stops every daemon still tracked: SIGTERM, then SIGKILL after `graceMs`. */
  async stopAll(graceMs = 3000): Promise<void> {
    await Promise.all([...this.children.values()].flatMap((child) => (child.pid === undefined ? [] : [stopPid(child.pid, undefined, graceMs)])));
    this.children.clear();
    process.removeListener('exit', this.killOnExit);
  }
}

/** A process's argument vector from /proc; undefined once it is gone. */
export function processArgs(pid: number): string[] | undefined {
  try {
    const raw = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    return raw === '' ? [] : raw.replace(/\0$/, '').split('\0');
  } catch {
    return undefined;
  }
}

/** Alive: it exists and is not a zombie (in a container, nobody may reap an orphan that died). */
export function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The state letter follows the command name in parentheses, which may itself hold spaces.
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    return false;
  }
}

/** Resident memory in KiB, from /proc; undefined once it is gone. */
export function residentKiB(pid: number): number | undefined {
  try {
    const match = /^VmRSS:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return match ? Number(match[1]) : undefined;
  } catch {
    return undefined;
  }
}

/** True when `pid` is alive and its arguments contain `marker` (when one is given). */
export function runs(pid: number, marker: string | undefined): boolean {
  if (!isAlive(pid)) return false;
  if (marker === undefined) return true;
  return (processArgs(pid) ?? []).includes(marker);
}

/**
 * Stops `pid` if it still runs what `marker` says (a pid from a state file may have been
 * reused by now): SIGTERM, SIGKILL after `graceMs`, and waits until it is gone.
 */
export async function stopPid(pid: number, marker: string | undefined, graceMs = 3000, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  if (!runs(pid, marker)) return;
  const send = (which: NodeJS.Signals): void => {
    try {
      process.kill(pid, which);
    } catch {
      // Gone between the check and the signal.
    }
  };
  send(signal);
  const deadline = Date.now() + graceMs;
  while (isAlive(pid) && Date.now() < deadline) await sleep(50);
  if (!isAlive(pid)) return;
  send('SIGKILL');
  const hardDeadline = Date.now() + 5000;
  while (isAlive(pid) && Date.now() < hardDeadline) await sleep(50);
}

/**
 * Slurm daemons started with this lab's slurm.conf (`-f <conf>`), found by scanning /proc: how
 * `down` finds them when the state file is gone or a pid was never recorded.
 */
export function daemonsUsingConf(conf: string): { pid: number; program: string }[] {
  const found: { pid: number; program: string }[] = [];
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid) continue;
    const args = processArgs(pid);
    if (!args || !args.includes(conf)) continue;
    const program = basename(args[0] ?? '');
    if (/^slurm(ctld|d|stepd|restd)(-wlm)?$/.test(program) && isAlive(pid)) found.push({ pid, program });
  }
  return found;
}

/**
 * Every live process of the lab: its daemons (the conf on their command line), slurmstepd and
 * the jobs' tasks (which inherit `SLURM_CONF=<conf>` and, the tasks, a job id). The check that
 * `down` really left nothing behind. A shell that merely exported SLURM_CONF to use the lab
 * (or the sudo running `lab down` from it) is not the lab's.
 */
export function labProcesses(conf: string): number[] {
  const wanted = `SLURM_CONF=${conf}`;
  const found: number[] = [];
  for (const entry of readdirSync('/proc')) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid <= 0 || pid === process.pid || !isAlive(pid)) continue;
    const args = processArgs(pid) ?? [];
    if (args.includes(conf)) {
      found.push(pid);
      continue;
    }
    const env = environment(pid);
    if (!env.includes(wanted)) continue;
    if ((args[0] ?? '').startsWith('slurmstepd') || env.some((variable) => variable.startsWith('SLURM_JOB_ID='))) found.push(pid);
  }
  return found;
}

function environment(pid: number): string[] {
  try {
    return readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
  } catch {
    return [];
  }
}
