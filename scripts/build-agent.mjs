#!/usr/bin/env node
// Bundles the agent (cli/agent-main.ts) into dist/agent.cjs, its NVML thread into
// dist/nvml-worker.cjs, and the loader that bin/steadfast.js and the agent-only package's
// steadfast-agent run it with (cli/agent-bundle.ts) into dist/agent-loader.cjs. Run by `npm run build`, after tsc. No code cache is made here: V8's cache
// is only safe for the Node.js build that made it, so each node makes its own
// (`steadfast-agent --write-code-cache`, cli/agent-bundle.ts). koffi (scripts/agent-dependencies.mjs)
// stays out of the bundle: it loads its .node file from its own package, so the bundle requires
// it from the node_modules beside the installed tree (the agent-only package's dependency).
import { build } from 'esbuild';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { AGENT_EXTERNALS } from './agent-dependencies.mjs';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

// CommonJS, so that bin/steadfast.js (CommonJS) requires it without Node's ES module loader.
const commonjs = { bundle: true, platform: 'node', format: 'cjs', target: 'node20', logLevel: 'warning' };
// The agent's code: minified, koffi left out, and `import('koffi')` made require('koffi') (the
// loader runs the agent's bundle as a vm.Script, where import() has no module loader:
// ERR_VM_DYNAMIC_IMPORT_CALLBACK_MISSING under Node.js 20).
const agentCode = { ...commonjs, minify: true, external: AGENT_EXTERNALS, supported: { 'dynamic-import': false } };

// The agent's NVML thread (agent/sources/nvml/worker.ts) runs a bundle of its own beside the
// agent's, so that the thread loads the NVML code alone, not the whole agent (about 13 MB of
// memory less).
await build({
  entryPoints: [join(root, 'dist', 'agent', 'sources', 'nvml', 'worker.js')],
  outfile: join(root, 'dist', 'nvml-worker.cjs'),
  ...agentCode,
});

await build({
  entryPoints: [join(root, 'dist', 'cli', 'agent-bundle.js')],
  outfile: join(root, 'dist', 'agent-loader.cjs'),
  ...commonjs,
});
await build({
  entryPoints: [join(root, 'dist', 'cli', 'agent-main.js')],
  outfile: join(root, 'dist', 'agent.cjs'),
  ...agentCode,
  // The bundle is CommonJS (V8's code cache is for scripts); the modules' import.meta.url is the bundle's.
  banner: { js: "const __bundle_url = require('node:url').pathToFileURL(__filename).href;" },
  define: { 'import.meta.url': '__bundle_url' },
  plugins: [
    {
      // prom-client's Pushgateway pulls in the HTTPS client and TLS at load; the agent is scraped, never pushes.
      name: 'no-pushgateway',
      setup(plugin) {
        plugin.onResolve({ filter: /^\.\/lib\/pushgateway$/ }, (args) =>
          args.importer.includes(`${join('node_modules', 'prom-client')}`) ? { path: 'pushgateway', namespace: 'no-pushgateway' } : undefined,
        );
        plugin.onLoad({ filter: /.*/, namespace: 'no-pushgateway' }, () => ({
          contents: "module.exports = class Pushgateway { constructor() { throw new Error('the agent bundle has no Pushgateway'); } };",
          loader: 'js',
        }));
      },
    },
  ],
});
