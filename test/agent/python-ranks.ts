import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { FIXTURES } from './helpers.js';

/**
 * Real Python ranks for the faulthandler trace tests (test/fixtures/exporters/faulthandler-rank.py,
 * run with /usr/bin/python3); not a test file itself. Each test stops the ones it started.
 */

export const PYTHON = '/usr/bin/python3';
const SCRIPT = join(FIXTURES, 'exporters', 'faulthandler-rank.py');

export type RankMode = 'collective' | 'dataloader' | 'unregistered' | 'silent';

export interface PythonRank {
  /** As this test (the agent's pid namespace) sees it. */
  readonly pid: number;
  /** As the rank sees itself, in its own pid namespace (`pidNamespace`); its dump file is named with it. */
  readonly namespacePid?: number;
  /** The dump file the client opened; null when it registered nothing. */
  readonly file: string | null;
  /** The forked worker's pid, when asked for one. */
  readonly worker?: number;
  readonly child: ChildProcess;
}

/**
 * Starts a rank and resolves once it has registered its handler and printed its pid. With
 * `pidNamespace` (root only), the rank runs in a pid namespace of its own, as in a container:
 * `unshare --pid --fork` starts it as that namespace's pid 1.
 */
export async function startRank(
  mode: RankMode,
  env: Readonly<Record<string, string>>,
  options: { worker?: boolean; pidNamespace?: boolean } = {},
): Promise<PythonRank> {
  const command = [PYTHON, SCRIPT, mode, ...(options.worker ? ['worker'] : [])];
  const [program, ...args] = options.pidNamespace ? ['unshare', '--pid', '--fork', '--kill-child', ...command] : command;
  const child = spawn(program as string, args, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'inherit'] });
  const lines = createInterface({ input: child.stdout! });
  const first = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${SCRIPT} ${mode} printed nothing within 10 s`)), 10_000);
    lines.once('line', (line) => {
      clearTimeout(timer);
      resolve(line);
    });
    child.once('exit', (code) => reject(new Error(`${SCRIPT} ${mode} exited with ${code} before it was ready`)));
  });
  const info = JSON.parse(first) as { pid: number; file: string | null; worker?: number };
  if (!options.pidNamespace) return { ...info, child };
  // The rank is unshare's only child; /proc names it by the pid this namespace gives it.
  const [hostPid] = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8').trim().split(/\s+/).map(Number);
  if (hostPid === undefined || !Number.isInteger(hostPid)) throw new Error(`cannot find the rank under unshare (pid ${child.pid})`);
  return { ...info, pid: hostPid, namespacePid: info.pid, child };
}

/** Whether the process is still alive (signal 0 checks without sending anything). */
export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

/** Stops the ranks this test started, and their forked workers, by pid. */
export async function stopRanks(ranks: PythonRank[]): Promise<void> {
  for (const rank of ranks.splice(0)) {
    if (rank.worker !== undefined && alive(rank.worker)) process.kill(rank.worker, 'SIGKILL');
    if (rank.child.exitCode === null && rank.child.signalCode === null) {
      const exited = new Promise((resolve) => rank.child.once('exit', resolve));
      rank.child.kill('SIGKILL');
      await exited;
    }
  }
}
