import { existsSync, mkdirSync, openSync, closeSync, readSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../../core/paths.js';

/**
 * The training job the protected lab runs (examples/pytorch/train.py under train.sbatch), as
 * steadfast's Slurm launcher starts it, and the job's log read back as it grows: the evidence the
 * lab's scenarios are judged on.
 */

/** Where the job's files live under the protected lab's root. */
export interface TrainingPaths {
  /** Code versions: `<code>/<version>/train.py`, picked by the launcher's `{version}`. */
  readonly code: string;
  /** The batch job's output, one file per batch host: `<logs>/<job>-<node>.out`, appended to by every run. */
  readonly logs: string;
  readonly checkpoints: string;
  readonly stacks: string;
  /** Where a scenario drops the files that make a rank fail (lab_faults.py). */
  readonly faults: string;
}

export interface TrainingOptions {
  readonly job: string;
  readonly nodes: number;
  readonly checkpointEvery: number;
  readonly stepSleep: number;
  readonly controllerUrl: string;
  readonly tokenFile: string;
  readonly agentTokenFile: string;
  /**
   * Hot swap on (the job is registered with spares): the rendezvous store's `host:port`, which
   * outlives every rank. The allocation is the launcher's `{nodes}` (the job's nodes and its
   * unused spares), so no node count is fixed, and the job is submitted with `--no-kill`.
   */
  readonly hotSwap?: { readonly rendezvous: string };
  /** Each run first runs the preflight across its nodes (train.sbatch's STEADFAST_ALLREDUCE_CHECK), with these options. */
  readonly preflight?: { readonly args: readonly string[] };
}

/** The batch host's output file of `job`'s runs, which that node's agent follows. */
export function jobLogFile(paths: TrainingPaths, job: string, node: string): string {
  return join(paths.logs, `${job}-${node}.out`);
}

/**
 * The Slurm launcher's argv, as registered with the controller: real sbatch on `{nodes}`, the code
 * version `{version}` (a directory of train.py versions), named after the registered job so that
 * the stop step finds the run to cancel, and the batch output per batch host
 * (`%N`), appended to, so that each node's agent follows one file of its own. Everything the
 * ranks need goes through `--export`: sbatch runs in the controller's environment.
 */
export function launcherCommand(paths: TrainingPaths, options: TrainingOptions): string[] {
  const exported = {
    STEADFAST_TRAIN_PY: join(paths.code, '{version}', 'train.py'),
    STEADFAST_CHECKPOINT_DIR: join(paths.checkpoints, '{job}'),
    STEADFAST_STACK_DIR: paths.stacks,
    STEADFAST_CONTROLLER_URL: options.controllerUrl,
    STEADFAST_TOKEN_FILE: options.tokenFile,
    // The node's own agent: every rank runs in its node's network namespace, where the agent listens.
    STEADFAST_AGENT_URL: 'http://127.0.0.1:9401',
    STEADFAST_AGENT_TOKEN_FILE: options.agentTokenFile,
    STEADFAST_LAB_FAULTS: paths.faults,
    ...(options.hotSwap === undefined ? {} : { STEADFAST_HOT_SWAP: '1', STEADFAST_RENDEZVOUS: options.hotSwap.rendezvous }),
    ...(options.preflight === undefined
      ? {}
      : {
          STEADFAST_ALLREDUCE_CHECK: '1',
          STEADFAST_ALLREDUCE_CHECK_PY: join(repoRoot(), 'clients', 'python', 'steadfast_preflight.py'),
          STEADFAST_ALLREDUCE_CHECK_ARGS: options.preflight.args.join(' '),
        }),
  };
  return [
    'sbatch',
    '--parsable',
    '--job-name={job}',
    '--nodelist={nodes}',
    // A hot-swap job's allocation is its nodes and its spares, however many are left (`{nodes}`
    // names them all, `{nodeCount}` counts them); a failed node must not end it.
    ...(options.hotSwap === undefined ? [`--nodes=${options.nodes}`] : ['--nodes={nodeCount}', '--no-kill']),
    '--ntasks-per-node=1',
    `--output=${join(paths.logs, '%x-%N.out')}`,
    '--open-mode=append',
    `--export=ALL,${Object.entries(exported)
      .map(([name, value]) => `${name}=${value}`)
      .join(',')}`,
    join(repoRoot(), 'examples', 'pytorch', 'train.sbatch'),
    '--iterations',
    '1000000',
    '--checkpoint-every',
    String(options.checkpointEvery),
    '--step-sleep',
    String(options.stepSleep),
    '--log-every',
    '1',
  ];
}

/**
 * The lab's faults, in the rank itself since the lab has no GPU to break: a rank whose trigger
 * file exists raises the RuntimeError PyTorch raises for a CUDA fault, at its next optimizer step
 * (the trigger is removed first, so the reattempt trains); a rank whose hang trigger exists stops
 * at its next optimizer step, before the next iteration's gradient all-reduce, sleeping forever
 * in `lab_hang_before_allreduce` (the other ranks block in that all-reduce: a hang whose odd
 * stack names the rank); a code version with a regression raises a TypeError at its first step.
 * A slow machine: while `slow-<node>` holds a number of seconds, every micro-batch's loss
 * computed on that node takes that much longer (`lab_slow_machine`), inside the compute train.py
 * times, and for every run placed there; evicting the node is what cures it.
 */
const LAB_FAULTS_PY = `"""Faults the steadfast lab injects into a training rank (written by tryit/lab/training.ts)."""
import os
import socket
import time

import torch


def lab_slow_machine(seconds):
    """A machine whose compute has become slower: each micro-batch costs this much more."""
    time.sleep(seconds)


def slow_seconds(path):
    try:
        with open(path) as handle:
            return max(0.0, float(handle.read().strip() or 0))
    except (OSError, ValueError):
        return 0.0


def lab_hang_before_allreduce():
    """Never returns: this rank stops entering the collectives, the others wait in them."""
    while True:
        time.sleep(3600)


def install(regression=None):
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
    faults = os.environ.get("STEADFAST_LAB_FAULTS", "")
    original = torch.optim.SGD.step

    def step(self, *args, **kwargs):
        trigger = os.path.join(faults, "crash-rank-%d" % rank) if faults else ""
        if trigger and os.path.exists(trigger):
            os.unlink(trigger)
            raise RuntimeError("CUDA error: an illegal memory access was encountered\\n"
                               "CUDA kernel errors might be asynchronously reported at some other API call, "
                               "so the stacktrace below might be incorrect.\\n"
                               "For debugging consider passing CUDA_LAUNCH_BLOCKING=1.")
        hang = os.path.join(faults, "hang-rank-%d" % rank) if faults else ""
        if hang and os.path.exists(hang):
            os.unlink(hang)
            lab_hang_before_allreduce()
        if regression is not None:
            raise TypeError(regression)
        return original(self, *args, **kwargs)

    torch.optim.SGD.step = step

    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    slow = os.path.join(faults, "slow-%s" % node) if faults else ""
    mse_loss = torch.nn.functional.mse_loss

    def slowed_mse_loss(*args, **kwargs):
        seconds = slow_seconds(slow) if slow else 0.0
        if seconds > 0:
            lab_slow_machine(seconds)
        return mse_loss(*args, **kwargs)

    torch.nn.functional.mse_loss = slowed_mse_loss
`;

function versionScript(version: string, regression: string | undefined): string {
  const train = join(repoRoot(), 'examples', 'pytorch', 'train.py');
  return `"""steadfast lab, code version ${version}: examples/pytorch/train.py${regression === undefined ? '' : ' with a regression'}, and the lab's fault hook."""
import os
import runpy
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import lab_faults  # noqa: E402

lab_faults.install(regression=${regression === undefined ? 'None' : JSON.stringify(regression)})
sys.argv[0] = ${JSON.stringify(train)}
runpy.run_path(${JSON.stringify(train)}, run_name="__main__")
`;
}

/** Writes a code version: the example as it is, or with a regression that raises a TypeError. */
export function writeCodeVersion(paths: TrainingPaths, version: string, regression?: string): void {
  mkdirSync(join(paths.code, version), { recursive: true });
  writeFileSync(join(paths.code, 'lab_faults.py'), LAB_FAULTS_PY);
  writeFileSync(join(paths.code, version, 'train.py'), versionScript(version, regression));
}

/** Makes `rank` raise a CUDA-style RuntimeError at its next step. */
export function triggerRankCrash(paths: TrainingPaths, rank: number): void {
  mkdirSync(paths.faults, { recursive: true });
  writeFileSync(join(paths.faults, `crash-rank-${rank}`), '');
}

// -------------------------------------------------------------------------------------------

/** One line of the job's output, with when the lab first saw it and the Slurm run that wrote it. */
export interface LogLine {
  readonly seenAt: number;
  readonly file: string;
  /** The Slurm job id from train.sbatch's header above it in the same file; '' before any. */
  readonly slurmJob: string;
  readonly text: string;
}

export interface Iteration {
  readonly seenAt: number;
  readonly slurmJob: string;
  readonly rank: number;
  readonly iteration: number;
  readonly loss: number;
  /** The rank's own compute and the whole synchronous step, in seconds, and its micro-batch share. */
  readonly computeSeconds: number;
  readonly stepSeconds: number;
  readonly microbatches: number;
}

const HEADER = /^\[train\.sbatch\] Slurm job (\d+) on (\S+)/;
/** train.py's line for an iteration: rank, iteration, loss, compute and step seconds, micro-batch share. */
export const ITERATION = /^\[rank (\d+)\] iteration (\d+) loss (\S+) compute (\S+)s step (\S+)s micro-batches (\d+)\//;
const RESUME = /^\[rank 0\] resume: (.*?)(?: → step (\d+))?$/;

/**
 * Follows every batch output file of one job (`<logs>/<job>-*.out`) by polling, and keeps each
 * line with the time it was first seen: the job log has no time stamps of its own, and the
 * scenarios measure when the first iteration after a relaunch appeared.
 */
export class JobLog {
  private readonly offsets = new Map<string, { offset: number; partial: string; slurmJob: string }>();
  readonly lines: LogLine[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly dir: string,
    private readonly job: string,
    private readonly intervalMs = 100,
  ) {}

  start(): void {
    this.poll();
    this.timer = setInterval(() => this.poll(), this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Reads whatever was appended since the last poll. */
  poll(): void {
    if (!existsSync(this.dir)) return;
    const now = Date.now();
    for (const name of readdirSync(this.dir).sort()) {
      if (!name.startsWith(`${this.job}-`) || !name.endsWith('.out')) continue;
      const file = join(this.dir, name);
      const state = this.offsets.get(file) ?? { offset: 0, partial: '', slurmJob: '' };
      this.offsets.set(file, state);
      const size = statSync(file).size;
      if (size <= state.offset) continue;
      const buffer = Buffer.alloc(size - state.offset);
      const fd = openSync(file, 'r');
      try {
        readSync(fd, buffer, 0, buffer.length, state.offset);
      } finally {
        closeSync(fd);
      }
      state.offset = size;
      const text = state.partial + buffer.toString('utf8');
      const parts = text.split('\n');
      state.partial = parts.pop() ?? '';
      for (const line of parts) {
        const header = HEADER.exec(line);
        if (header) state.slurmJob = header[1] ?? '';
        this.lines.push({ seenAt: now, file, slurmJob: state.slurmJob, text: line });
      }
    }
  }

  /** Slurm runs in the order their output first appeared. */
  runs(): string[] {
    return [...new Set(this.lines.map((line) => line.slurmJob).filter(Boolean))];
  }

  iterations(slurmJob?: string, rank = 0): Iteration[] {
    const found: Iteration[] = [];
    for (const line of this.lines) {
      if (slurmJob !== undefined && line.slurmJob !== slurmJob) continue;
      const match = ITERATION.exec(line.text);
      if (!match || Number(match[1]) !== rank) continue;
      found.push({
        seenAt: line.seenAt,
        slurmJob: line.slurmJob,
        rank,
        iteration: Number(match[2]),
        loss: Number(match[3]),
        computeSeconds: Number(match[4]),
        stepSeconds: Number(match[5]),
        microbatches: Number(match[6]),
      });
    }
    return found;
  }

  /** Where a run resumed: the step, or null when it started from scratch; undefined before rank 0 said. */
  resumedFrom(slurmJob: string): { step: number | null; source: string } | undefined {
    for (const line of this.lines) {
      if (line.slurmJob !== slurmJob) continue;
      const match = RESUME.exec(line.text);
      if (match) return { step: match[2] === undefined ? null : Number(match[2]), source: match[1] ?? '' };
    }
    return undefined;
  }

  /** The lines of one run, for a report. */
  textOf(slurmJob: string): string[] {
    return this.lines.filter((line) => line.slurmJob === slurmJob).map((line) => line.text);
  }

  /** The first line of `slurmJob` matching `pattern`. */
  find(slurmJob: string | undefined, pattern: RegExp): LogLine | undefined {
    return this.lines.find((line) => (slurmJob === undefined || line.slurmJob === slurmJob) && pattern.test(line.text));
  }
}

/** Makes every micro-batch computed on `node` take `seconds` longer, from its next one; 0 ends it. */
export function slowMachine(paths: TrainingPaths, node: string, seconds: number): void {
  mkdirSync(paths.faults, { recursive: true });
  writeFileSync(join(paths.faults, `slow-${node}`), `${seconds}\n`);
}

/** Makes `rank` hang at its next step, before the next gradient all-reduce (lab_hang_before_allreduce). */
export function triggerRankHang(paths: TrainingPaths, rank: number): void {
  mkdirSync(paths.faults, { recursive: true });
  writeFileSync(join(paths.faults, `hang-rank-${rank}`), '');
}
