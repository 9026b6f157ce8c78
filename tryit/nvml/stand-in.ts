import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { appendFileSync, existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { appendFile, copyFile, link, mkdir, readFile, rename, writeFile as writeFileAsync } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

/**
 * The stand-in libnvidia-ml.so.1 (stand-in.c) for machines without an NVIDIA driver: compiled
 * once per source with the system's C compiler (Debian's gcc), cached in the temp directory, and
 * copied into a directory of its own per simulated node, where its scripted state lives (one
 * library copy per directory: the dynamic loader would share one path between callers).
 */

const execFileAsync = promisify(execFile);
export const STAND_IN_LIBRARY = 'libnvidia-ml.so.1';

const SOURCES = ['stand-in.c', 'stand-in-events.c', 'stand-in.h'];

/** The directory of stand-in.c and its companions: beside this file, or (from dist/tryit/nvml) in the source tree. */
function sourceDir(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [here, join(here, '..', '..', '..', 'tryit', 'nvml')];
  const found = candidates.find((candidate) => existsSync(join(candidate, 'stand-in.c')));
  if (found === undefined) throw new Error(`stand-in.c not found (looked in ${candidates.join(', ')})`);
  return found;
}

/**
 * The driver branch whose NVML symbols the library exports: `current` (every entry point
 * steadfast calls), `r470` (an NVML 11.4 library: no _v3 process lists, no memory v2, no fabric or
 * versioned temperature calls, the old "throttle" names) or `r450` (also no _v2 process lists).
 */
export type StandInDriver = 'current' | 'r470' | 'r450';

const DRIVER_DEFINES: Readonly<Record<StandInDriver, readonly string[]>> = {
  current: [],
  r470: ['-DSTAND_IN_DRIVER=470'],
  r450: ['-DSTAND_IN_DRIVER=450'],
};

const built = new Map<StandInDriver, Promise<string>>();
let held: { dir: string; count: number } | undefined;

/**
 * Keeps a hard link to every copy until this process exits. The dynamic loader knows a library
 * by its device and inode: a test's copy deleted while still mapped (a library whose NVML thread
 * was left stuck is never unloaded) frees its inode, a later copy may get the same number, and
 * dlopen would then hand back the old library, reading the old directory's state.
 */
async function holdUntilExit(library: string): Promise<void> {
  if (held === undefined) {
    const dir = join(tmpdir(), 'steadfast-nvml-stand-in', `held-${process.pid}`);
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    held = { dir, count: 0 };
    process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
  }
  await link(library, join(held.dir, String(held.count++)));
}

/** The compiled stand-in (built on first use, then cached by the source's hash and the driver branch). */
export function buildStandInNvml(driver: StandInDriver = 'current'): Promise<string> {
  const cached = built.get(driver);
  if (cached !== undefined) return cached;
  const building = (async () => {
    const dir = sourceDir();
    const digest = createHash('sha256');
    for (const name of SOURCES) digest.update(name).update(await readFile(join(dir, name)));
    digest.update(driver);
    const hash = digest.digest('hex').slice(0, 16);
    const cache = join(tmpdir(), 'steadfast-nvml-stand-in', hash);
    const library = join(cache, STAND_IN_LIBRARY);
    if (existsSync(library)) return library;
    await mkdir(cache, { recursive: true });
    const partial = `${library}.${process.pid}.tmp`;
    const units = SOURCES.filter((name) => name.endsWith('.c')).map((name) => join(dir, name));
    await execFileAsync('cc', ['-shared', '-fPIC', '-O2', '-Wall', '-Werror', ...DRIVER_DEFINES[driver], '-o', partial, ...units, '-lpthread', '-ldl']);
    await rename(partial, library);
    return library;
  })();
  built.set(driver, building);
  return building;
}

/** A node's stand-in: its directory holds the library, `state`, `events` and (to end hangs) `release`. */
export class StandInNvml {
  private constructor(readonly dir: string) {}

  /** Copies the built library (of `driver`'s symbol set) into `dir` (made if missing) and writes the first state. */
  static async create(dir: string, state: string, driver: StandInDriver = 'current'): Promise<StandInNvml> {
    await mkdir(dir, { recursive: true });
    await copyFile(await buildStandInNvml(driver), join(dir, STAND_IN_LIBRARY));
    await holdUntilExit(join(dir, STAND_IN_LIBRARY));
    const standIn = new StandInNvml(dir);
    await standIn.setState(state);
    return standIn;
  }

  get library(): string {
    return join(this.dir, STAND_IN_LIBRARY);
  }

  /** Replaces the scripted state whole (written aside, then renamed: never read half-written). */
  async setState(state: string): Promise<void> {
    const partial = join(this.dir, 'state.tmp');
    await writeFileAsync(partial, state);
    await rename(partial, join(this.dir, 'state'));
  }

  /** setState, for callers that cannot wait (a simulated node rewriting its GPUs). */
  setStateSync(state: string): void {
    const partial = join(this.dir, 'state.tmp');
    writeFileSync(partial, state);
    renameSync(partial, join(this.dir, 'state'));
  }

  /** raiseXid, for callers that cannot wait. */
  raiseXidSync(gpu: number, code: number): void {
    appendFileSync(join(this.dir, 'events'), `xid ${gpu} ${code}\n`);
  }

  /** Makes the driver raise Xid `code` on GPU `gpu` (an NVML XidCriticalError event). */
  async raiseXid(gpu: number, code: number): Promise<void> {
    await appendFile(join(this.dir, 'events'), `xid ${gpu} ${code}\n`);
  }

  /** How many times a scripted `fail.wait` failed nvmlEventSetWait_v2 so far. */
  async waitFailures(): Promise<number> {
    try {
      return Number((await readFile(join(this.dir, 'wait-failures'), 'utf8')).trim());
    } catch {
      return 0;
    }
  }

  /** Ends every scripted hang. */
  async release(): Promise<void> {
    await writeFileAsync(join(this.dir, 'release'), '');
  }
}
