import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { cpus, tmpdir } from 'node:os';
import { join, resolve, sep } from 'node:path';
import { createInterface } from 'node:readline';
import { freePorts } from '../tryit/ports.js';
import { quantile } from './stats.js';

/**
 * What the hot swap costs a training job while nothing fails: the example training
 * (examples/pytorch/train.py) with 2 gloo ranks on 127.0.0.1, without and with `--hot-swap`, in
 * the same run. With it, every step each rank copies its state into one of two host buffers and
 * sends a replica to the other rank (clients/python/steadfast_hotswap.py); the next step waits
 * for that before its gradient all-reduce (`before_sync`). Printed: the median step time over
 * 100 steps each (the first 10 are left out as warm-up) and its ratio to the baseline, the
 * median wait in `before_sync` (timed by bench/hot_swap_probe.py, which runs train.py as it is),
 * the peak resident memory of each rank (with hot swap: its two buffers, the two replicas it holds
 * for the other rank, the runtime) and its difference to the baseline, beside the state's own
 * size. Then a sweep of the model's hidden width (`--width`) with one sample per micro-batch, so
 * that the step stays the stand-in compute while the state grows, each width measured with and
 * without hot swap: it notes the first width whose step is 10 % slower than the baseline's, and
 * stops at the first where the replica no longer fits inside a step (`before_sync` waits, median
 * over 2 % of the baseline's step).
 *
 * The ranks' world comes from a stand-in for the controller's world endpoint served by this
 * process (epoch 0, no spares, each rank the other's replica holder); the rendezvous store is the
 * runtime's own (`steadfast_hotswap.py store`). The step's compute is the example's stand-in
 * (a sleep per micro-batch, as a GPU step leaves the host's CPU free) plus the model's own CPU
 * work. A measurement, not an assertion: the figures depend on the machine.
 */

const PYTHON = process.env.STEADFAST_PYTHON ?? '/usr/bin/python3';
// bench/ in the source tree, dist/bench/ once compiled.
const ROOT = resolve(import.meta.dirname, import.meta.dirname.split(sep).includes('dist') ? '../..' : '..');
const PROBE = join(ROOT, 'bench', 'hot_swap_probe.py');
const HOTSWAP = join(ROOT, 'clients', 'python', 'steadfast_hotswap.py');
const JOB = 'hot-swap-bench';
const RANKS = 2;
const WARMUP_STEPS = 10;
const MEASURED_STEPS = 100;
const SWEEP_MEASURED_STEPS = 40;
/** The example's stand-in compute: seconds per micro-batch, 4 micro-batches a step. */
const STEP_SLEEP = 0.02;
const BASE_WIDTH = 64;
// Up to 34 MiB of state: a 2-core machine takes about 8 minutes for the whole bench.
const SWEEP_WIDTHS = [16_384, 65_536, 131_072, 262_144] as const;
/** The sweep's micro-batches hold one sample: the model's own compute stays small beside the stand-in's. */
const SWEEP_MICRO_BATCH_SIZE = 1;
/** The hot-swap step this much slower than the baseline's: the copy and the replica show in the step. */
const SLOWER = 1.1;
/** The replica no longer fits inside a step: before_sync waits this share of the baseline's step. */
const WAITS = 0.02;
const RUN_TIMEOUT_MS = 15 * 60_000;

interface RankFigures {
  readonly stepSeconds: number[];
  /** The runtime's wait in before_sync, when its log line gives it. */
  readonly waitSeconds: number[];
  peakRssBytes: number;
}

interface RunFigures {
  readonly width: number;
  readonly hotSwap: boolean;
  /** Median step time over both ranks' measured steps. */
  readonly medianStepSeconds: number;
  readonly medianWaitSeconds: number | null;
  /** Mean over the ranks of each rank's peak resident memory. */
  readonly peakRssBytes: number;
}

/** The controller's routes the ranks call, answered by this process: the world, and "none" for the rest. */
function worldStandIn(nodes: readonly string[]): Promise<{ server: Server; url: string }> {
  const world = {
    job: JOB,
    epoch: 0,
    state: 'steady',
    shards: nodes.map((node, shard) => ({ shard, node })),
    spares: [],
    replicas: nodes.map((_, shard) => ({ shard, holders: [(shard + 1) % nodes.length] })),
    swap: null,
  };
  const answer = (response: ServerResponse, status: number, body: unknown): void => {
    const data = JSON.stringify(body);
    response.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(data) });
    response.end(data);
  };
  const server = createServer((request: IncomingMessage, response: ServerResponse) => {
    request.resume();
    request.on('end', () => {
      const path = (request.url ?? '').split('?')[0] ?? '';
      if (request.method === 'POST') return answer(response, 202, { accepted: true });
      if (path === `/api/v1/jobs/${JOB}/world`) return answer(response, 200, world);
      if (path === `/api/v1/jobs/${JOB}/microbatches`) return answer(response, 400, { error: 'the job has no micro-batch plan' });
      if (path === `/api/v1/jobs/${JOB}/restore-plan`) return answer(response, 409, { error: 'no checkpoint step' });
      return answer(response, 404, { error: 'not found' });
    });
  });
  return new Promise((done) =>
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      const port = typeof address === 'object' && address !== null ? address.port : 0;
      done({ server, url: `http://127.0.0.1:${port}` });
    }),
  );
}

/** Reads each line of a child's stdout (and stderr into `errors`, for a failure's message). */
function lines(child: ChildProcess, onLine: (line: string) => void, errors: string[]): void {
  if (child.stdout !== null) createInterface({ input: child.stdout }).on('line', onLine);
  if (child.stderr !== null) createInterface({ input: child.stderr }).on('line', (line) => errors.push(line));
}

function exited(child: ChildProcess): Promise<number> {
  return new Promise((done) => {
    if (child.exitCode !== null) done(child.exitCode);
    else child.once('exit', (code) => done(code ?? 1));
  });
}

/** Starts the runtime's rendezvous store and returns its host:port once it listens. */
async function startStore(): Promise<{ child: ChildProcess; address: string }> {
  const child = spawn(PYTHON, ['-u', HOTSWAP, 'store', '--host', '127.0.0.1', '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  const errors: string[] = [];
  const address = await new Promise<string>((done, fail) => {
    lines(
      child,
      (line) => {
        if (line.startsWith('store listening on ')) done(line.slice('store listening on '.length).trim());
      },
      errors,
    );
    child.once('exit', (code) => fail(new Error(`the rendezvous store exited (${code}) before listening: ${errors.join('\n')}`)));
  });
  return { child, address };
}

function rssBytes(pid: number): number {
  try {
    const match = /^VmRSS:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return match === null ? 0 : Number(match[1]) * 1024;
  } catch {
    return 0; // exited between two samples
  }
}

const STEP_LINE = /^\[rank (\d+)\] iteration (\d+) loss \S+ compute [\d.]+s step ([\d.]+)s/;
const WAIT_LINE = /^\[probe\] rank \d+ before_sync wait ([\d.]+)s/;

/** One run of the example: 2 ranks, `steps` measured after the warm-up, with or without hot swap. */
async function runTraining(
  width: number,
  microBatchSize: number,
  hotSwap: boolean,
  steps: number,
  runIndex: number,
  scratch: string,
  store: string,
): Promise<RunFigures> {
  const nodes = Array.from({ length: RANKS }, (_, rank) => `node-${rank}`);
  const { server, url } = await worldStandIn(nodes);
  const [masterPort, ...replicaPorts] = await freePorts(RANKS + 1);
  const iterations = WARMUP_STEPS + steps;
  const replicaHosts = nodes.map((node, rank) => `${node}=127.0.0.1:${replicaPorts[rank] as number}`).join(',');
  const base = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('SLURM') && !name.startsWith('STEADFAST_')));
  const ranks = nodes.map((node, rank) => {
    const env = {
      ...base,
      RANK: String(rank),
      WORLD_SIZE: String(RANKS),
      MASTER_ADDR: '127.0.0.1',
      MASTER_PORT: String(masterPort),
      GLOO_SOCKET_IFNAME: 'lo',
      SLURM_JOB_ID: String(100 + runIndex), // the rendezvous prefix: one per run on the one store
      STEADFAST_NODE: node,
      STEADFAST_CONTROLLER_URL: url,
      STEADFAST_AGENT_URL: 'http://127.0.0.1:9', // nothing listens: step metrics are dropped alike in both modes
      STEADFAST_RENDEZVOUS: store,
      STEADFAST_REPLICA_HOSTS: replicaHosts,
      STEADFAST_STACK_DIR: scratch,
    };
    const args = [
      '-u',
      PROBE,
      '--job',
      JOB,
      '--iterations',
      String(iterations),
      '--checkpoint-every',
      String(10 * iterations),
      '--checkpoint-dir',
      join(scratch, `run-${runIndex}`),
    ];
    args.push(
      '--step-sleep',
      String(STEP_SLEEP),
      '--log-every',
      '1',
      '--width',
      String(width),
      '--micro-batch-size',
      String(microBatchSize),
      ...(hotSwap ? ['--hot-swap'] : []),
    );
    const child = spawn(PYTHON, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const figures: RankFigures = { stepSeconds: [], waitSeconds: [], peakRssBytes: 0 };
    const errors: string[] = [];
    let waits = 0;
    lines(
      child,
      (line) => {
        const wait = WAIT_LINE.exec(line);
        // One wait per step, printed before the step's line: the warm-up's are left out too.
        if (wait !== null && (waits += 1) > WARMUP_STEPS) figures.waitSeconds.push(Number(wait[1]));
        const step = STEP_LINE.exec(line);
        if (step !== null && Number(step[2]) > WARMUP_STEPS) figures.stepSeconds.push(Number(step[3]));
      },
      errors,
    );
    return { child, figures, errors };
  });
  const sampler = setInterval(() => {
    for (const rank of ranks) if (rank.child.pid !== undefined) rank.figures.peakRssBytes = Math.max(rank.figures.peakRssBytes, rssBytes(rank.child.pid));
  }, 100);
  const timeout = setTimeout(() => ranks.forEach((rank) => rank.child.kill('SIGKILL')), RUN_TIMEOUT_MS);
  try {
    const codes = await Promise.all(ranks.map((rank) => exited(rank.child)));
    codes.forEach((code, rank) => {
      if (code !== 0)
        throw new Error(`rank ${rank} (width ${width}${hotSwap ? ', hot swap' : ''}) exited ${code}:\n${(ranks[rank]?.errors ?? []).slice(-20).join('\n')}`);
    });
  } finally {
    clearInterval(sampler);
    clearTimeout(timeout);
    server.close();
  }
  const measured = ranks.flatMap((rank) => rank.figures.stepSeconds).sort((a, b) => a - b);
  const waits = ranks.flatMap((rank) => rank.figures.waitSeconds).sort((a, b) => a - b);
  if (measured.length < RANKS * steps)
    throw new Error(`width ${width}${hotSwap ? ', hot swap' : ''}: ${measured.length} step lines, expected ${RANKS * steps}`);
  return {
    width,
    hotSwap,
    medianStepSeconds: quantile(measured, 0.5),
    medianWaitSeconds: waits.length === 0 ? null : quantile(waits, 0.5),
    peakRssBytes: ranks.reduce((sum, rank) => sum + rank.figures.peakRssBytes, 0) / RANKS,
  };
}

/** The example's model: Linear(32, width), Tanh, Linear(width, 1), in float32; plain SGD keeps no state of its own. */
function stateBytes(width: number): number {
  return (32 * width + width + width + 1) * 4;
}

const MiB = 2 ** 20;
const ms = (seconds: number): string => `${(seconds * 1000).toFixed(1)} ms`;
const mib = (bytes: number): string => `${(bytes / MiB).toFixed(1)} MiB`;

async function main(): Promise<void> {
  const scratch = mkdtempSync(join(tmpdir(), 'steadfast-hot-swap-bench-'));
  const store = await startStore();
  let runIndex = 0;
  const pair = async (width: number, microBatchSize: number, steps: number): Promise<{ base: RunFigures; swap: RunFigures }> => {
    const base = await runTraining(width, microBatchSize, false, steps, (runIndex += 1), scratch, store.address);
    const swap = await runTraining(width, microBatchSize, true, steps, (runIndex += 1), scratch, store.address);
    return { base, swap };
  };
  try {
    console.log(`hot swap per-step overhead: examples/pytorch/train.py, ${RANKS} gloo ranks on 127.0.0.1, ${cpus().length} cores, ${PYTHON}`);
    console.log(`stand-in compute ${STEP_SLEEP * 4 * 1000} ms a step (4 micro-batches × ${STEP_SLEEP * 1000} ms); ${WARMUP_STEPS} warm-up steps left out`);
    const { base, swap } = await pair(BASE_WIDTH, 32, MEASURED_STEPS);
    console.log(
      `\nwidth ${BASE_WIDTH} (the example's model, state ${(stateBytes(BASE_WIDTH) / 1024).toFixed(1)} KiB), median over ${MEASURED_STEPS} steps of each rank:`,
    );
    console.log(
      `  step without hot swap ${ms(base.medianStepSeconds)}, with ${ms(swap.medianStepSeconds)}: ratio ${(swap.medianStepSeconds / base.medianStepSeconds).toFixed(3)}`,
    );
    if (swap.medianWaitSeconds !== null) console.log(`  before_sync wait (median) ${ms(swap.medianWaitSeconds)}`);
    console.log(
      `  peak resident memory per rank: without ${mib(base.peakRssBytes)}, with ${mib(swap.peakRssBytes)} (+${mib(swap.peakRssBytes - base.peakRssBytes)})`,
    );

    console.log(
      `\nwidth sweep (${SWEEP_MICRO_BATCH_SIZE} sample a micro-batch, ${SWEEP_MEASURED_STEPS} steps each; held = 2 buffers of the rank's state + 2 replicas of the other's ≈ 4 × state):`,
    );
    console.log('      width      state   4 × state   step without   step with   ratio   before_sync wait   extra memory per rank');
    let slower: number | null = null;
    for (const width of SWEEP_WIDTHS) {
      const run = await pair(width, SWEEP_MICRO_BATCH_SIZE, SWEEP_MEASURED_STEPS);
      const ratio = run.swap.medianStepSeconds / run.base.medianStepSeconds;
      const wait = run.swap.medianWaitSeconds ?? 0;
      console.log(
        `  ${String(width).padStart(9)} ${mib(stateBytes(width)).padStart(10)} ${mib(4 * stateBytes(width)).padStart(11)} ${ms(run.base.medianStepSeconds).padStart(14)} ` +
          `${ms(run.swap.medianStepSeconds).padStart(11)} ${ratio.toFixed(3).padStart(7)} ${ms(wait).padStart(18)}   ${mib(run.swap.peakRssBytes - run.base.peakRssBytes).padStart(10)}`,
      );
      if (ratio > SLOWER && slower === null) slower = width;
      if (wait > WAITS * run.base.medianStepSeconds) {
        console.log(`  the replica no longer fits inside the step at width ${width}: before_sync waits ${ms(wait)} (median), the step ×${ratio.toFixed(2)}`);
        break;
      }
    }
    if (slower !== null) console.log(`  the step is first ${Math.round((SLOWER - 1) * 100)} % slower than without hot swap at width ${slower}`);
  } finally {
    store.child.kill('SIGTERM');
    await exited(store.child);
    rmSync(scratch, { recursive: true, force: true });
  }
}

await main();
