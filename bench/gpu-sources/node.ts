import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { repoRoot } from '../../core/paths.js';

/**
 * The GPUs of bench/gpu-sources.ts: an HGX H200 node (8 GPUs, one training rank on each, 18
 * active NVLinks per GPU) under training load, written twice from one model: as the stand-in
 * NVML library's state (tryit/nvml/stand-in.c) and as what nvidia-smi prints for it, `-q -x` and
 * `nvlink -e`. The XML repeats the `<gpu>` element of a real H200 capture
 * (test/fixtures/realworld/nvidia-smi-xml/h200_580.159.04_v13.xml: driver 580.159.04, schema v13,
 * supported clocks and all), each with this model's values, so the nvidia-smi source parses a
 * report of the real size and shape. The values are made up but in the ranges an H200 shows
 * while it trains: 97-100 % busy, 590-700 W against a 700 W limit, 1980 MHz (one GPU held at
 * 1755 MHz by its power cap), about 121 GiB of its 140 GiB used.
 */

export const GPU_COUNT = 8;
export const NVLINKS = 18;
export const DRIVER = '580.159.04';
const TEMPLATE = join(repoRoot(), 'test', 'fixtures', 'realworld', 'nvidia-smi-xml', 'h200_580.159.04_v13.xml');
const MIB = 1024 * 1024;
const TOTAL_MIB = 143771;
const RESERVED_MIB = 616;
/** PCI bus numbers of the eight GPUs of an HGX board. */
const BUSES = ['18', '2a', '3a', '5d', '9a', 'ab', 'ba', 'db'];

/** nvmlClocksEventReasons bits, in `<clocks_event_reasons>` order. */
const REASONS: readonly { readonly name: string; readonly bit: number }[] = [
  { name: 'gpu_idle', bit: 0x1 },
  { name: 'applications_clocks_setting', bit: 0x2 },
  { name: 'sw_power_cap', bit: 0x4 },
  { name: 'hw_slowdown', bit: 0x8 },
  { name: 'hw_thermal_slowdown', bit: 0x40 },
  { name: 'hw_power_brake_slowdown', bit: 0x80 },
  { name: 'sync_boost', bit: 0x10 },
  { name: 'sw_thermal_slowdown', bit: 0x20 },
  { name: 'display_clocks_setting', bit: 0x100 },
];
const SUPPORTED_REASONS = REASONS.reduce((mask, reason) => mask | reason.bit, 0);

interface Ecc {
  readonly sramCorrectable: number;
  readonly sramUncorrectable: number;
  readonly dramCorrectable: number;
  readonly dramUncorrectable: number;
}

export interface BenchGpu {
  readonly index: number;
  /** As NVML's busId and nvidia-smi's `<gpu id>` give it: `00000000:18:00.0`. */
  readonly busId: string;
  readonly uuid: string;
  readonly temperature: number;
  readonly memoryTemperature: number;
  /** Average power draw (what NVML's nvmlDeviceGetPowerUsage gives on Hopper), W with two decimals. */
  readonly powerWatts: number;
  readonly instantPowerWatts: number;
  readonly utilization: { readonly gpu: number; readonly memory: number };
  readonly usedMiB: number;
  readonly clocksMHz: { readonly graphics: number; readonly sm: number; readonly memory: number; readonly video: number };
  readonly reasons: number;
  readonly eccVolatile: Ecc;
  readonly eccAggregate: Ecc;
  readonly remappedCorrectable: number;
  readonly pcieReplays: number;
  readonly process: { readonly pid: number; readonly name: string; readonly usedMiB: number };
  /** Per link: replay, recovery, CRC errors. */
  readonly nvlink: readonly (readonly [number, number, number])[];
}

const MAX_CLOCKS_MHZ = { graphics: 1980, sm: 1980, memory: 3201, video: 1545 };
const NO_ECC: Ecc = { sramCorrectable: 0, sramUncorrectable: 0, dramCorrectable: 0, dramUncorrectable: 0 };

/** The eight GPUs; GPU 2 is held by its power cap, GPU 3 has corrected DRAM errors and two remapped rows, GPU 5 PCIe replays, GPUs 4 and 6 NVLink errors. */
export function benchGpus(): BenchGpu[] {
  const temperatures = [54, 57, 61, 55, 58, 53, 56, 59];
  const power = [612.34, 655.1, 699.87, 590.42, 640.05, 618.77, 603.19, 671.58];
  const busy = [99, 98, 100, 97, 99, 98, 100, 99];
  const memoryBusy = [54, 51, 58, 49, 55, 52, 57, 53];
  const used = [121438, 121902, 122410, 121188, 121776, 121534, 121650, 122060];
  return Array.from({ length: GPU_COUNT }, (_, index) => {
    const capped = index === 2;
    const nvlink = Array.from({ length: NVLINKS }, (): [number, number, number] => [0, 0, 0]);
    if (index === 4) nvlink[7] = [3, 0, 1];
    if (index === 6) nvlink[12] = [0, 1, 0];
    return {
      index,
      busId: `00000000:${(BUSES[index] ?? '00').toUpperCase()}:00.0`,
      uuid: `GPU-5eadfa57-b3e7-4c1d-9a2f-6e1c0000000${index}`,
      temperature: temperatures[index] ?? 55,
      memoryTemperature: (temperatures[index] ?? 55) + 8,
      powerWatts: power[index] ?? 600,
      instantPowerWatts: Math.round(((power[index] ?? 600) + 7.31) * 100) / 100,
      utilization: { gpu: busy[index] ?? 99, memory: memoryBusy[index] ?? 50 },
      usedMiB: used[index] ?? 121000,
      clocksMHz: { graphics: capped ? 1755 : 1980, sm: capped ? 1755 : 1980, memory: 3201, video: 1545 },
      reasons: capped ? 0x4 : 0,
      eccVolatile: NO_ECC,
      eccAggregate: index === 3 ? { ...NO_ECC, dramCorrectable: 12 } : NO_ECC,
      remappedCorrectable: index === 3 ? 2 : 0,
      pcieReplays: index === 5 ? 3 : 0,
      process: { pid: 73412 + index, name: '/usr/bin/python3', usedMiB: (used[index] ?? 121000) - 532 },
      nvlink,
    };
  });
}

/** The stand-in NVML's state (the format in tryit/nvml/stand-in.c's header). No `events`: see bench/gpu-sources.ts. */
export function standInState(gpus: readonly BenchGpu[]): string {
  const lines = [`driver ${DRIVER}`, `gpus ${gpus.length}`];
  for (const gpu of gpus) {
    const at = (key: string, value: string | number): void => {
      lines.push(`${gpu.index} ${key} ${value}`);
    };
    at('pci', gpu.busId);
    at('minor', gpu.index);
    at('uuid', gpu.uuid);
    at('name', 'NVIDIA H200');
    at('mig', '0 0');
    at('temp', gpu.temperature);
    at('field.82', gpu.memoryTemperature);
    at('power', Math.round(gpu.powerWatts * 1000));
    at('power.limit', 700_000);
    at('util', `${gpu.utilization.gpu} ${gpu.utilization.memory}`);
    const free = TOTAL_MIB - RESERVED_MIB - gpu.usedMiB;
    at('memory', `${TOTAL_MIB * MIB} ${RESERVED_MIB * MIB} ${gpu.usedMiB * MIB} ${free * MIB}`);
    // ecc.<0 corrected | 1 uncorrected>.<0 volatile | 1 aggregate>.<7 SRAM | 2 DRAM>
    for (const [scope, ecc] of [
      [0, gpu.eccVolatile],
      [1, gpu.eccAggregate],
    ] as const) {
      at(`ecc.0.${scope}.7`, ecc.sramCorrectable);
      at(`ecc.1.${scope}.7`, ecc.sramUncorrectable);
      at(`ecc.0.${scope}.2`, ecc.dramCorrectable);
      at(`ecc.1.${scope}.2`, ecc.dramUncorrectable);
    }
    at('remapped', `${gpu.remappedCorrectable} 0 0 0`);
    at('pcie.gen', 5);
    at('pcie.width', 16);
    at('pcie.replays', gpu.pcieReplays);
    const clocks = [gpu.clocksMHz.graphics, gpu.clocksMHz.sm, gpu.clocksMHz.memory, gpu.clocksMHz.video];
    const maxClocks = [MAX_CLOCKS_MHZ.graphics, MAX_CLOCKS_MHZ.sm, MAX_CLOCKS_MHZ.memory, MAX_CLOCKS_MHZ.video];
    clocks.forEach((mhz, type) => at(`clock.${type}`, mhz));
    maxClocks.forEach((mhz, type) => at(`maxclock.${type}`, mhz));
    at('clock.reasons', `0x${gpu.reasons.toString(16)}`);
    at('clock.reasons.supported', `0x${SUPPORTED_REASONS.toString(16)}`);
    at('fabric', '3 0');
    at('proc.compute', `${gpu.process.pid} ${gpu.process.usedMiB * MIB}`);
    gpu.nvlink.forEach((counts, link) => {
      at(`nvlink.${link}`, 1);
      counts.forEach((count, counter) => at(`nvlink.${link}.${counter}`, count));
    });
    lines.push(`procname.${gpu.process.pid} ${gpu.process.name}`);
  }
  return `${lines.join('\n')}\n`;
}

/** Sets the text of the element at `path` (the first match at each level) of `xml`. */
function setText(xml: string, path: readonly string[], value: string): string {
  let from = 0;
  let to = xml.length;
  for (const name of path) {
    const open = xml.indexOf(`<${name}>`, from);
    const close = open < 0 ? -1 : xml.indexOf(`</${name}>`, open);
    if (open < 0 || close < 0 || close > to) throw new Error(`${TEMPLATE} has no <${path.join('><')}>`);
    from = open + name.length + 2;
    to = close;
  }
  return xml.slice(0, from) + value + xml.slice(to);
}

function eccXml(xml: string, scope: 'volatile' | 'aggregate', ecc: Ecc): string {
  let out = setText(xml, ['ecc_errors', scope, 'sram_correctable'], String(ecc.sramCorrectable));
  // v13 splits SRAM uncorrectable errors by detector; the parser adds the two.
  out = setText(out, ['ecc_errors', scope, 'sram_uncorrectable_parity'], String(ecc.sramUncorrectable));
  out = setText(out, ['ecc_errors', scope, 'sram_uncorrectable_secded'], '0');
  out = setText(out, ['ecc_errors', scope, 'dram_correctable'], String(ecc.dramCorrectable));
  return setText(out, ['ecc_errors', scope, 'dram_uncorrectable'], String(ecc.dramUncorrectable));
}

function gpuXml(template: string, gpu: BenchGpu): string {
  const bus = gpu.busId.slice(9, 11);
  let xml = template.replace(/<gpu id="[^"]*">/, `<gpu id="${gpu.busId}">`);
  const edits: [string[], string][] = [
    [['display_attached'], 'No'],
    [['serial'], `165432301${String(gpu.index).padStart(4, '0')}`],
    [['uuid'], gpu.uuid],
    [['minor_number'], String(gpu.index)],
    [['module_id'], String(gpu.index + 1)],
    [['virtualization_mode'], 'None'],
    [['pci', 'pci_bus'], bus],
    [['pci', 'pci_device'], '00'],
    [['pci', 'pci_bus_id'], gpu.busId],
    [['pci', 'replay_counter'], String(gpu.pcieReplays)],
    [['fb_memory_usage', 'used'], `${gpu.usedMiB} MiB`],
    [['fb_memory_usage', 'free'], `${TOTAL_MIB - RESERVED_MIB - gpu.usedMiB} MiB`],
    [['utilization', 'gpu_util'], `${gpu.utilization.gpu} %`],
    [['utilization', 'memory_util'], `${gpu.utilization.memory} %`],
    [['remapped_rows', 'remapped_row_corr'], String(gpu.remappedCorrectable)],
    [['temperature', 'gpu_temp'], `${gpu.temperature} C`],
    [['temperature', 'memory_temp'], `${gpu.memoryTemperature} C`],
    [['gpu_power_readings', 'average_power_draw'], `${gpu.powerWatts.toFixed(2)} W`],
    [['gpu_power_readings', 'instant_power_draw'], `${gpu.instantPowerWatts.toFixed(2)} W`],
    [['clocks', 'graphics_clock'], `${gpu.clocksMHz.graphics} MHz`],
    [['clocks', 'sm_clock'], `${gpu.clocksMHz.sm} MHz`],
    [['clocks', 'mem_clock'], `${gpu.clocksMHz.memory} MHz`],
    [['clocks', 'video_clock'], `${gpu.clocksMHz.video} MHz`],
    [['fabric', 'state'], 'Completed'],
    [['fabric', 'status'], 'Success'],
  ];
  for (const reason of REASONS) {
    edits.push([['clocks_event_reasons', `clocks_event_reason_${reason.name}`], (gpu.reasons & reason.bit) !== 0 ? 'Active' : 'Not Active']);
  }
  for (const [path, value] of edits) xml = setText(xml, path, value);
  xml = eccXml(xml, 'volatile', gpu.eccVolatile);
  xml = eccXml(xml, 'aggregate', gpu.eccAggregate);
  const process = [
    '\t\t\t<process_info>',
    '\t\t\t\t<gpu_instance_id>N/A</gpu_instance_id>',
    '\t\t\t\t<compute_instance_id>N/A</compute_instance_id>',
    `\t\t\t\t<pid>${gpu.process.pid}</pid>`,
    '\t\t\t\t<type>C</type>',
    `\t\t\t\t<process_name>${gpu.process.name}</process_name>`,
    `\t\t\t\t<used_memory>${gpu.process.usedMiB} MiB</used_memory>`,
    '\t\t\t</process_info>',
  ].join('\n');
  return setText(xml, ['processes'], `\n${process}\n\t\t`);
}

/** `nvidia-smi -q -x` for the GPUs: the real H200 capture's `<gpu>` element once per GPU. */
export function nvidiaSmiXml(gpus: readonly BenchGpu[]): string {
  const capture = readFileSync(TEMPLATE, 'utf8');
  const start = capture.indexOf('<gpu id=');
  const end = capture.lastIndexOf('</gpu>') + '</gpu>'.length;
  if (start < 0 || end < start) throw new Error(`${TEMPLATE} has no <gpu> element`);
  const head = capture.slice(0, start).replace(/<attached_gpus>\d+<\/attached_gpus>/, `<attached_gpus>${gpus.length}</attached_gpus>`);
  // The capture's own indentation before its first <gpu> and after its last.
  return `${head}${gpus.map((gpu) => gpuXml(capture.slice(start, end), gpu)).join('\n\t')}${capture.slice(end)}`;
}

/** `nvidia-smi nvlink -e`, in the layout of the H100 capture (test/fixtures/realworld/nvidia-smi-nvlink/). */
export function nvlinkErrorsText(gpus: readonly BenchGpu[]): string {
  const lines: string[] = [];
  for (const gpu of gpus) {
    lines.push(`GPU ${gpu.index}: NVIDIA H200 (UUID: ${gpu.uuid})`);
    gpu.nvlink.forEach(([replay, recovery, crc], link) => {
      lines.push(
        `         Link ${link}: Replay Errors: ${replay}`,
        `         Link ${link}: Recovery Errors: ${recovery}`,
        `         Link ${link}: CRC Errors: ${crc}`,
        '',
      );
    });
  }
  return `${lines.join('\n')}\n`;
}

/**
 * Writes the report files and a stand-in nvidia-smi (a shell script that `cat`s them) into
 * `dir`; returns the script's path. It has none of the real binary's cost: loading NVML and
 * asking the driver for every value of every GPU.
 */
export function writeStandInNvidiaSmi(dir: string, gpus: readonly BenchGpu[]): { script: string; xmlBytes: number } {
  const xml = nvidiaSmiXml(gpus);
  writeFileSync(join(dir, 'nvidia-smi-q-x.xml'), xml);
  writeFileSync(join(dir, 'nvidia-smi-nvlink-e.txt'), nvlinkErrorsText(gpus));
  const script = join(dir, 'nvidia-smi');
  const body = [
    '#!/bin/sh',
    '# bench/gpu-sources.ts: a stand-in nvidia-smi that prints the reports written beside it.',
    'case "$1 $2" in',
    `  '-q -x') exec cat '${join(dir, 'nvidia-smi-q-x.xml')}' ;;`,
    `  'nvlink -e') exec cat '${join(dir, 'nvidia-smi-nvlink-e.txt')}' ;;`,
    'esac',
    'echo "stand-in nvidia-smi: unsupported arguments: $*" >&2',
    'exit 2',
    '',
  ].join('\n');
  writeFileSync(script, body, { mode: 0o755 });
  return { script, xmlBytes: Buffer.byteLength(xml) };
}
