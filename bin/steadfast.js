#!/usr/bin/env node
// Entry point installed as `steadfast`; the compiled CLI lives in dist/ (npm run build).
import '../dist/cli/main.js';
