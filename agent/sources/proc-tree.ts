import { readFileSync } from 'node:fs';
import { readdir, readFile } from 'node:fs/promises';
import { basename, join } from 'node:path';

/**
 * The training job's process tree, read from procfs and classified by role. Pure apart from
 * readProcessTable: classification works on a table, so tests need no procfs at all.
 *
 * What is detected, and how:
 * - launcher: torchrun, `python -m torch.distributed.run|launch`, deepspeed (its runner and
 *   `deepspeed.launcher.launch`), recognised by the command line (the comm of a process that
 *   imported torch is `pt_main_thread`, so the comm says nothing). A Python process started by
 *   slurmstepd is a launcher when it matches those, a rank otherwise (`srun python train.py`,
 *   one task per GPU).
 * - rank: a child of a launcher; a process with a compute context on a GPU (nvidia-smi lists
 *   it), whatever its environment (`python3 train.py` started with no rank variables); else a
 *   Python process whose environ names RANK, LOCAL_RANK or SLURM_PROCID (reading environ needs
 *   the agent to run as the job's user or root; an unreadable environ means "unknown", not "no").
 * - launcher, too: a Python process that holds no GPU itself but whose children do (a script
 *   that starts its ranks with torch.multiprocessing.spawn).
 * - dataloader: a child of a rank whose comm is `pt_data_worker` (PyTorch names its workers so),
 *   whose command line is the rank's own (forked workers), or a multiprocessing spawn/forkserver
 *   child.
 * - checkpoint_writer: a child of a rank whose comm or command line names `ckpt`/`checkpoint`
 *   (process-based async savers). Thread-based async saves (torch.distributed.checkpoint's
 *   default async_save, Megatron's threaded writer) are threads of the rank and are not
 *   counted: only processes are classified here.
 * Other children of ranks (compile workers, shells) and everything below a dataloader or a
 * checkpoint writer are left out of the tree.
 */

export type ProcessRole = 'launcher' | 'rank' | 'dataloader' | 'checkpoint_writer';
export const PROCESS_ROLES: readonly ProcessRole[] = ['launcher', 'rank', 'dataloader', 'checkpoint_writer'];

/** USER_HZ; 100 on every Linux architecture a GPU node runs. */
export const CLOCK_TICKS_PER_SECOND = 100;

/** The fields of /proc/<pid>/stat this module uses (proc(5)). */
export interface ProcStat {
  readonly pid: number;
  readonly comm: string;
  /** R, S, D, Z, T, t, X, I… */
  readonly state: string;
  readonly ppid: number;
  readonly utimeTicks: number;
  readonly stimeTicks: number;
  readonly numThreads: number;
  /** Clock ticks after boot; with the pid, identifies one process across pid reuse. */
  readonly startTimeTicks: number;
}

/**
 * Parses one /proc/<pid>/stat line, or returns undefined. The comm may hold spaces and
 * parentheses (`((sd-pam))`, `tmux: server`), so it ends at the LAST `)`. Never throws.
 */
export function parseStatLine(text: string): ProcStat | undefined {
  const open = text.indexOf('(');
  const close = text.lastIndexOf(')');
  if (open < 1 || close < open) return undefined;
  const pid = strictInteger(text.slice(0, open).trim());
  // After the comm: state (field 3) ppid (4) … utime (14) stime (15) … num_threads (20) … starttime (22).
  const fields = text
    .slice(close + 1)
    .trim()
    .split(/\s+/);
  const state = fields[0];
  const ppid = strictInteger(fields[1]);
  const utimeTicks = strictInteger(fields[11]);
  const stimeTicks = strictInteger(fields[12]);
  const numThreads = strictInteger(fields[17]);
  const startTimeTicks = strictInteger(fields[19]);
  if (pid === undefined || state === undefined || !/^[A-Za-z]$/.test(state) || ppid === undefined) return undefined;
  if (utimeTicks === undefined || stimeTicks === undefined || numThreads === undefined || startTimeTicks === undefined) return undefined;
  return { pid, comm: text.slice(open + 1, close), state, ppid, utimeTicks, stimeTicks, numThreads, startTimeTicks };
}

function strictInteger(text: string | undefined): number | undefined {
  if (text === undefined || !/^-?\d{1,19}$/.test(text)) return undefined;
  const value = Number(text);
  return Number.isSafeInteger(value) ? value : undefined;
}

/** VmRSS from /proc/<pid>/status in bytes; undefined when absent (zombies, kernel threads). */
export function parseResidentBytes(status: string): number | undefined {
  const match = /^VmRSS:\s+(\d+)\s+kB$/m.exec(status);
  return match?.[1] === undefined ? undefined : Number(match[1]) * 1024;
}

/** Rank identity found in a process's environment, and where the rank writes its stack dumps. */
export interface RankEnvironment {
  readonly rank?: number | undefined;
  readonly localRank?: number | undefined;
  /** srun sets SLURM_PROCID on every task; it is the global rank when srun starts the ranks. */
  readonly slurmProcId?: number | undefined;
  /** STEADFAST_STACK_DIR, where the Python client writes faulthandler dumps; absolute paths only. */
  readonly stackDirectory?: string | undefined;
  /** TMPDIR, else TEMP, else TMP (Python's tempfile order): the client's default is `<it>/steadfast-stacks`. */
  readonly tempDirectory?: string | undefined;
}

/** A directory named in an environment variable: absolute, of sane length, or nothing. */
function absoluteDirectory(value: string | undefined): string | undefined {
  return value !== undefined && value.startsWith('/') && value.length <= 4096 ? value : undefined;
}

/** Reads RANK, LOCAL_RANK, SLURM_PROCID and the stack dump directories from a NUL-separated /proc/<pid>/environ. */
export function parseRankEnvironment(environ: string): RankEnvironment {
  const values = new Map<string, string>();
  for (const entry of environ.split('\0')) {
    const equals = entry.indexOf('=');
    if (equals > 0) values.set(entry.slice(0, equals), entry.slice(equals + 1));
  }
  const read = (name: string): number | undefined => {
    const value = strictInteger(values.get(name));
    return value !== undefined && value >= 0 ? value : undefined;
  };
  const temp = ['TMPDIR', 'TEMP', 'TMP'].map((name) => values.get(name)).find((value) => value !== undefined && value !== '');
  return {
    rank: read('RANK'),
    localRank: read('LOCAL_RANK'),
    slurmProcId: read('SLURM_PROCID'),
    stackDirectory: absoluteDirectory(values.get('STEADFAST_STACK_DIR') || undefined),
    tempDirectory: absoluteDirectory(temp),
  };
}

export interface ProcessEntry extends ProcStat {
  /** Command line split at NUL; empty for zombies and kernel threads. */
  readonly argv: readonly string[];
  readonly residentBytes?: number | undefined;
  /** undefined: environ could not be read (permission, the process exited). */
  readonly environment?: RankEnvironment | undefined;
}

/** What does not change during a process's life, kept between scrapes. */
interface CachedIdentity {
  readonly startTimeTicks: number;
  readonly argv: readonly string[];
  readonly environment: RankEnvironment | undefined;
}

/**
 * Remembers each process's command line and environment by (pid, start time). Reading
 * /proc/<pid>/cmdline or environ takes the process's mmap lock and can block behind a process
 * stuck in D state; reading them once per process keeps a later scrape from hanging on it.
 */
export class ProcessIdentityCache {
  private readonly entries = new Map<number, CachedIdentity>();

  get(pid: number, startTimeTicks: number): CachedIdentity | undefined {
    const cached = this.entries.get(pid);
    return cached?.startTimeTicks === startTimeTicks ? cached : undefined;
  }

  set(pid: number, identity: CachedIdentity): void {
    this.entries.set(pid, identity);
  }

  /** Forgets processes that are gone. */
  retain(pids: ReadonlySet<number>): void {
    for (const pid of this.entries.keys()) if (!pids.has(pid)) this.entries.delete(pid);
  }
}

async function readText(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, 'utf8');
  } catch {
    // The process exited between readdir and here, or the file is not ours to read: both mean "unknown".
    return undefined;
  }
}

/**
 * `stat` and `status`, read at every scrape for every process, are read synchronously: the
 * kernel writes them from the task's counters without the locks of its memory map, so a read
 * never waits on the process, and a few hundred small reads take a few milliseconds, against
 * five times that through libuv's thread pool (four round trips a file), which matters on a
 * loaded node. `cmdline` and `environ` do take the target's memory-map lock, so they stay off
 * the event loop (and are read once per process: ProcessIdentityCache).
 */
function readCounters(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8');
  } catch {
    return undefined;
  }
}

async function readProcess(procfs: string, pid: number, cache: ProcessIdentityCache | undefined): Promise<ProcessEntry | undefined> {
  const dir = join(procfs, String(pid));
  const statText = readCounters(join(dir, 'stat'));
  const stat = statText === undefined ? undefined : parseStatLine(statText);
  if (stat === undefined) return undefined;
  let identity = cache?.get(pid, stat.startTimeTicks);
  if (identity === undefined) {
    const [cmdline, environ] = await Promise.all([readText(join(dir, 'cmdline')), readText(join(dir, 'environ'))]);
    identity = {
      startTimeTicks: stat.startTimeTicks,
      argv: (cmdline ?? '').split('\0').filter((arg, index, all) => arg !== '' || index < all.length - 1),
      environment: environ === undefined ? undefined : parseRankEnvironment(environ),
    };
    // A zombie's cmdline is empty for good; a live process's is only empty while it execs.
    if (identity.argv.length > 0 || stat.state === 'Z') cache?.set(pid, identity);
  }
  const status = readCounters(join(dir, 'status'));
  return { ...stat, argv: identity.argv, environment: identity.environment, residentBytes: status === undefined ? undefined : parseResidentBytes(status) };
}

/** Reads every numeric directory under `procfs`. Throws only when `procfs` itself cannot be listed. */
export async function readProcessTable(procfs: string, cache?: ProcessIdentityCache): Promise<ProcessEntry[]> {
  const names = await readdir(procfs);
  const pids = names.filter((name) => /^\d+$/.test(name)).map(Number);
  const entries = await Promise.all(pids.map((pid) => readProcess(procfs, pid, cache)));
  cache?.retain(new Set(pids));
  return entries.filter((entry): entry is ProcessEntry => entry !== undefined);
}

export interface TrainingProcess {
  readonly process: ProcessEntry;
  readonly role: ProcessRole;
  /** Global rank when known (RANK, SLURM_PROCID, --local-rank); a worker carries its rank's. */
  readonly rank?: number | undefined;
}

export interface TrainingTree {
  /** Every classified process, parents before children. */
  readonly processes: readonly TrainingProcess[];
  byPid(pid: number): TrainingProcess | undefined;
}

const PYTHON = /^python[\d.]*$/;
const LAUNCHER_MODULES = new Set(['torch.distributed.run', 'torch.distributed.launch', 'deepspeed.launcher.launch', 'deepspeed.launcher.runner']);
const LAUNCHER_SCRIPTS = new Set(['torchrun', 'deepspeed']);
/** Python options that take a value as the next argument. */
const PYTHON_OPTIONS_WITH_VALUE = new Set(['-W', '-X', '--check-hash-based-pycs']);

/** What a Python command line runs: a module (`-m x`), a script, or inline code (`-c`). */
function pythonTarget(argv: readonly string[]): { module: string } | { script: string } | { code: string } | undefined {
  for (let index = 1; index < argv.length; index += 1) {
    const arg = argv[index] ?? '';
    if (arg === '-m') return { module: argv[index + 1] ?? '' };
    if (arg.startsWith('-m') && arg.length > 2) return { module: arg.slice(2) };
    if (arg === '-c') return { code: argv[index + 1] ?? '' };
    if (PYTHON_OPTIONS_WITH_VALUE.has(arg)) index += 1;
    else if (!arg.startsWith('-')) return { script: arg };
  }
  return undefined;
}

function isPython(entry: ProcessEntry): boolean {
  const program = basename(entry.argv[0] ?? '');
  return PYTHON.test(program) || PYTHON.test(entry.comm) || entry.comm === 'pt_main_thread';
}

export function isLauncher(entry: ProcessEntry): boolean {
  const program = basename(entry.argv[0] ?? '');
  if (LAUNCHER_SCRIPTS.has(program) || LAUNCHER_SCRIPTS.has(entry.comm)) return true;
  if (!isPython(entry)) return false;
  const target = pythonTarget(entry.argv);
  if (target === undefined) return false;
  if ('module' in target) return LAUNCHER_MODULES.has(target.module);
  return 'script' in target && LAUNCHER_SCRIPTS.has(basename(target.script));
}

const CHECKPOINT = /ckpt|checkpoint/i;
const MULTIPROCESSING_CHILD = /multiprocessing\.(spawn|forkserver)|--multiprocessing-fork/;

function sameCommandLine(a: readonly string[], b: readonly string[]): boolean {
  return a.length > 0 && a.length === b.length && a.every((arg, index) => arg === b[index]);
}

function childOfRankRole(child: ProcessEntry, rank: ProcessEntry): ProcessRole | undefined {
  if (CHECKPOINT.test(child.comm)) return 'checkpoint_writer';
  if (child.comm === 'pt_data_worker') return 'dataloader';
  if (sameCommandLine(child.argv, rank.argv)) return 'dataloader';
  // Compared after "same command line": a rank's own arguments often name a checkpoint directory.
  if (child.argv.some((arg) => CHECKPOINT.test(arg))) return 'checkpoint_writer';
  if (child.argv.some((arg) => MULTIPROCESSING_CHILD.test(arg))) return 'dataloader';
  return undefined;
}

/** `--local-rank=3`, `--local_rank 3`: what torch.distributed.launch passes without --use-env. */
function rankFromArguments(argv: readonly string[]): number | undefined {
  for (let index = 0; index < argv.length; index += 1) {
    const match = /^--local[-_]rank(?:=(\d+))?$/.exec(argv[index] ?? '');
    if (!match) continue;
    const value = strictInteger(match[1] ?? argv[index + 1]);
    if (value !== undefined && value >= 0) return value;
  }
  return undefined;
}

function rankOf(entry: ProcessEntry): number | undefined {
  const environment = entry.environment;
  return environment?.rank ?? environment?.slurmProcId ?? environment?.localRank ?? rankFromArguments(entry.argv);
}

function hasRankEnvironment(entry: ProcessEntry): boolean {
  const environment = entry.environment;
  return environment?.rank !== undefined || environment?.localRank !== undefined;
}

/** Which processes hold a GPU, and which have children that do. */
interface GpuHolders {
  readonly holders: ReadonlySet<number>;
  readonly parents: ReadonlySet<number>;
}

/** The role of a process given its parent's classification, or undefined when it is not part of training. */
function roleOf(entry: ProcessEntry, parent: ProcessEntry | undefined, parentRole: ProcessRole | undefined, gpus: GpuHolders): ProcessRole | undefined {
  if (parentRole === 'rank' && parent !== undefined) return childOfRankRole(entry, parent);
  if (parentRole === 'dataloader' || parentRole === 'checkpoint_writer') return undefined;
  if (isLauncher(entry)) return 'launcher';
  if (gpus.holders.has(entry.pid)) return 'rank';
  // Every child of torchrun is a rank; of a launcher known only by its ranks' GPUs, those ranks
  // (and any with rank variables), not its helpers (multiprocessing's resource tracker).
  if (parentRole === 'launcher') return parent !== undefined && !isLauncher(parent) && !hasRankEnvironment(entry) ? undefined : 'rank';
  if (!isPython(entry)) return undefined;
  if (gpus.parents.has(entry.pid)) return 'launcher';
  if (hasRankEnvironment(entry)) return 'rank';
  if (parent?.comm === 'slurmstepd') return 'rank';
  return undefined;
}

/**
 * Classifies a process table, walking down from the processes whose parent is not in it.
 * `gpuPids`: the processes with a compute context on a GPU (GpuProcessBoard.computePids), pids of
 * the same namespace as the table.
 */
export function classifyTrainingTree(table: readonly ProcessEntry[], gpuPids: ReadonlySet<number> = new Set()): TrainingTree {
  const byPid = new Map(table.map((entry) => [entry.pid, entry]));
  const holders = new Set([...gpuPids].filter((pid) => byPid.has(pid)));
  const gpus: GpuHolders = { holders, parents: new Set([...holders].map((pid) => byPid.get(pid)?.ppid ?? 0).filter((ppid) => !holders.has(ppid))) };
  const children = new Map<number, ProcessEntry[]>();
  for (const entry of table) {
    if (entry.ppid === entry.pid) continue;
    const siblings = children.get(entry.ppid) ?? [];
    siblings.push(entry);
    children.set(entry.ppid, siblings);
  }
  const classified: TrainingProcess[] = [];
  const visited = new Set<number>();
  interface Visit {
    readonly entry: ProcessEntry;
    readonly parentEntry: ProcessEntry | undefined;
    readonly parent: TrainingProcess | undefined;
    /** An ancestor is classified: what is below an unclassified process here (a compile worker) stays out. */
    readonly insideTraining: boolean;
  }
  const stack: Visit[] = table
    .filter((entry) => entry.ppid === entry.pid || !byPid.has(entry.ppid))
    .sort((a, b) => b.pid - a.pid)
    .map((entry) => ({ entry, parentEntry: undefined, parent: undefined, insideTraining: false }));
  while (stack.length > 0) {
    const { entry, parentEntry, parent, insideTraining } = stack.pop()!;
    if (visited.has(entry.pid)) continue;
    visited.add(entry.pid);
    const role = insideTraining && parent === undefined ? undefined : roleOf(entry, parentEntry, parent?.role, gpus);
    let node: TrainingProcess | undefined;
    if (role !== undefined) {
      const rank = role === 'launcher' ? undefined : role === 'rank' ? rankOf(entry) : parent?.rank;
      node = { process: entry, role, rank };
      classified.push(node);
    }
    const below = [...(children.get(entry.pid) ?? [])].sort((a, b) => b.pid - a.pid);
    for (const child of below) stack.push({ entry: child, parentEntry: entry, parent: node, insideTraining: insideTraining || node !== undefined });
  }
  const index = new Map(classified.map((node) => [node.process.pid, node]));
  return { processes: classified, byPid: (pid) => index.get(pid) };
}
