import { createHash } from 'node:crypto';
import {
  closeSync,
  existsSync,
  fstatSync,
  lstatSync,
  mkdirSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
  type Stats,
} from 'node:fs';
import { createRequire, Module } from 'node:module';
import { arch, platform } from 'node:os';
import { dirname, join } from 'node:path';
import { Script } from 'node:vm';
import type { AgentEntry } from './agent-entry.js';
import { applyAgentV8Flags } from './agent-v8.js';

/**
 * Runs the agent's bundle (dist/agent.cjs, see scripts/build-agent.mjs), with V8's code cache for
 * it when this node holds one made by the very same Node.js build.
 *
 * V8 checks a code cache only against its own version, its flags and the source's length, not
 * against the Node.js build around it: Node.js 20.10 to 20.20.1 share V8 11.3.244.8 and accept
 * a cache that 20.20.2 made, then crash running it. So no cache is shipped. A node makes its own,
 * as root, with `steadfast-agent --write-code-cache` (the Debian package's postinst and the
 * container image's build run it), and the agent reads one only when
 *   - its name carries the hash of everything that shapes the compiled code: the Node.js version
 *     and build (process.versions, process.config, the binary's size and the hash of its first
 *     and last MiB, where its ELF headers and GNU build id are, which any rebuild changes), the
 *     platform, the V8 flags in force and the bundle's own bytes; a node
 *     upgrade or another binary looks for another file and compiles as usual. Nothing of where
 *     the binary lies (inode, mtime) is in it: an image's layers unpacked on another machine
 *     keep their cache;
 *   - it and its directory belong to root and no one else may write them: the agent (user
 *     steadfast) reads the cache but cannot plant code in it for its next start.
 * What it buys: the bundle's module set-up is neither parsed nor compiled (docs/evaluation.md).
 */

/** Where the code cache lives, unless STEADFAST_AGENT_CODE_CACHE_DIR says otherwise. */
export const DEFAULT_CODE_CACHE_DIR = '/var/cache/steadfast-agent';

export type CodeCacheState =
  /** V8 compiled the bundle from the cache. */
  | 'used'
  /** A cache file for this build was there, and V8 refused it (compiled as usual). */
  | 'rejected'
  /** None for this build (compiled as usual). */
  | 'none'
  /** One was there but someone other than root may write it or its directory (not read). */
  | 'untrusted';

export interface CodeCacheReport {
  readonly state: CodeCacheState;
  /** The cache file this build would use; left unnamed where the cache directory does not exist. */
  readonly file?: string;
}

export function codeCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  return env.STEADFAST_AGENT_CODE_CACHE_DIR || DEFAULT_CODE_CACHE_DIR;
}

/**
 * The cache file for this process's Node.js build, its V8 flags and this bundle source. Call after
 * the agent's V8 flags are set (runAgentBundle does): they are part of the name.
 */
export function codeCacheFile(source: string, dir: string, v8Flags: readonly string[]): string {
  const build = {
    versions: process.versions,
    config: process.config,
    platform: platform(),
    arch: arch(),
    binary: binaryFingerprint(process.execPath),
    flags: [...process.execArgv, process.env.NODE_OPTIONS ?? '', ...v8Flags],
    bundle: createHash('sha256').update(source).digest('hex'),
  };
  const key = createHash('sha256').update(JSON.stringify(build)).digest('hex').slice(0, 32);
  return join(dir, `agent-${process.version}-${key}.cache`);
}

/** Bytes hashed at each end of the node binary: its ELF headers, sections and build notes. */
const FINGERPRINT_BYTES = 1024 * 1024;

/** The binary's size and a hash of its first and last MiB: another build differs there (a few ms to read). */
function binaryFingerprint(path: string): { size: number; ends: string } {
  const fd = openSync(path, 'r');
  try {
    const { size } = fstatSync(fd);
    const hash = createHash('sha256');
    const chunk = Buffer.alloc(Math.min(FINGERPRINT_BYTES, size));
    for (const position of new Set([0, Math.max(0, size - chunk.length)])) {
      const read = readSync(fd, chunk, 0, chunk.length, position);
      hash.update(chunk.subarray(0, read));
    }
    return { size, ends: hash.digest('hex') };
  } finally {
    closeSync(fd);
  }
}

/** Root's, and writable by root alone: the only files the agent takes code from besides its own tree. */
function rootOnly(stats: Stats): boolean {
  return stats.uid === 0 && (stats.mode & 0o022) === 0;
}

function readTrusted(file: string): { data?: Buffer; state: 'none' | 'untrusted' } {
  let stats: Stats;
  try {
    stats = lstatSync(file);
  } catch {
    return { state: 'none' };
  }
  if (!stats.isFile() || !rootOnly(stats) || !rootOnly(statSync(dirname(file)))) return { state: 'untrusted' };
  try {
    return { data: readFileSync(file), state: 'none' };
  } catch {
    return { state: 'none' };
  }
}

function compile(bundle: string, source: string, cachedData: Buffer | undefined): Script {
  return new Script(Module.wrap(source), { filename: bundle, cachedData });
}

type BundleExports = { runAgentCli(argv: readonly string[], entry: AgentEntry): Promise<void> };

function evaluate(script: Script, bundle: string): BundleExports {
  const module = { exports: {} };
  const run = script.runInThisContext() as (exports: object, require: NodeJS.Require, module: object, filename: string, dirname: string) => void;
  run.call(module.exports, module.exports, createRequire(bundle), module, bundle, dirname(bundle));
  return module.exports as BundleExports;
}

/**
 * The bundle's source and this build's cache for it. Naming the cache file reads 2 MiB of the
 * node binary and hashes the bundle: skipped, unless `always`, where the cache directory does not
 * exist (an install no one wrote a cache for).
 */
function findCodeCache(bundle: string, always: boolean): { source: string; file?: string; cache: ReturnType<typeof readTrusted> } {
  const flags = applyAgentV8Flags();
  const source = readFileSync(bundle, 'utf8');
  const dir = codeCacheDir();
  if (!always && !existsSync(dir)) return { source, cache: { state: 'none' } };
  const file = codeCacheFile(source, dir, flags);
  return { source, file, cache: readTrusted(file) };
}

function stateOf(script: Script, cache: ReturnType<typeof readTrusted>): CodeCacheState {
  return cache.data === undefined ? cache.state : script.cachedDataRejected ? 'rejected' : 'used';
}

/**
 * Sets the agent's V8 flags, compiles the bundle (from this build's code cache when there is a
 * trusted one) and runs the agent's command line, process.argv, as `entry`.
 */
export function runAgentBundle(bundle: string, entry: AgentEntry): CodeCacheReport {
  const { source, file, cache } = findCodeCache(bundle, false);
  const script = compile(bundle, source, cache.data);
  void evaluate(script, bundle).runAgentCli(process.argv, entry);
  return { state: stateOf(script, cache), ...(file === undefined ? {} : { file }) };
}

/** What runAgentBundle would find for this build, without running the agent: `--code-cache-status`. */
export function codeCacheStatus(bundle: string): CodeCacheReport {
  const { source, file, cache } = findCodeCache(bundle, true);
  return { state: cache.data === undefined ? cache.state : stateOf(compile(bundle, source, cache.data), cache), ...(file === undefined ? {} : { file }) };
}

/**
 * `--write-code-cache`: compiles the bundle, runs its module set-up and the parse of a
 * `--version` command line (what every start runs before the agent's own work), and writes the
 * code V8 made for it into this build's cache file, root's and read-only to others, and prints
 * the file's path as the process exits. Root only: a cache anyone else wrote is never read.
 */
export function writeAgentCodeCache(bundle: string): void {
  if (process.getuid?.() !== 0) throw new Error('--write-code-cache must run as root: the agent reads only a cache that root wrote');
  const flags = applyAgentV8Flags();
  const source = readFileSync(bundle, 'utf8');
  const dir = codeCacheDir();
  mkdirSync(dir, { recursive: true, mode: 0o755 });
  if (!rootOnly(statSync(dir))) throw new Error(`${dir} must belong to root and be writable by root alone`);
  const file = codeCacheFile(source, dir, flags);
  const script = compile(bundle, source, undefined);
  const cli = evaluate(script, bundle);
  // commander prints the version and exits; what the parse compiled is in the cache by then.
  const stdout = process.stdout.write.bind(process.stdout);
  process.once('exit', () => {
    process.stdout.write = stdout;
    try {
      const partial = `${file}.${process.pid}.tmp`;
      writeFileSync(partial, script.createCachedData(), { mode: 0o644 });
      renameSync(partial, file);
      // The caches of earlier builds (before a Node.js upgrade) are never read again.
      for (const name of readdirSync(dir)) if (/^agent-.*\.cache$/.test(name) && join(dir, name) !== file) rmSync(join(dir, name), { force: true });
      stdout(`${file}\n`);
    } catch (error) {
      process.stderr.write(`steadfast-agent: cannot write the code cache ${file}: ${error instanceof Error ? error.message : String(error)}\n`);
      process.exitCode = 1;
    }
  });
  process.stdout.write = (() => true) as typeof process.stdout.write;
  void cli.runAgentCli([process.argv[0] ?? 'node', 'steadfast-agent', '--version'], 'steadfast-agent');
}

/** The loader's own flags, which a command line may carry instead of the agent's. */
export const WRITE_CODE_CACHE_FLAG = '--write-code-cache';
export const CODE_CACHE_STATUS_FLAG = '--code-cache-status';

/**
 * What bin/steadfast.js (`steadfast agent ...`) and the agent-only package's steadfast-agent run:
 * the agent, or the loader's `--write-code-cache` / `--code-cache-status`.
 */
export function agentEntry(bundle: string, entry: AgentEntry): void {
  const args = process.argv.slice(2);
  try {
    if (args.includes(WRITE_CODE_CACHE_FLAG)) writeAgentCodeCache(bundle);
    else if (args.includes(CODE_CACHE_STATUS_FLAG)) process.stdout.write(`${JSON.stringify(codeCacheStatus(bundle))}\n`);
    else runAgentBundle(bundle, entry);
  } catch (error) {
    process.stderr.write(`${entry === 'steadfast' ? 'steadfast agent' : entry}: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exitCode = 1;
  }
}
