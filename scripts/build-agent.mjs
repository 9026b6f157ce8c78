#!/usr/bin/env node
// Bundles `steadfast agent` into dist/agent.cjs and writes V8's code cache for it,
// dist/agent.cjs.cache (see cli/agent-bundle.ts), and the loader bin/steadfast.js runs it with,
// dist/agent-loader.cjs. Run by `npm run build`, after tsc.
//
//   node scripts/build-agent.mjs            bundle, then warm and write the code cache
//   node scripts/build-agent.mjs --warm ... (internal) the run that writes the cache
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const bundle = join(root, 'dist', 'agent.cjs');
const fixtures = join(root, 'test', 'fixtures', 'realworld');

if (process.argv[2] === '--warm') {
  // The agent's own command line follows; the cache is written when it exits.
  // The loader bin/steadfast.js runs the bundle with, so the cache is made as it will be used.
  const { runAgentBundle, codeCachePath } = createRequire(import.meta.url)(join(root, 'dist', 'agent-loader.cjs'));
  process.argv.splice(2, 1);
  runAgentBundle(bundle, { writeCache: codeCachePath(bundle) });
} else {
  const { build } = await import('esbuild');
  // What bin/steadfast.js (CommonJS) requires to run the bundle: cli/agent-bundle.ts and the V8
  // flags it sets, as one CommonJS file.
  await build({
    entryPoints: [join(root, 'dist', 'cli', 'agent-bundle.js')],
    outfile: join(root, 'dist', 'agent-loader.cjs'),
    bundle: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    logLevel: 'warning',
  });
  await build({
    entryPoints: [join(root, 'dist', 'cli', 'agent-main.js')],
    outfile: bundle,
    bundle: true,
    minify: true,
    platform: 'node',
    format: 'cjs',
    target: 'node20',
    logLevel: 'warning',
    // The bundle is CommonJS (V8's code cache is for scripts); the modules' import.meta.url is the bundle's.
    banner: { js: "const __bundle_url = require('node:url').pathToFileURL(__filename).href;" },
    define: { 'import.meta.url': '__bundle_url' },
    plugins: [
      {
        // prom-client's Pushgateway pulls in the HTTPS client and TLS at load; the agent is scraped, never pushes.
        name: 'no-pushgateway',
        setup(plugin) {
          plugin.onResolve({ filter: /^\.\/lib\/pushgateway$/ }, (args) => (args.importer.includes(`${join('node_modules', 'prom-client')}`) ? { path: 'pushgateway', namespace: 'no-pushgateway' } : undefined));
          plugin.onLoad({ filter: /.*/, namespace: 'no-pushgateway' }, () => ({ contents: "module.exports = class Pushgateway { constructor() { throw new Error('the agent bundle has no Pushgateway'); } };", loader: 'js' }));
        },
      },
    ],
  });
  // Warm the cache on one collection of the simulator's fixture node (8 GPUs, InfiniBand ports,
  // NFS mounts: what a first scrape compiles), or, without the repository's fixtures (a build
  // from the npm package), on the module set-up alone.
  const work = mkdtempSync(join(tmpdir(), 'steadfast-agent-cache-'));
  try {
    let agentArgs = ['--version'];
    if (existsSync(fixtures)) {
      const { buildFixtureNode } = await import(join(root, 'dist', 'sim', 'fixture-node.js'));
      const node = buildFixtureNode(work);
      agentArgs = ['agent', '--once', '--node', 'fixture-node', '--path.sysfs', node.sysfs, '--path.procfs', node.procfs, '--path.kmsg', node.kmsg, '--nvidia-smi.xml', node.nvidiaSmiXml, '--xid.state-file', join(work, 'xid.json')];
    }
    execFileSync(process.execPath, [fileURLToPath(import.meta.url), '--warm', ...agentArgs], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' } });
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
