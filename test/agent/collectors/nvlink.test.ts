import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../agent/collector.js';
import { createNvlinkCollector } from '../../../agent/collectors/nvlink.js';
import { FIXTURES, NVIDIA_SMI_XML, seriesValue, testContext } from '../helpers.js';

let collector: Collector | undefined;

afterEach(async () => {
  await collector?.close();
  collector = undefined;
});

describe('nvlink collector', () => {
  it('exports each link counter the GPU reports, labelled by GPU, UUID, link and type', async () => {
    const context = testContext({ nvidiaSmi: join(FIXTURES, 'exporters', 'fake-nvidia-smi-nvlink.sh') }, 60);
    collector = createNvlinkCollector(context);
    await collector.start();
    await expect(collector.update()).resolves.toBeUndefined();
    const text = await context.registry.metrics();
    expect(seriesValue(text, 'steadfast_gpu_nvlink_errors_total{gpu="2",UUID="GPU-d9eeee97-c180-66de-23e0-d995387934dc",link="0",type="crc"}')).toBe(65535);
    expect(seriesValue(text, 'steadfast_gpu_nvlink_errors_total{gpu="0",UUID="GPU-5261e3df-82f6-67b4-9953-4e63527e0e9d",link="3",type="replay"}')).toBe(2353);
  });

  it('counts an nvidia-smi that hangs as a timed-out query and reports failure, without waiting for it', async () => {
    const context = testContext({ nvidiaSmi: join(FIXTURES, 'exporters', 'hanging-nvidia-smi.sh') }, 60);
    collector = createNvlinkCollector(context, { commandTimeoutMs: 200 });
    await collector.start();
    await expect(collector.update()).rejects.toThrow(/did not answer within 200 ms/);
    expect(seriesValue(await context.registry.metrics(), 'steadfast_gpu_query_failures_total{command="nvidia-smi nvlink -e",reason="timeout"}')).toBe(1);
  });

  it('exports nothing, and does not fail, on a node without nvidia-smi or with captured XML', async () => {
    for (const paths of [{ nvidiaSmi: '/nonexistent/nvidia-smi' }, { nvidiaSmiXml: join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml') }]) {
      const context = testContext(paths, 60);
      collector = createNvlinkCollector(context);
      await collector.start();
      await expect(collector.update()).resolves.toBeUndefined();
      expect(await context.registry.metrics()).not.toMatch(/^steadfast_gpu_nvlink_errors_total\{/m);
      await collector.close();
      collector = undefined;
    }
  });
});
