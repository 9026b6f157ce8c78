#!/usr/bin/env node
// Entry point installed as `steadfast`; the compiled CLI lives in dist/ (npm run build).
// `steadfast agent` runs the agent's bundle, dist/agent.cjs, through dist/agent-loader.cjs
// (cli/agent-bundle.ts, bundled): one file instead of the module tree, compiled from this node's
// own code cache when root made one (`steadfast agent --write-code-cache`, docs/agent.md).
// This file is CommonJS (bin/package.json), so the agent starts without Node's ES module loader.
// Without the bundle (a tree built by tsc alone) the agent runs from the module tree, the same code.
'use strict';
const { existsSync } = require('node:fs');
const { join } = require('node:path');

const command = process.argv.slice(2).find((arg) => !arg.startsWith('-'));
const dist = join(__dirname, '..', 'dist');
const agentBundle = join(dist, 'agent.cjs');
const agentLoader = join(dist, 'agent-loader.cjs');
if (command === 'agent' && existsSync(agentBundle) && existsSync(agentLoader)) {
  require(agentLoader).agentEntry(agentBundle, 'steadfast');
} else {
  import('../dist/cli/main.js').catch((error) => {
    process.stderr.write(`steadfast: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exitCode = 1;
  });
}
