#!/usr/bin/env node
// `steadfast-agent`, the agent-only package's command: the steadfast node agent and the Slurm
// preflight (`steadfast-agent check`), from one bundled file, dist/agent.cjs, with no other
// dependency than Node.js. `steadfast-agent [options]` is `steadfast agent [options]` of the
// full package. See README.md beside it.
'use strict';
const { join } = require('node:path');

const dist = join(__dirname, '..', 'dist');
require(join(dist, 'agent-loader.cjs')).agentEntry(join(dist, 'agent.cjs'), 'steadfast-agent');
