import { appendFileSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { createAgent } from '../../agent/agent.js';
import { COLLECTOR_FACTORIES, enabledFactories } from '../../agent/index.js';
import { buildFixtureNode, type FixtureNode } from '../../tryit/fixture-node.js';
import { EXPECTED, expectedText, normaliseExposition, promtoolCheckMetrics, seriesValue } from './helpers.js';

/**
 * The agent with every collector on a whole fixture node built from real samples (8 GPUs, 8
 * InfiniBand ports, 4 NFS mounts): the one end-to-end exposition, regenerated with
 * UPDATE_EXPECTED=1, and what happens when one source breaks.
 */
describe('the agent on a whole fixture node', () => {
  const roots: string[] = [];
  afterAll(() => roots.forEach((root) => rmSync(root, { recursive: true, force: true })));

  function fixture(): FixtureNode {
    const root = mkdtempSync(join(tmpdir(), 'steadfast-whole-node-'));
    roots.push(root);
    return buildFixtureNode(root);
  }

  async function scrape(node: FixtureNode, paths: Partial<FixtureNode> = {}): Promise<string> {
    const merged = { ...node, ...paths };
    const agent = createAgent({
      node: 'fixture-node',
      paths: { sysfs: merged.sysfs, procfs: merged.procfs, kmsg: merged.kmsg, nvidiaSmiXml: merged.nvidiaSmiXml, nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: enabledFactories({}),
      logger: silentLogger(),
    });
    try {
      return await agent.scrapeOnce();
    } finally {
      await agent.close();
    }
  }

  it('exports exactly the expected exposition, which passes promtool check metrics', async () => {
    const node = fixture();
    appendFileSync(node.kmsg, "[ 2001.000000] NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n");
    const text = normaliseExposition(await scrape(node));
    expect(text).toBe(expectedText(join(EXPECTED, 'fixture-node.prom'), text));
    const lint = await promtoolCheckMetrics(text);
    expect(lint.output).toBe('');
    expect(lint.code).toBe(0);
  });

  it('reports every default collector as successful on a healthy node', async () => {
    const text = await scrape(fixture());
    for (const factory of COLLECTOR_FACTORIES.filter((candidate) => candidate.defaultEnabled)) {
      expect(seriesValue(text, `steadfast_collector_success{collector="${factory.name}"}`), factory.name).toBe(1);
    }
  });

  it('flips only the broken collector to 0 and keeps serving the others', async () => {
    const cases: { collector: string; breakIt: (node: FixtureNode) => Partial<FixtureNode> }[] = [
      { collector: 'xid', breakIt: (node) => ({ kmsg: join(node.root, 'no-such-kern.log') }) },
      {
        collector: 'nfs',
        breakIt: (node) => {
          rmSync(join(node.procfs, '4242', 'mountstats'));
          return {};
        },
      },
      { collector: 'gpu', breakIt: (node) => ({ nvidiaSmiXml: join(node.root, 'no-such.xml') }) },
      {
        collector: 'rdma',
        breakIt: (node) => {
          // A file where the device directory should be: the class directory cannot be walked.
          const infiniband = join(node.sysfs, 'class', 'infiniband');
          rmSync(infiniband, { recursive: true });
          writeFileSync(infiniband, 'not a directory');
          return {};
        },
      },
    ];
    for (const { collector, breakIt } of cases) {
      const node = fixture();
      const text = await scrape(node, breakIt(node));
      expect(seriesValue(text, `steadfast_collector_success{collector="${collector}"}`), collector).toBe(0);
      const others = COLLECTOR_FACTORIES.filter((factory) => factory.defaultEnabled && factory.name !== collector).map((factory) => factory.name);
      const succeeded = others.filter((name) => seriesValue(text, `steadfast_collector_success{collector="${name}"}`) === 1);
      expect(succeeded, `${collector} broken`).toEqual(others);
    }
  });
});
