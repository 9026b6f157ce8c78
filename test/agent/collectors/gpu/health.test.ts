import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { createGpuCollector } from '../../../../agent/collectors/gpu/collector.js';
import { gpuHealthAction } from '../../../../agent/collectors/gpu/health-action.js';
import { parseNvidiaSmiXml } from '../../../../agent/sources/nvidia-smi-xml.js';
import { NVIDIA_SMI_XML, seriesValue, testContext } from '../../helpers.js';

const A100 = readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a100-sxm4-80gb-mig_535.54.03_v12.xml'), 'utf8');
const A10G = readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml'), 'utf8');

let collector: Collector | undefined;
let dir: string | undefined;

afterEach(async () => {
  await collector?.close();
  collector = undefined;
  if (dir) rmSync(dir, { recursive: true, force: true });
  dir = undefined;
});

describe('GPU fabric state', () => {
  it('exports no fabric series for a GPU whose fabric is N/A (A100 capture)', async () => {
    expect(parseNvidiaSmiXml(A100).gpus[0]?.fabric).toBeUndefined();
  });

  it('exports the fabric state and status of an NVSwitch GPU', async () => {
    // The A100 capture's <fabric> element with the values a real H200 reports in `nvidia-smi -q`
    // (shared/realworld nvidia-smi q-text, "State : Completed", "Status : Success"): no public
    // XML capture of a registered fabric was found, so the two real captures are joined here.
    const xml = A100.replace(/<fabric>\s*<state>N\/A<\/state>\s*<status>N\/A<\/status>/, '<fabric>\n<state>Completed</state>\n<status>Success</status>');
    expect(xml).not.toBe(A100);
    dir = mkdtempSync(join(tmpdir(), 'steadfast-fabric-'));
    const file = join(dir, 'nvidia-smi.xml');
    writeFileSync(file, xml);
    const context = testContext({ nvidiaSmiXml: file }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    const text = await context.registry.metrics();
    expect(text).toMatch(/^steadfast_gpu_fabric_state\{[^}]*state="completed"\} 1$/m);
    expect(text).toMatch(/^steadfast_gpu_fabric_status_success\{[^}]*\} 1$/m);
  });
});

describe('GPU health action', () => {
  const healthy = parseNvidiaSmiXml(A10G).gpus[0]!;

  it('asks for nothing on the A10G capture, whose remapper has no pending or failed row', () => {
    expect(healthy.remappedRows).toEqual(expect.objectContaining({ pending: false, failure: false }));
    expect(gpuHealthAction(healthy)).toEqual({ action: 'none', reason: 'healthy' });
  });

  it('drains now on a failed row remap, before anything a reset could fix', () => {
    expect(gpuHealthAction({ ...healthy, remappedRows: { pending: true, failure: true } })).toEqual({ action: 'drain', reason: 'row_remap_failed' });
  });

  it('asks for a GPU reset at the next idle moment on a pending remap or page retirement', () => {
    expect(gpuHealthAction({ ...healthy, remappedRows: { pending: true, failure: false } })).toEqual({ action: 'reset_gpu', reason: 'row_remap_pending' });
    expect(gpuHealthAction({ ...healthy, remappedRows: undefined, retiredPages: { pending: true } })).toEqual({
      action: 'reset_gpu',
      reason: 'page_retirement_pending',
    });
  });

  it('watches a GPU held down by hardware slowdown, not one capped by software power limits', () => {
    expect(gpuHealthAction({ ...healthy, throttleReasons: { hw_thermal_slowdown: true } })).toEqual({ action: 'watch', reason: 'hardware_slowdown' });
    expect(gpuHealthAction({ ...healthy, throttleReasons: { sw_power_cap: true } })).toEqual({ action: 'none', reason: 'healthy' });
  });

  it('exports the action as one series per GPU for the controller and the rules', async () => {
    const context = testContext({ nvidiaSmiXml: join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml') }, 60);
    collector = createGpuCollector(context);
    await collector.start();
    const text = await context.registry.metrics();
    expect(
      seriesValue(
        text,
        'steadfast_gpu_health_action{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94",action="none",reason="healthy"}',
      ),
    ).toBe(1);
  });
});
