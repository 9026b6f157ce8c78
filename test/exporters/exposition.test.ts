import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { createAgent } from '../../exporters/agent.js';
import { CollectorSet, type Collector } from '../../exporters/collector.js';
import { createGpuCollector } from '../../exporters/collectors/gpu.js';
import { enabledFactories } from '../../exporters/index.js';
import { createXidCollector } from '../../exporters/collectors/xid.js';
import { EXPECTED, NVIDIA_SMI_XML, XID_LOGS, expectedText, normaliseExposition, promtoolCheckMetrics, testContext } from './helpers.js';

/**
 * Full exposition text of each collector on each real sample, against files under
 * test/fixtures/expected/ (rewritten with UPDATE_EXPECTED=1), each of which must also pass
 * `promtool check metrics` (STYLE.md, Exporters).
 */

const XML_FILES = readdirSync(NVIDIA_SMI_XML).filter((name) => name.endsWith('.xml'));
const LOG_FILES = readdirSync(XID_LOGS).filter((name) => name !== 'README.md');

const open: Collector[] = [];
afterEach(async () => {
  await Promise.all(open.splice(0).map((collector) => collector.close()));
});

async function scrapeOne(context: ReturnType<typeof testContext>, collector: Collector): Promise<string> {
  open.push(collector);
  const set = new CollectorSet([collector], context.registry, context.logger);
  await set.start();
  return normaliseExposition(await set.scrape());
}

async function expectMatchesAndLints(file: string, actual: string): Promise<void> {
  const expected = expectedText(file, actual);
  expect(actual).toBe(expected);
  const lint = await promtoolCheckMetrics(expected);
  expect(lint.output).toBe('');
  expect(lint.code).toBe(0);
}

describe('gpu collector exposition', () => {
  it.each(XML_FILES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({ nvidiaSmiXml: join(NVIDIA_SMI_XML, name) });
    const text = await scrapeOne(context, createGpuCollector(context));
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'gpu', name.replace(/\.xml$/, '.prom')), text);
  });
});

describe('xid collector exposition', () => {
  it.each(LOG_FILES)('exports %s exactly as the expected file, which promtool accepts', async (name) => {
    const context = testContext({ kmsg: join(XID_LOGS, name) });
    const text = await scrapeOne(context, createXidCollector(context));
    expect(text).toContain('steadfast_collector_success{collector="xid"} 1');
    await expectMatchesAndLints(join(EXPECTED, 'xid', name.replace(/\.(log|txt)$/, '.prom')), text);
  });
});

describe('agent exposition end to end', () => {
  it('prints one scrape of every default collector on real samples, matching the expected file that promtool accepts', async () => {
    const agent = createAgent({
      node: 'node-1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: {
        sysfs: '/nonexistent/sys',
        procfs: '/nonexistent/proc',
        kmsg: join(XID_LOGS, 'gpud_xid_lines_h100_gb200.txt'),
        nvidiaSmiXml: join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml'),
        nvidiaSmi: '/nonexistent/nvidia-smi',
      },
      pollIntervalSeconds: 5,
      collectors: enabledFactories({}),
      logger: silentLogger(),
    });
    try {
      const text = normaliseExposition(await agent.scrapeOnce());
      await expectMatchesAndLints(join(EXPECTED, 'agent-once.prom'), text);
    } finally {
      await agent.close();
    }
  });
});
