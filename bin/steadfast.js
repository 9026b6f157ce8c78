#!/usr/bin/env node
// Entry point installed as `steadfast`; the compiled CLI lives in dist/ (npm run build).
// `steadfast agent` runs the agent's bundle, dist/agent.cjs, with V8's code cache for it
// (dist/cli/agent-bundle.js): one file instead of the module tree, which is what lets the agent
// answer its first scrape within its start-up budget (docs/evaluation.md). Without the bundle (a
// tree built by tsc alone) the agent runs from the module tree, the same code.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const command = process.argv.slice(2).find((arg) => !arg.startsWith('-'));
const agentBundle = fileURLToPath(new URL('../dist/agent.cjs', import.meta.url));
if (command === 'agent' && existsSync(agentBundle)) (await import('../dist/cli/agent-bundle.js')).runAgentBundle(agentBundle);
else await import('../dist/cli/main.js');
