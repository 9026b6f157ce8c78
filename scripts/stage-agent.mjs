#!/usr/bin/env node
// Lays out the agent-only package in DIR, from the build (npm run build):
//   DIR/package.json             agent/package.json made packable: depends on koffi alone (scripts/agent-dependencies.mjs),
//                                at the exact version package-lock.json pins
//   DIR/bin/steadfast-agent.cjs  the command (agent/bin/steadfast-agent.cjs)
//   DIR/dist/agent.cjs           the agent and the Slurm preflight, bundled with what they import
//                                but koffi
//   DIR/dist/agent-loader.cjs    the loader (V8 flags, this node's code cache)
//   DIR/dist/nvml-worker.cjs     the agent's NVML thread
//   DIR/node_modules/            koffi and this machine's koffi binary package, copied from the
//                                node_modules `npm ci` installed (not with --pack: npm installs them)
//   DIR/python/steadfast_burn.py the burn the validate collector runs (clients/python/steadfast_burn.py)
//   DIR/README.md
// `npm pack DIR` makes the npm package; packaging/debian and packaging/image install DIR as it is
// (pruning node_modules to this machine's glibc binary).
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { agentDependencies, copyAgentDependencies } from './agent-dependencies.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const args = process.argv.slice(2);
const pack = args[0] === '--pack';
const target = pack ? args[1] : args[0];
if (!target || args.length !== (pack ? 2 : 1)) {
  process.stderr.write('usage: node scripts/stage-agent.mjs DIR | --pack OUT\n');
  process.exit(2);
}
const out = pack ? mkdtempSync(join(tmpdir(), 'steadfast-agent-package-')) : resolve(target);
for (const built of ['agent.cjs', 'agent-loader.cjs', 'nvml-worker.cjs']) {
  if (!existsSync(join(root, 'dist', built))) {
    process.stderr.write(`stage-agent: dist/${built} is missing: run npm run build first\n`);
    process.exit(1);
  }
}

const main = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
rmSync(out, { recursive: true, force: true });
mkdirSync(join(out, 'bin'), { recursive: true });
mkdirSync(join(out, 'dist'), { recursive: true });
copyFileSync(join(root, 'agent', 'bin', 'steadfast-agent.cjs'), join(out, 'bin', 'steadfast-agent.cjs'));
chmodSync(join(out, 'bin', 'steadfast-agent.cjs'), 0o755);
for (const built of ['agent.cjs', 'agent-loader.cjs', 'nvml-worker.cjs']) copyFileSync(join(root, 'dist', built), join(out, 'dist', built));
copyFileSync(join(root, 'agent', 'README.md'), join(out, 'README.md'));
mkdirSync(join(out, 'python'));
copyFileSync(join(root, 'clients', 'python', 'steadfast_burn.py'), join(out, 'python', 'steadfast_burn.py'));
// The agent's manifest is agent/package.json (its name, description and dependency); what only the
// packed package has is added here: the command, its files, CommonJS for the bundles, no `private`.
const { private: _workspaceOnly, ...own } = JSON.parse(readFileSync(join(root, 'agent', 'package.json'), 'utf8'));
if (own.version !== main.version) {
  process.stderr.write(`stage-agent: agent/package.json is at ${own.version}, package.json at ${main.version}: the packages are released together\n`);
  process.exit(1);
}
const manifest = {
  ...own,
  type: 'commonjs',
  bin: { 'steadfast-agent': 'bin/steadfast-agent.cjs' },
  dependencies: agentDependencies(root),
  files: ['bin/', 'dist/', 'python/'],
};
writeFileSync(join(out, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
// A tree installed as it is runs on its own; `npm pack` leaves node_modules out either way.
if (!pack) copyAgentDependencies(root, out);
// steadfast_build_info's revision label: the commit built, when built from a git checkout.
try {
  const revision = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: root, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  writeFileSync(join(out, 'REVISION'), `${revision}\n`);
  manifest.files.push('REVISION');
  writeFileSync(join(out, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
} catch {
  // Not a git checkout: no revision label.
}
if (pack) {
  try {
    const tarball = execFileSync('npm', ['pack', out, '--pack-destination', resolve(target), '--silent'], { encoding: 'utf8' }).trim();
    process.stdout.write(`${join(resolve(target), tarball)}\n`);
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
} else {
  process.stdout.write(`${out}\n`);
}
