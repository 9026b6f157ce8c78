import { readFileSync, writeFileSync } from 'node:fs';
import { createRequire, Module } from 'node:module';
import { dirname } from 'node:path';
import { Script } from 'node:vm';
import { applyAgentV8Flags } from './agent-v8.js';

/**
 * Runs the agent's bundle (dist/agent.cjs, see scripts/build-agent.mjs) with V8's code cache for
 * it (dist/agent.cjs.cache) when one matches: V8 then neither parses nor compiles what the cache
 * holds (the bundle's module set-up, the collectors' first run), which is most of what the agent
 * spends before its first answer. V8 rejects a cache made by another V8, under other flags or
 * for another source, and the bundle is then compiled as usual; nothing else changes.
 *
 * The cache is written once, by the build, next to the bundle: the agent only ever reads it, from
 * where its code is installed (root's), never from a directory it could write to itself.
 */

export interface AgentBundleRun {
  /** Whether a code cache was given and V8 took it. */
  readonly cache: 'used' | 'rejected' | 'none';
}

/** The bundle's code cache, beside it. */
export function codeCachePath(bundle: string): string {
  return `${bundle}.cache`;
}

function readIfPresent(path: string): Buffer | undefined {
  try {
    return readFileSync(path);
  } catch {
    return undefined;
  }
}

/**
 * Compiles the bundle as a CommonJS module's wrapper, with the code cache beside it when V8 takes
 * it. Call after the agent's V8 flags are set: a cache is valid only under the flags it was made with.
 */
export function compileAgentBundle(bundle: string, useCache = true): { script: Script } & AgentBundleRun {
  const cachedData = useCache ? readIfPresent(codeCachePath(bundle)) : undefined;
  const script = new Script(Module.wrap(readFileSync(bundle, 'utf8')), { filename: bundle, cachedData });
  return { script, cache: cachedData === undefined ? 'none' : script.cachedDataRejected ? 'rejected' : 'used' };
}

/**
 * Sets the agent's V8 flags, then compiles and runs the bundle with process.argv as its command
 * line. `writeCache` (the build's) writes the code cache once the process is about to exit, so
 * that it holds every function the run compiled.
 */
export function runAgentBundle(bundle: string, options: { readonly writeCache?: string } = {}): AgentBundleRun {
  applyAgentV8Flags();
  const { writeCache } = options;
  const { script, cache } = compileAgentBundle(bundle, writeCache === undefined);
  if (writeCache !== undefined) process.once('exit', () => writeFileSync(writeCache, script.createCachedData()));
  const module = { exports: {} };
  const run = script.runInThisContext() as (exports: object, require: NodeJS.Require, module: object, filename: string, dirname: string) => void;
  run.call(module.exports, module.exports, createRequire(bundle), module, bundle, dirname(bundle));
  return { cache };
}
