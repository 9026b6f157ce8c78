import { constants as fsConstants } from 'node:fs';
import { lstat, open, readdir, readFile, readlink, type FileHandle } from 'node:fs/promises';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import { errorMessage } from '../../core/errors.js';
import { errnoCode } from '../log-follower.js';
import { CLOCK_TICKS_PER_SECOND, parseStatLine, type ProcessEntry } from './proc-tree.js';
import type { PySpyDump, PySpyTarget } from './pyspy-dump.js';

/**
 * Stacks without py-spy: a rank that registered CPython's faulthandler on SIGUSR1 (the Python
 * client's `enable_stack_dumps`, clients/python/steadfast_client.py) writes every thread's stack
 * to `<dir>/<job>-rank<rank>-pid<pid>.stacks` when it gets the signal, from a C signal handler,
 * so even a rank stuck in C code with the GIL held answers. This module signals each rank and
 * returns what its file grew by, in py-spy's result shape.
 *
 * SIGUSR1 ends a process that has no handler for it. So a process is signalled only when the
 * procfs read is the agent's own pid namespace (`<procfs>/self` is the agent: a pid read from a
 * host's /proc mounted into a container names another process there), its
 * /proc/<pid>/status says it catches SIGUSR1 (SigCgt), its dump file exists, and it is still the
 * process the caller classified (same start time, read again right before the signal). The
 * dump file must be a regular file (not a link) owned by the process's user and written since the
 * process started: a file another user planted under the rank's name is never read, and the file
 * of an earlier process that had the same pid does not make its successor a target.
 */

export interface FaulthandlerTarget extends PySpyTarget {
  /** From /proc/<pid>/stat: the pid together with it names one process, across pid reuse. */
  readonly startTimeTicks: number;
  /** Where to look for `*-pid<pid>.stacks`, in order (see stackDirectories). */
  readonly directories: readonly string[];
}

export interface FaulthandlerOptions {
  readonly procfs: string;
  /** When every dump must be over, counted from the call. */
  readonly deadlineMs: number;
  /** The file has its dump once it stopped growing this long. faulthandler writes it at once, from the handler. */
  readonly settleMs?: number;
  readonly pollMs?: number;
  readonly signal?: AbortSignal | undefined;
}

/** The client's file name for a process (clients/python/steadfast_client.py, enable_stack_dumps). */
const FILE_SUFFIX = (pid: number): string => `-pid${pid}.stacks`;
const CLIENT_DIRECTORY = 'steadfast-stacks';
/** A dump of hundreds of threads stays well under it (faulthandler stops at 100 threads × 100 frames). */
const MAX_DUMP_BYTES = 8 * 1024 * 1024;
const DEFAULT_SETTLE_MS = 100;
/** How many settle periods of quiet end a dump that shows no `Current thread` block yet. */
const INCOMPLETE_QUIET_FACTOR = 10;
/** faulthandler heads the block of the thread that took the signal `Current thread 0x…`. */
const CURRENT_THREAD = /^Current thread 0x[0-9a-f]+ /m;
const DEFAULT_POLL_MS = 20;

/**
 * The directories a rank's dump file may be in. With `--process.stack-dir`, that one (a path as
 * the agent sees it). Otherwise the client's own choice, read from the rank's environment:
 * $STEADFAST_STACK_DIR, else $TMPDIR (or $TEMP, $TMP)/steadfast-stacks, else
 * /tmp/steadfast-stacks; each seen through `<procfs>/<pid>/root`, so that a rank in a container
 * is found in its own mount namespace.
 */
export function stackDirectories(procfs: string, entry: Pick<ProcessEntry, 'pid' | 'environment'>, configured: string | undefined): string[] {
  if (configured !== undefined) return [configured];
  const inProcess = (dir: string): string => join(procfs, String(entry.pid), 'root', dir);
  const environment = entry.environment;
  if (environment?.stackDirectory !== undefined) return [inProcess(environment.stackDirectory)];
  const dirs = environment?.tempDirectory === undefined ? [] : [inProcess(join(environment.tempDirectory, CLIENT_DIRECTORY))];
  const fallback = inProcess(join('/tmp', CLIENT_DIRECTORY));
  return dirs.includes(fallback) ? dirs : [...dirs, fallback];
}

/**
 * What /proc/<pid>/status says about signals and the user: SigCgt (a hex mask), the effective
 * uid, and `NSpid`'s last field, the pid the process has in its own pid namespace (a rank in a
 * container knows itself by it, and names its dump file with it).
 */
export function parseSignalStatus(status: string): { caught: bigint; uid: number; namespacePid?: number } | undefined {
  const caught = /^SigCgt:\s*([0-9a-fA-F]{1,16})\s*$/m.exec(status)?.[1];
  const uid = /^Uid:\s*\d+\s+(\d+)/m.exec(status)?.[1];
  if (caught === undefined || uid === undefined) return undefined;
  const namespacePid = /^NSpid:((?:\s+\d{1,10})+)\s*$/m.exec(status)?.[1]?.trim().split(/\s+/).at(-1);
  return { caught: BigInt(`0x${caught}`), uid: Number(uid), ...(namespacePid === undefined ? {} : { namespacePid: Number(namespacePid) }) };
}

function catches(caught: bigint, signal: number): boolean {
  return ((caught >> BigInt(signal - 1)) & 1n) === 1n;
}

class TargetError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TargetError';
  }
}

async function readProc(procfs: string, pid: number, file: string): Promise<string> {
  try {
    return await readFile(join(procfs, String(pid), file), 'utf8');
  } catch (error) {
    throw new TargetError(`process ${pid} is gone or unreadable (${errnoCode(error) ?? errorMessage(error)})`);
  }
}

/** Boot time (`btime` of <procfs>/stat, seconds since the epoch), to turn a process's start ticks into a time. */
export function parseBootTime(stat: string): number | undefined {
  const seconds = /^btime (\d{1,12})$/m.exec(stat)?.[1];
  return seconds === undefined ? undefined : Number(seconds);
}

/** btime is whole seconds: a file written in the process's first second may look a little older. */
const START_SLACK_MS = 1000;

/**
 * The newest `*-pid<pid>.stacks` that is a regular file owned by `uid` and modified since the
 * process started (`startedAtMs`), opened without following links.
 */
async function openDumpFile(
  target: FaulthandlerTarget,
  uid: number,
  startedAtMs: number,
  namespacePid: number | undefined,
): Promise<{ path: string; handle: FileHandle }> {
  // The rank names its file with its pid as it sees it: in a container, not the agent's.
  const suffixes = [...new Set([FILE_SUFFIX(target.pid), FILE_SUFFIX(namespacePid ?? target.pid)])];
  const suffix = suffixes.join(' or *');
  let best: { path: string; modified: number } | undefined;
  for (const dir of target.directories) {
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      // Not there (or not ours to list): the next directory.
      continue;
    }
    for (const name of names) {
      if (!suffixes.some((candidate) => name.endsWith(candidate))) continue;
      const path = join(dir, name);
      const info = await lstat(path).catch(() => undefined);
      if (info === undefined || !info.isFile() || info.uid !== uid || info.mtimeMs < startedAtMs - START_SLACK_MS) continue;
      if (best === undefined || info.mtimeMs > best.modified) best = { path, modified: info.mtimeMs };
    }
  }
  if (best === undefined) {
    throw new TargetError(
      `no faulthandler dump file *${suffix} of the process's user, written since it started, in ${target.directories.join(', ')}; not signalled`,
    );
  }
  const path = best.path;
  const handle = await open(path, fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW).catch((error: unknown) => {
    throw new TargetError(`cannot open ${path}: ${errorMessage(error)}`);
  });
  try {
    const info = await handle.stat();
    if (info.isFile() && info.uid === uid) return { path, handle };
  } catch {
    // Treated as changed, below.
  }
  await handle.close();
  throw new TargetError(`${path} changed while it was opened; not signalled`);
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done(): void {
      clearTimeout(timer);
      signal?.removeEventListener('abort', done);
      resolve();
    }
    signal?.addEventListener('abort', done, { once: true });
  });
}

/** Why pids read from `procfs` cannot be signalled from here, or undefined when they can. */
async function foreignPidNamespace(procfs: string): Promise<string | undefined> {
  let self: string;
  try {
    self = await readlink(join(procfs, 'self'));
  } catch (error) {
    return `not signalled: cannot tell whether ${procfs} is this agent's pid namespace (${errnoCode(error) ?? errorMessage(error)})`;
  }
  if (self === String(process.pid)) return undefined;
  return `not signalled: ${procfs} is not this agent's pid namespace (its self is ${self}, the agent is ${process.pid}); run the agent in the ranks' pid namespace (hostPID) to take faulthandler dumps`;
}

/** Signals one rank and waits for its dump; throws TargetError with what went wrong. */
async function dumpOne(target: FaulthandlerTarget, options: FaulthandlerOptions, deadline: number, bootTime: number): Promise<string> {
  const sigusr1 = osConstants.signals.SIGUSR1;
  const status = parseSignalStatus(await readProc(options.procfs, target.pid, 'status'));
  if (status === undefined) throw new TargetError(`cannot read the signal mask of process ${target.pid}`);
  if (!catches(status.caught, sigusr1)) {
    throw new TargetError(
      `process ${target.pid} has no SIGUSR1 handler (the training script did not call enable_stack_dumps()); not signalled, as SIGUSR1 would end it`,
    );
  }
  const startedAtMs = (bootTime + target.startTimeTicks / CLOCK_TICKS_PER_SECOND) * 1000;
  const { path, handle } = await openDumpFile(target, status.uid, startedAtMs, status.namespacePid);
  try {
    const start = (await handle.stat()).size;
    // The process the caller classified, and no other that took its pid since.
    const stat = parseStatLine(await readProc(options.procfs, target.pid, 'stat'));
    if (stat?.startTimeTicks !== target.startTimeTicks) throw new TargetError(`process ${target.pid} exited before it could be signalled`);
    try {
      process.kill(target.pid, sigusr1);
    } catch (error) {
      throw new TargetError(`cannot signal process ${target.pid}: ${errnoCode(error) ?? errorMessage(error)}`);
    }
    const settleMs = options.settleMs ?? DEFAULT_SETTLE_MS;
    let size = start;
    let stableSince = Date.now();
    while (!options.signal?.aborted) {
      const now = Date.now();
      const current = (await handle.stat()).size;
      if (current !== size) {
        size = current;
        stableSince = now;
      } else if (size > start && now - stableSince >= settleMs) {
        // A rank descheduled mid-dump (a loaded node) pauses between threads: the dump is whole
        // once it holds the signalled thread's block, or after a long quiet without one.
        if (now - stableSince >= settleMs * INCOMPLETE_QUIET_FACTOR || (await holdsCurrentThread(handle, start, size))) break;
      }
      if (now >= deadline) break;
      await sleep(Math.min(options.pollMs ?? DEFAULT_POLL_MS, Math.max(1, deadline - now)), options.signal);
    }
    if (options.signal?.aborted) throw new TargetError('cancelled: the agent is shutting down');
    // A file cut short meanwhile was rewritten from its start.
    const from = size < start ? 0 : start;
    if (size <= from)
      throw new TargetError(`no dump appeared in ${path} within ${(options.deadlineMs / 1000).toFixed(1)} s of SIGUSR1 (is SIGUSR1 blocked in the process?)`);
    const length = Math.min(size - from, MAX_DUMP_BYTES);
    const buffer = Buffer.alloc(length);
    const { bytesRead } = await handle.read(buffer, 0, length, from);
    return buffer.toString('utf8', 0, bytesRead);
  } finally {
    await handle.close();
  }
}

/**
 * Takes a faulthandler dump of every target at once (so that the stacks of a hang are taken
 * at about the same moment); always resolves, with one entry per target in the order given.
 */
export async function dumpWithFaulthandler(targets: readonly FaulthandlerTarget[], options: FaulthandlerOptions): Promise<PySpyDump[]> {
  const deadline = Date.now() + options.deadlineMs;
  const foreign = await foreignPidNamespace(options.procfs);
  if (foreign !== undefined) return targets.map(({ pid, role, rank }) => ({ pid, role, rank, ok: false, error: foreign }));
  const bootTime = parseBootTime(await readFile(join(options.procfs, 'stat'), 'utf8').catch(() => ''));
  if (bootTime === undefined) {
    const error = `not signalled: no boot time in ${join(options.procfs, 'stat')}, so a dump file cannot be told from an earlier process's`;
    return targets.map(({ pid, role, rank }) => ({ pid, role, rank, ok: false, error }));
  }
  return Promise.all(
    targets.map(async (target): Promise<PySpyDump> => {
      const { pid, role, rank } = target;
      try {
        return { pid, role, rank, ok: true, dump: await dumpOne(target, options, deadline, bootTime) };
      } catch (error) {
        return { pid, role, rank, ok: false, error: error instanceof TargetError ? error.message : `faulthandler dump failed: ${errorMessage(error)}` };
      }
    }),
  );
}

/** Whether the bytes the file grew by hold the signalled thread's block. */
async function holdsCurrentThread(handle: FileHandle, start: number, size: number): Promise<boolean> {
  const length = Math.min(Math.max(0, size - start), MAX_DUMP_BYTES);
  const buffer = Buffer.alloc(length);
  const { bytesRead } = await handle.read(buffer, 0, length, start);
  return CURRENT_THREAD.test(buffer.toString('utf8', 0, bytesRead));
}
