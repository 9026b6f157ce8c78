// The npm packages the agent's bundle leaves out (scripts/build-agent.mjs) and loads at run time
// from a node_modules beside it: koffi, the FFI library NVML is read through, which loads its
// prebuilt .node file from its own package directory (@koromix/koffi-PLATFORM-ARCH), so it cannot
// be bundled. Used by build-agent.mjs (externals), stage-agent.mjs (the agent-only package's
// dependencies, and the node_modules of a staged tree) and packaging/debian/copyright.mjs.
import { cpSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

export const AGENT_EXTERNALS = ['koffi'];

const readJson = (path) => JSON.parse(readFileSync(path, 'utf8'));

/**
 * The agent-only package's dependencies: each external at the version package-lock.json pins,
 * which must be the exact version agent/package.json and the controller's package.json name (the
 * version the tests ran; the controller runs the same agent as `steadfast agent`).
 */
export function agentDependencies(root) {
  const manifest = readJson(join(root, 'agent', 'package.json'));
  const controller = readJson(join(root, 'package.json'));
  const lock = readJson(join(root, 'package-lock.json'));
  const dependencies = {};
  for (const name of AGENT_EXTERNALS) {
    const wanted = manifest.dependencies?.[name];
    const locked = lock.packages?.[`node_modules/${name}`]?.version;
    if (wanted === undefined || locked === undefined) throw new Error(`${name} is not a dependency in package.json and package-lock.json`);
    if (wanted !== locked) throw new Error(`agent/package.json asks for ${name} ${wanted}, package-lock.json holds ${locked}: pin the exact version`);
    if (controller.dependencies?.[name] !== wanted)
      throw new Error(`package.json asks for ${name} ${controller.dependencies?.[name]}, agent/package.json for ${wanted}: the two run the same agent`);
    dependencies[name] = locked;
  }
  return dependencies;
}

/**
 * Copies the externals and what they depend on, as `npm ci` installed them in ROOT/node_modules,
 * into DIR/node_modules: the same files `npm install` of the agent-only package gives on this
 * machine (npm installed only this platform's optional packages, koffi's binary among them).
 * An optional dependency npm did not install here (another platform's binary) is skipped.
 * Returns the packages copied.
 */
export function copyAgentDependencies(root, dir) {
  const copied = [];
  const queue = AGENT_EXTERNALS.map((name) => ({ name, optional: false }));
  while (queue.length > 0) {
    const { name, optional } = queue.shift();
    if (copied.includes(name)) continue;
    const from = join(root, 'node_modules', name);
    if (!existsSync(join(from, 'package.json'))) {
      if (optional) continue;
      throw new Error(`node_modules/${name} is missing: run npm ci`);
    }
    mkdirSync(join(dir, 'node_modules', name, '..'), { recursive: true });
    cpSync(from, join(dir, 'node_modules', name), { recursive: true });
    copied.push(name);
    const manifest = readJson(join(from, 'package.json'));
    for (const dependency of Object.keys(manifest.dependencies ?? {})) queue.push({ name: dependency, optional: false });
    for (const dependency of Object.keys(manifest.optionalDependencies ?? {})) queue.push({ name: dependency, optional: true });
  }
  return copied;
}
