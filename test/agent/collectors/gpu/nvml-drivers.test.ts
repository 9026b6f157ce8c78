import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import type { Collector } from '../../../../agent/collector.js';
import { createGpuCollector } from '../../../../agent/collectors/gpu/collector.js';
import { createNvlinkCollector } from '../../../../agent/collectors/nvlink.js';
import { GpuProcessBoard } from '../../../../agent/gpu-processes.js';
import { StandInNvml, type StandInDriver } from '../../../../tryit/nvml/stand-in.js';
import { FIXTURES, scrapeOne, seriesValue, tempDirPerTest, testContext, waitFor, type TestContext } from '../../helpers.js';

/**
 * The NVML reader on the GPUs and drivers fleets run: MIG on, the symbol sets of older drivers
 * (R470, R450: the stand-in built without the entry points they lack), a driver whose versioned
 * call fails, NVLink past link 18, a GPU that answers "lost".
 */

const dir = tempDirPerTest('steadfast-nvml-drivers-');
const H200_STATE = readFileSync(join(FIXTURES, 'nvml', 'h200_580.159.04.state'), 'utf8');
const MIG_STATE = readFileSync(join(FIXTURES, 'nvml', 'a100-mig_510.47.03.state'), 'utf8');
const H200_LABELS = 'gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"';
const A100_LABELS = 'gpu="0",pci_bus_id="0000:00:04",UUID="GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"';
const PROCESSES = '0 proc.compute 4242 2147483648\n0 proc.graphics 4243 1073741824\nprocname.4242 /usr/bin/python3\n';
let collectors: Collector[] = [];

afterEach(async () => {
  await Promise.all(collectors.map((collector) => collector.close()));
  collectors = [];
});

let libraries = 0;

/** A stand-in in a directory of its own: a library still mapped by an NVML thread must never be overwritten. */
async function standIn(state: string, driver: StandInDriver = 'current'): Promise<StandInNvml> {
  return StandInNvml.create(join(dir(), `nvml-${libraries++}`), state, driver);
}

function nvmlContext(library: StandInNvml, pollSeconds = 60): TestContext {
  return testContext({}, pollSeconds, { 'gpu.source': 'nvml', 'gpu.nvml-library': library.library });
}

async function scrape(context: TestContext): Promise<string> {
  const collector = createGpuCollector(context);
  collectors.push(collector);
  return scrapeOne(context, collector);
}

function functionInUse(text: string, reading: string): string | undefined {
  return new RegExp(`steadfast_gpu_nvml_function_info\\{reading="${reading}",function="([^"]+)"\\} 1`).exec(text)?.[1];
}

describe('NVML on a MIG-enabled GPU', () => {
  it('reads the aggregate counters by architecture, no volatile ones through the GPU, and each MIG device its own', async () => {
    const text = await scrape(nvmlContext(await standIn(MIG_STATE.replace('0 migdev.1.sram 0', '0 migdev.1.sram 2'))));
    // Aggregate SRAM and DRAM (Ampere), not the pre-Turing memory units a failed volatile probe would pick.
    expect(seriesValue(text, `steadfast_gpu_ecc_errors_total{${A100_LABELS},scope="aggregate",type="correctable",location="sram"}`)).toBe(0);
    expect(seriesValue(text, `steadfast_gpu_ecc_errors_total{${A100_LABELS},scope="aggregate",type="uncorrectable",location="dram"}`)).toBe(0);
    expect(text).not.toContain('location="device_memory"');
    // Volatile: each MIG device's uncorrectable SRAM count, labelled with its instances.
    expect(
      seriesValue(
        text,
        `steadfast_gpu_ecc_errors_total{${A100_LABELS},scope="volatile",type="uncorrectable",location="sram",GPU_I_ID="2",compute_instance_id="0"}`,
      ),
    ).toBe(2);
    expect(text.match(/scope="volatile"/g)).toHaveLength(2);
    // Nothing the header says is unreadable under MIG was counted as an error.
    expect(text).not.toContain('steadfast_gpu_nvml_errors_total{');
  });

  it('falls back to the aggregate SRAM counter where the driver cannot name the architecture', async () => {
    const text = await scrape(nvmlContext(await standIn(MIG_STATE.replace('0 arch 7\n', ''))));
    expect(seriesValue(text, `steadfast_gpu_ecc_errors_total{${A100_LABELS},scope="aggregate",type="uncorrectable",location="sram"}`)).toBe(0);
    expect(text).not.toContain('location="device_memory"');
  });
});

describe('NVML of older drivers', () => {
  it('lists the processes through _v2 on an R470 library, and reads what it has through the older calls', async () => {
    const library = await standIn(`${H200_STATE}${PROCESSES}`, 'r470');
    const board = new GpuProcessBoard();
    const context = { ...nvmlContext(library), gpuProcesses: board };
    const text = await scrape(context);
    expect(functionInUse(text, 'processes')).toBe('nvmlDeviceGetComputeRunningProcesses_v2');
    expect(functionInUse(text, 'memory')).toBe('nvmlDeviceGetMemoryInfo');
    expect(functionInUse(text, 'temperature')).toBe('nvmlDeviceGetTemperature');
    expect(functionInUse(text, 'clock_reasons')).toBe('nvmlDeviceGetCurrentClocksThrottleReasons');
    expect(functionInUse(text, 'fabric')).toBe('none');
    expect(seriesValue(text, `steadfast_gpu_process_info{${H200_LABELS},pid="4242",type="C",name="/usr/bin/python3"}`)).toBe(1);
    expect(seriesValue(text, `steadfast_gpu_process_used_memory_bytes{${H200_LABELS},pid="4242"}`)).toBe(2147483648);
    expect(board.gpusOf(4242)).toEqual([expect.objectContaining({ pciBusId: '0000:00:06' })]);
    expect(seriesValue(text, `steadfast_gpu_temperature_celsius{${H200_LABELS}}`)).toBe(37);
    // nvmlMemory_t counts the driver's reservation (645922816 bytes) as used; v2 does not (0 used).
    expect(seriesValue(text, `steadfast_gpu_memory_used_bytes{${H200_LABELS}}`)).toBe(645922816);
    expect(seriesValue(text, `steadfast_gpu_throttle_reason{${H200_LABELS},reason="gpu_idle"}`)).toBe(1);
  });

  it('lists the processes through the unsuffixed v1 call (16-byte entries) where neither _v3 nor _v2 exists', async () => {
    const library = await standIn(`${H200_STATE}${PROCESSES}0 proc.compute 4244 1048576\n`, 'r450');
    const text = await scrape(nvmlContext(library));
    expect(functionInUse(text, 'processes')).toBe('nvmlDeviceGetComputeRunningProcesses');
    expect(seriesValue(text, `steadfast_gpu_process_used_memory_bytes{${H200_LABELS},pid="4242"}`)).toBe(2147483648);
    expect(seriesValue(text, `steadfast_gpu_process_used_memory_bytes{${H200_LABELS},pid="4244"}`)).toBe(1048576);
    expect(seriesValue(text, `steadfast_gpu_process_info{${H200_LABELS},pid="4243",type="G",name=""}`)).toBe(1);
  });

  it('uses the versioned calls where the driver has them, and falls back when a versioned call fails', async () => {
    const current = await scrape(nvmlContext(await standIn(`${H200_STATE}0 fabric 3 0\n`)));
    expect(functionInUse(current, 'temperature')).toBe('nvmlDeviceGetTemperatureV');
    expect(functionInUse(current, 'fabric')).toBe('nvmlDeviceGetGpuFabricInfoV');
    expect(seriesValue(current, `steadfast_gpu_temperature_celsius{${H200_LABELS}}`)).toBe(37);
    expect(seriesValue(current, `steadfast_gpu_fabric_state{${H200_LABELS},state="completed"}`)).toBe(1);
    expect(seriesValue(current, `steadfast_gpu_memory_used_bytes{${H200_LABELS}}`)).toBe(0);

    // A driver whose fabric call knows version 2 only, and whose memory v2 call errs: the older forms answer.
    const older = await scrape(nvmlContext(await standIn(`${H200_STATE}0 fabric 2 0\n0 fabric.version 2\n0 fail.memory.v2 25\n`)));
    expect(seriesValue(older, `steadfast_gpu_fabric_state{${H200_LABELS},state="in_progress"}`)).toBe(1);
    expect(seriesValue(older, `steadfast_gpu_memory_used_bytes{${H200_LABELS}}`)).toBe(645922816);
    expect(older).not.toContain('steadfast_gpu_nvml_errors_total{');
  });
});

describe('NVML errors', () => {
  it('names every return code nvml.h defines in the error label', async () => {
    const text = await scrape(nvmlContext(await standIn(`${H200_STATE}0 fail.power 23\n0 fail.power.limit 30\n`)));
    expect(seriesValue(text, 'steadfast_gpu_nvml_errors_total{function="nvmlDeviceGetPowerUsage",error="insufficient_resources"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_gpu_nvml_errors_total{function="nvmlDeviceGetEnforcedPowerLimit",error="reset_type_not_supported"}')).toBe(1);
  });

  it('stops reading a GPU at its first "GPU is lost", shows it as not present and sends it on the fast path', async () => {
    const twoGpus = `${H200_STATE.replace('gpus 1', 'gpus 2')}1 pci 00000000:00:07.0\n1 minor 1\n1 uuid GPU-11111111-0000-0000-0000-000000000000\n1 temp 40\n`;
    const library = await standIn(twoGpus);
    const context = nvmlContext(library, 0.05);
    await scrape(context);
    await library.setState(`${twoGpus}1 lost 1\n`);
    const gpu1 = 'steadfast_gpu_present{gpu="1",pci_bus_id="0000:00:07",UUID="GPU-11111111-0000-0000-0000-000000000000"}';
    await waitFor(async () => seriesValue(await context.registry.metrics(), gpu1) === 0);
    expect(context.events).toEqual([expect.objectContaining({ kind: 'gpu_lost', gpu: '0000:00:07' })]);
    // One call answered "lost" each poll; none after it was made.
    const lostCalls = (await context.registry.metrics()).match(/steadfast_gpu_nvml_errors_total\{function="(\w+)",error="gpu_is_lost"\}/g) ?? [];
    expect(lostCalls).toEqual(['steadfast_gpu_nvml_errors_total{function="nvmlDeviceGetMinorNumber",error="gpu_is_lost"}']);
    expect(seriesValue(await context.registry.metrics(), `steadfast_gpu_temperature_celsius{${H200_LABELS}}`)).toBe(37);
  });
});

describe('NVLink through NVML', () => {
  it('reads links past 18 (nvml.h 13 allows 36)', async () => {
    const links = Array.from({ length: 21 }, (_, link) => `0 nvlink.${link} ${link === 20 ? 1 : 0}`);
    const library = await standIn(`${H200_STATE}${links.join('\n')}\n0 nvlink.20.2 7\n`);
    const context = nvmlContext(library);
    const collector = createNvlinkCollector(context);
    collectors.push(collector);
    const text = await scrapeOne(context, collector);
    expect(seriesValue(text, 'steadfast_gpu_nvlink_errors_total{gpu="0",UUID="GPU-00000000-0000-0000-0000-000000000000",link="20",type="crc"}')).toBe(7);
  });
});
