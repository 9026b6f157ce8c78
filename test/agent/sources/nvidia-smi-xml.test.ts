import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { InputError } from '../../../core/errors.js';
import { PCI_BUS_ID_PATTERN } from '../../../core/names.js';
import { parseNvidiaSmiXml, readNvidiaSmiXml, type GpuSample } from '../../../agent/sources/nvidia-smi-xml.js';
import { NVIDIA_SMI_XML } from '../helpers.js';

const XML_FILES = readdirSync(NVIDIA_SMI_XML).filter((name) => name.endsWith('.xml'));
const MiB = 1024 ** 2;
const MHz = 1e6;

function onlyGpu(name: string): GpuSample {
  const report = parseNvidiaSmiXml(readFileSync(join(NVIDIA_SMI_XML, name), 'utf8'));
  expect(report.gpus).toHaveLength(1);
  return report.gpus[0] as GpuSample;
}

function ecc(sample: GpuSample, scope: string, type: string, location: string): number | undefined {
  return sample.ecc.find((count) => count.scope === scope && count.type === type && count.location === location)?.count;
}

describe('nvidia-smi -q -x parser on the real captures', () => {
  it('finds the seven captures the README lists', () => {
    expect(XML_FILES).toHaveLength(7);
  });

  it('reads the real H200 (v13, driver 580) as NVML read the same GPU on that machine', () => {
    // The values held against NVML when the capture was taken (SOURCE.md).
    expect(onlyGpu('h200_580.159.04_v13.xml')).toMatchObject({
      pciBusId: '0000:00:06',
      productName: 'NVIDIA H200',
      driverVersion: '580.159.04',
      migEnabled: false,
      temperatureCelsius: 37,
      memoryTemperatureCelsius: 41,
      powerDrawWatts: 81.16,
      powerLimitWatts: 700,
      memoryTotalBytes: 143771 * MiB,
      remappedRows: { correctable: 0, uncorrectable: 0, pending: false, failure: false },
      retiredPages: undefined,
      pcieLinkGeneration: 5,
      pcieLinkWidth: 16,
      pcieReplayErrors: 2,
      fabric: undefined,
    });
  });

  it.each(XML_FILES)('reads %s into one GPU with identity, a normalised PCI bus id and no NaN anywhere', (name) => {
    const sample = onlyGpu(name);
    expect(sample.pciBusId).toMatch(PCI_BUS_ID_PATTERN);
    expect(sample.uuid).toMatch(/^GPU-[0-9a-f-]{36}$/);
    expect(sample.productName).toBeTruthy();
    expect(sample.driverVersion).toMatch(/^\d+\.\d+/);
    const numbers = JSON.stringify(sample, (_key, value: unknown) => (typeof value === 'number' && Number.isNaN(value) ? 'NaN' : value));
    expect(numbers).not.toContain('NaN');
  });

  it('reads the A10G (v11) with its populated remapped-rows block and units converted to base units', () => {
    expect(onlyGpu('telegraf_a10g_515.105.01.xml')).toMatchObject({
      index: 0,
      pciBusId: '0000:00:1e',
      productName: 'NVIDIA A10G',
      driverVersion: '515.105.01',
      temperatureCelsius: 17,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: 25.58,
      powerLimitWatts: 300,
      utilizationRatio: 0,
      memoryUsedBytes: 22 * MiB,
      memoryTotalBytes: 23028 * MiB,
      remappedRows: { correctable: 0, uncorrectable: 0, pending: false, failure: false },
      // Retired pages are N/A on Ampere (replaced by row remapping).
      retiredPages: undefined,
      pcieLinkGeneration: 1,
      pcieLinkWidth: 8,
      pcieReplayErrors: 0,
    });
  });

  it('reads the old P100 ECC schema as correctable single-bit and uncorrectable double-bit counts per memory unit', () => {
    const sample = onlyGpu('netdata_tesla-p100_510.47.03.xml');
    expect(ecc(sample, 'aggregate', 'correctable', 'device_memory')).toBe(3);
    expect(ecc(sample, 'aggregate', 'uncorrectable', 'device_memory')).toBe(0);
    expect(ecc(sample, 'volatile', 'correctable', 'register_file')).toBe(0);
    // N/A units (l1_cache, cbu) and the repeated `total` are not counts of their own.
    expect(sample.ecc.some((count) => ['l1_cache', 'cbu', 'total'].includes(count.location))).toBe(false);
    expect(sample.remappedRows).toBeUndefined();
    expect(sample.retiredPages).toEqual({ singleBit: 0, doubleBit: 0, pending: false });
    expect(sample.memoryTemperatureCelsius).toBeUndefined();
  });

  it('reads the A100 MIG capture (v11) with N/A utilisation, the GPU volatile ECC left undefined, each MIG device its own, and remapped rows absent', () => {
    const sample = onlyGpu('netdata_a100-sxm4-40gb-mig_510.47.03_v11.xml');
    expect(sample).toMatchObject({
      migEnabled: true,
      utilizationRatio: undefined,
      memoryTemperatureCelsius: 44,
      remappedRows: undefined,
      powerDrawWatts: 66.92,
    });
    // Volatile counts only per MIG device (its GPU and compute instance), none for the GPU itself.
    expect(sample.ecc.filter((count) => count.scope === 'volatile')).toEqual([
      { scope: 'volatile', type: 'uncorrectable', location: 'sram', count: 0, gpuInstance: 1, computeInstance: 0 },
      { scope: 'volatile', type: 'uncorrectable', location: 'sram', count: 0, gpuInstance: 2, computeInstance: 0 },
    ]);
    expect(ecc(sample, 'aggregate', 'uncorrectable', 'dram')).toBe(0);
  });

  it('reads the A100 v12 capture, where power moved to gpu_power_readings and the limit is current_power_limit', () => {
    const report = parseNvidiaSmiXml(readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a100-sxm4-80gb-mig_535.54.03_v12.xml'), 'utf8'));
    // The contributor trimmed the file to one GPU; attached_gpus still says 4.
    expect(report.attachedGpus).toBe(4);
    expect(report.gpus[0]).toMatchObject({ index: 1, pciBusId: '0000:01:00', powerDrawWatts: 67.03, powerLimitWatts: 500, memoryTotalBytes: 81920 * MiB });
    // MIG on, yet this driver prints the GPU's volatile counts: they hold the MIG devices' errors, which are not added again.
    expect(report.gpus[0]?.ecc.filter((count) => count.scope === 'volatile')).toHaveLength(4);
    expect(report.gpus[0]?.ecc.some((count) => count.gpuInstance !== undefined)).toBe(false);
  });

  it('reads the v13 capture: average power draw, and no ECC series while ECC is disabled', () => {
    const sample = onlyGpu('telegraf_rtx-4000-sff-ada_595.84_v13.xml');
    expect(sample).toMatchObject({ powerDrawWatts: 8.81, powerLimitWatts: 70, memoryUsedBytes: 3534 * MiB, pciBusId: '0000:06:00' });
    expect(sample.ecc).toEqual([]);
    expect(sample.remappedRows).toEqual({ correctable: 0, uncorrectable: 0, pending: false, failure: false });
  });

  it('reads the T4 retired-page counts as reported zeros, not as missing', () => {
    expect(onlyGpu('telegraf_tesla-t4_515.105.01.xml').retiredPages).toEqual({ singleBit: 0, doubleBit: 0, pending: false });
  });
});

describe('nvidia-smi -q -x parser on edge cases', () => {
  const wrap = (gpu: string): string =>
    `<?xml version="1.0" ?>\n<nvidia_smi_log><driver_version>999.1</driver_version><attached_gpus>1</attached_gpus>${gpu}</nvidia_smi_log>\n`;

  it('sums the v13 parity and SEC-DED uncorrectable SRAM counts into one sram uncorrectable count', () => {
    const report = parseNvidiaSmiXml(
      wrap(`<gpu id="00000018:9B:00.0"><minor_number>3</minor_number><ecc_errors><aggregate>
        <sram_correctable>7</sram_correctable><sram_uncorrectable_parity>2</sram_uncorrectable_parity>
        <sram_uncorrectable_secded>3</sram_uncorrectable_secded><dram_uncorrectable>N/A</dram_uncorrectable>
      </aggregate></ecc_errors></gpu>`),
    );
    const sample = report.gpus[0] as GpuSample;
    expect(sample.pciBusId).toBe('0018:9b:00');
    expect(sample.index).toBe(3);
    expect(ecc(sample, 'aggregate', 'uncorrectable', 'sram')).toBe(5);
    expect(ecc(sample, 'aggregate', 'correctable', 'sram')).toBe(7);
    expect(ecc(sample, 'aggregate', 'uncorrectable', 'dram')).toBeUndefined();
  });

  it('treats every placeholder nvidia-smi prints for a missing value as undefined, never 0', () => {
    const report = parseNvidiaSmiXml(
      wrap(`<gpu id="00000000:01:00.0"><temperature><gpu_temp>[N/A]</gpu_temp><memory_temp>Requested functionality has been deprecated</memory_temp></temperature>
        <power_readings><power_draw>[Not Supported]</power_draw></power_readings><utilization><gpu_util>N/A</gpu_util></utilization>
        <remapped_rows><remapped_row_corr>N/A</remapped_row_corr></remapped_rows><pci><replay_counter>N/A</replay_counter></pci></gpu>`),
    );
    expect(report.gpus[0]).toMatchObject({
      index: 0,
      temperatureCelsius: undefined,
      memoryTemperatureCelsius: undefined,
      powerDrawWatts: undefined,
      utilizationRatio: undefined,
      remappedRows: undefined,
      pcieReplayErrors: undefined,
    });
  });

  it('reads a pending and failed row remap as true', () => {
    const report = parseNvidiaSmiXml(
      wrap(`<gpu id="00000000:01:00.0"><remapped_rows><remapped_row_corr>1</remapped_row_corr><remapped_row_unc>2</remapped_row_unc>
        <remapped_row_pending>Yes</remapped_row_pending><remapped_row_failure>Yes</remapped_row_failure></remapped_rows></gpu>`),
    );
    expect(report.gpus[0]?.remappedRows).toEqual({ correctable: 1, uncorrectable: 2, pending: true, failure: true });
  });

  it('reads a report with no GPU as an empty list', () => {
    expect(parseNvidiaSmiXml(wrap('')).gpus).toEqual([]);
  });

  it('refuses a document cut short, so that a half-written file never looks like a lost GPU', () => {
    const whole = readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml'), 'utf8');
    expect(() => parseNvidiaSmiXml(whole.slice(0, whole.length / 2))).toThrow(InputError);
    expect(() => parseNvidiaSmiXml('NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.')).toThrow(InputError);
  });

  it('refuses a document whose tags do not match rather than read values from the wrong elements', () => {
    const whole = readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml'), 'utf8');
    const broken = whole.replace('</temperature>', '</gpu_temp>');
    expect(broken).not.toBe(whole);
    expect(() => parseNvidiaSmiXml(broken)).toThrow(/does not parse: Unexpected close tag; Line: \d+/);
  });

  it('names the line of the original document in a parse error after the supported clocks, which it does not parse', () => {
    const whole = readFileSync(join(NVIDIA_SMI_XML, 'telegraf_a10g_515.105.01.xml'), 'utf8');
    // txml counts lines from 0; the tag is on the line it counts as (lines before it).
    const lineOf = (tag: string): number => whole.slice(0, whole.indexOf(tag)).split('\n').length - 1;
    expect(whole.indexOf('<supported_clocks>')).toBeLessThan(whole.indexOf('</processes>'));
    expect(() => parseNvidiaSmiXml(whole.replace('</temperature>', '</gpu_temp>'))).toThrow(`Line: ${lineOf('</temperature>')};`);
    expect(() => parseNvidiaSmiXml(whole.replace('</processes>', '</gpu_procs>'))).toThrow(`Line: ${lineOf('</processes>')};`);
  });

  it('reads an element whose text holds XML entities as the text they stand for', () => {
    const report = parseNvidiaSmiXml(wrap('<gpu id="00000000:3B:00.0"><product_name>NVIDIA A&amp;B &lt;test&gt;</product_name></gpu>'));
    expect(report.gpus[0]?.productName).toBe('NVIDIA A&B <test>');
  });
});

/** Clocks (MHz) and active throttle reasons as each capture states them, read off the XML by hand. */
const CLOCK_CASES = [
  {
    file: 'netdata_a100-sxm4-40gb-mig_510.47.03_v11.xml',
    clocks: { graphics: 1410, sm: 1410, memory: 1215, video: 1275 },
    max: { graphics: 1410, sm: 1410, memory: 1215, video: 1290 },
    active: [],
  },
  {
    file: 'netdata_tesla-p100_510.47.03.xml',
    clocks: { graphics: 405, sm: 405, memory: 715, video: 835 },
    max: { graphics: 1328, sm: 1328, memory: 715, video: 1328 },
    active: ['gpu_idle'],
  },
  {
    file: 'telegraf_a100-sxm4-80gb-mig_535.54.03_v12.xml',
    clocks: { graphics: 1275, sm: 1275, memory: 1593, video: 1275 },
    max: { graphics: 1410, sm: 1410, memory: 1593, video: 1290 },
    active: [],
  },
  {
    file: 'telegraf_a10g_515.105.01.xml',
    clocks: { graphics: 210, sm: 210, memory: 405, video: 555 },
    max: { graphics: 1710, sm: 1710, memory: 6251, video: 1500 },
    active: ['gpu_idle'],
  },
  {
    file: 'h200_580.159.04_v13.xml',
    clocks: { graphics: 345, sm: 345, memory: 3201, video: 765 },
    max: { graphics: 1980, sm: 1980, memory: 3201, video: 1545 },
    active: ['gpu_idle'],
  },
  {
    file: 'telegraf_rtx-4000-sff-ada_595.84_v13.xml',
    clocks: { graphics: 210, sm: 210, memory: 405, video: 765 },
    max: { graphics: 3105, sm: 3105, memory: 7001, video: 2415 },
    active: ['gpu_idle'],
  },
  {
    file: 'telegraf_tesla-t4_515.105.01.xml',
    clocks: { graphics: 585, sm: 585, memory: 5000, video: 810 },
    max: { graphics: 1590, sm: 1590, memory: 5001, video: 1470 },
    active: [],
  },
] as const;

const ALL_REASONS = [
  'gpu_idle',
  'applications_clocks_setting',
  'sw_power_cap',
  'hw_slowdown',
  'hw_thermal_slowdown',
  'hw_power_brake_slowdown',
  'sync_boost',
  'sw_thermal_slowdown',
  'display_clocks_setting',
];

const inHertz = (megahertz: Readonly<Record<string, number>>): Record<string, number> =>
  Object.fromEntries(Object.entries(megahertz).map(([domain, value]) => [domain, value * MHz]));

describe('nvidia-smi -q -x clocks and throttle reasons', () => {
  it('covers every capture in the directory', () => {
    expect(CLOCK_CASES.map((entry) => entry.file).sort()).toEqual([...XML_FILES].sort());
  });

  it.each(CLOCK_CASES)('reads the current and maximum clocks of $file in Hz', ({ file, clocks, max }) => {
    const sample = onlyGpu(file);
    expect(sample.clocks).toEqual(inHertz(clocks));
    expect(sample.maxClocks).toEqual(inHertz(max));
  });

  it.each(CLOCK_CASES)('reads all nine throttle reasons of $file under the same names, whichever schema spells them', ({ file, active }) => {
    const reasons = onlyGpu(file).throttleReasons ?? {};
    expect(Object.keys(reasons).sort()).toEqual([...ALL_REASONS].sort());
    expect(Object.keys(reasons).filter((reason) => reasons[reason])).toEqual(active);
  });

  it('maps the v11 clocks_throttle_reason_* and v12+ clocks_event_reason_* spellings of a reason to one name', () => {
    const wrap = (block: string): string => `<nvidia_smi_log><gpu id="00000000:01:00.0">${block}</gpu></nvidia_smi_log>`;
    const old = parseNvidiaSmiXml(
      wrap(
        '<clocks_throttle_reasons><clocks_throttle_reason_sw_thermal_slowdown>Active</clocks_throttle_reason_sw_thermal_slowdown></clocks_throttle_reasons>',
      ),
    );
    const current = parseNvidiaSmiXml(
      wrap('<clocks_event_reasons><clocks_event_reason_sw_thermal_slowdown>Active</clocks_event_reason_sw_thermal_slowdown></clocks_event_reasons>'),
    );
    expect(old.gpus[0]?.throttleReasons).toEqual({ sw_thermal_slowdown: true });
    expect(current.gpus[0]?.throttleReasons).toEqual({ sw_thermal_slowdown: true });
  });

  it('leaves clocks and reasons undefined where nvidia-smi prints N/A, and ignores elements that are not reasons', () => {
    const report = parseNvidiaSmiXml(
      `<nvidia_smi_log><gpu id="00000000:01:00.0"><clocks><graphics_clock>N/A</graphics_clock><sm_clock>1980 MHz</sm_clock></clocks>
        <max_clocks><sm_clock>N/A</sm_clock></max_clocks>
        <clocks_event_reasons><clocks_event_reason_gpu_idle>N/A</clocks_event_reason_gpu_idle><some_other_field>Active</some_other_field></clocks_event_reasons></gpu></nvidia_smi_log>`,
    );
    expect(report.gpus[0]).toMatchObject({ clocks: { sm: 1980 * MHz }, maxClocks: undefined, throttleReasons: undefined });
  });
});

describe('nvidia-smi -q -x parser on arbitrary input', () => {
  it('returns an error result, never throws, for any string, complete-looking or not', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary', maxLength: 300 }), fc.boolean(), (input, closed) => {
        const result = readNvidiaSmiXml(closed ? `${input}</nvidia_smi_log>` : input);
        if (!result.ok) expect(result.error).toBeInstanceOf(InputError);
      }),
      { numRuns: 200 },
    );
  });

  it('returns a result, never throws, for XML-shaped strings built from the elements the parser reads', () => {
    const element = fc.constantFrom(
      'nvidia_smi_log',
      'gpu',
      'clocks',
      'sm_clock',
      'max_clocks',
      'clocks_event_reasons',
      'clocks_throttle_reason_gpu_idle',
      'ecc_errors',
      'volatile',
      'single_bit',
      'remapped_rows',
      'retired_pages',
      'pci',
      'temperature',
      '__proto__',
      'constructor',
    );
    const fragment = fc.array(
      fc.oneof(
        element.map((name) => `<${name}>`),
        element.map((name) => `</${name}>`),
        fc.constantFrom('Active', 'Not Active', '12 MHz', 'N/A', '<gpu id="00000000:01:00.0">', '&amp;', '<!--', ']]>', ' '),
        fc.string({ maxLength: 8 }),
      ),
      { maxLength: 60 },
    );
    fc.assert(
      fc.property(fragment, (parts) => {
        const result = readNvidiaSmiXml(`<nvidia_smi_log>${parts.join('')}</nvidia_smi_log>`);
        expect(typeof result.ok).toBe('boolean');
      }),
      { numRuns: 300 },
    );
  });

  it('returns an error result naming the problem for a truncated capture', () => {
    const result = readNvidiaSmiXml('<nvidia_smi_log><gpu id="00000000:00:1E.0">');
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.error.message).toMatch(/incomplete/);
  });
});
