import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../../core/paths.js';
import { freePort } from '../processes.js';
import { LAB_PYTHON } from './rendezvous-store.js';
import type { ProtectedLab } from './protected.js';
import { ITERATION, type LogLine } from './training.js';

/**
 * What the lab adds for the hot swap, besides the ranks' rendezvous store (rendezvous-store.ts): the
 * rank and spare processes of a node read from the job log (to kill a machine's ranks as its
 * failure would), and a reference run of the example without any fault, whose losses the swapped
 * run must reproduce step for step.
 */

const RANK_START = /^\[rank (\d+)\] pid (\d+) on ([^,\s]+),/;
const SPARE_START = /^\[spare\] pid (\d+) on ([^:\s]+):/;

/** A training process as the job log announced it: a rank at its start, or an idle spare. */
export interface TrainingProcess {
  readonly pid: number;
  readonly node: string;
  readonly spare: boolean;
  readonly line: LogLine;
}

/** Every rank and spare process `run` started, in the order their first lines were seen. */
export function trainingProcesses(lab: ProtectedLab, run: string): TrainingProcess[] {
  const found: TrainingProcess[] = [];
  for (const line of lab.log.lines) {
    if (line.slurmJob !== run) continue;
    const rank = RANK_START.exec(line.text);
    const spare = SPARE_START.exec(line.text);
    if (rank) found.push({ pid: Number(rank[2]), node: rank[3] ?? '', spare: false, line });
    else if (spare) found.push({ pid: Number(spare[1]), node: spare[2] ?? '', spare: true, line });
  }
  return found;
}

/** Kills every training process of `run` on `node` with SIGKILL (a machine that died takes its ranks along); the pids. */
export function killNode(lab: ProtectedLab, run: string, node: string, which: 'all' | 'spares' = 'all'): number[] {
  const killed: number[] = [];
  for (const proc of trainingProcesses(lab, run)) {
    if (proc.node !== node || (which === 'spares' && !proc.spare)) continue;
    try {
      process.kill(proc.pid, 'SIGKILL');
      killed.push(proc.pid);
    } catch {
      // Gone already.
    }
  }
  return killed;
}

/**
 * Rank 0's loss at every step up to `iterations` of the example trained without any fault: two
 * ranks over gloo on the loopback, no controller and no agent, the lab's seed, data order and
 * micro-batch share, no stand-in compute. A step's data is seeded by step and rank, so a run
 * that recovered exactly must log these very losses.
 */
export async function referenceLosses(lab: ProtectedLab, ranks: number, iterations: number, timeoutMs = 120_000): Promise<Map<number, number>> {
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-reference-'));
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('SLURM') && !name.startsWith('STEADFAST_')));
  const train = join(repoRoot(), 'examples', 'pytorch', 'train.py');
  const losses = new Map<number, number>();
  const argv = ['-u', train, '--job', `${lab.job}-reference`, '--iterations', String(iterations), '--checkpoint-every', '1000000000', '--checkpoint-dir', dir];
  const children = Array.from({ length: ranks }, (_, rank) =>
    spawn(LAB_PYTHON, [...argv, '--step-sleep', '0', '--log-every', '1'], {
      env: {
        ...env,
        RANK: String(rank),
        WORLD_SIZE: String(ranks),
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: String(port),
        STEADFAST_AGENT_URL: 'http://127.0.0.1:9',
      },
      stdio: ['ignore', 'pipe', 'ignore'],
    }),
  );
  let partial = '';
  children[0]?.stdout?.on('data', (chunk: Buffer) => {
    const lines = (partial + chunk.toString('utf8')).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const match = ITERATION.exec(line);
      if (match?.[1] === '0') losses.set(Number(match[2]), Number(match[3]));
    }
  });
  for (const child of children) child.stdout?.on('data', () => undefined);
  const exited = Promise.all(children.map((child) => new Promise<void>((resolve) => child.once('exit', () => resolve()))));
  const timer = setTimeout(() => children.forEach((child) => child.kill('SIGKILL')), timeoutMs);
  try {
    await exited;
  } finally {
    clearTimeout(timer);
    rmSync(dir, { recursive: true, force: true });
  }
  return losses;
}
