import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { Counter, Gauge, Histogram, Registry, Summary } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { createAgent } from '../../agent/agent.js';
import { encodeExposition } from '../../agent/exposition.js';
import { enabledFactories } from '../../agent/index.js';
import { buildFixtureNode } from '../../tryit/fixture-node.js';
import { normaliseExposition } from './helpers.js';

describe('the exposition encoder', () => {
  it('writes exactly what prom-client writes for a whole fixture node', async () => {
    const root = mkdtempSync(join(tmpdir(), 'steadfast-encoder-'));
    const node = buildFixtureNode(root);
    const agent = createAgent({
      node: 'fixture-node',
      paths: { sysfs: node.sysfs, procfs: node.procfs, kmsg: node.kmsg, nvidiaSmiXml: node.nvidiaSmiXml, nvidiaSmi: '/nonexistent' },
      pollIntervalSeconds: 60,
      collectors: enabledFactories({}),
      logger: silentLogger(),
    });
    try {
      await agent.scrapeOnce();
      // Normalised: the poll age is computed anew by each of the two encodings.
      expect(normaliseExposition(await encodeExposition(agent.registry))).toBe(normaliseExposition(await agent.registry.metrics()));
    } finally {
      await agent.close();
      rmSync(root, { recursive: true, force: true });
    }
  });

  it('writes exactly what prom-client writes for histograms, summaries, special values and escapes', async () => {
    const registry = new Registry();
    new Histogram({ name: 'h_seconds', help: 'a histogram', labelNames: ['verb'], buckets: [0.1, 1], registers: [registry] }).observe({ verb: 'drain' }, 0.5);
    new Summary({ name: 's_seconds', help: 'a summary', percentiles: [0.5], registers: [registry] }).observe(3);
    const gauge = new Gauge({ name: 'g', help: 'help with \\ backslash\nand newline', labelNames: ['a', 'b'], registers: [registry] });
    gauge.set({ a: 'quote " here', b: 'back\\slash\nnew' }, Number.NaN);
    gauge.set({ a: 'plain', b: '' }, Number.POSITIVE_INFINITY);
    gauge.set({ a: 'x', b: 'y' }, Number.NEGATIVE_INFINITY);
    new Counter({ name: 'empty_total', help: 'no samples yet', registers: [registry] });
    expect(await encodeExposition(registry)).toBe(await registry.metrics());
  });

  it('matches prom-client for arbitrary label values and numbers', async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(fc.tuple(fc.string(), fc.double()), { minLength: 1, maxLength: 20 }), async (samples) => {
        const registry = new Registry();
        const gauge = new Gauge({ name: 'p', help: 'property', labelNames: ['v', 'i'], registers: [registry] });
        samples.forEach(([value, number], index) => gauge.set({ v: value, i: String(index) }, number));
        expect(await encodeExposition(registry)).toBe(await registry.metrics());
      }),
      { numRuns: 200 },
    );
  });
});
