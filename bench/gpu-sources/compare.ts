import type { NvlinkErrorCount } from '../../agent/sources/nvlink-errors.js';
import type { GpuSample } from '../../agent/sources/nvidia-smi-xml.js';

/**
 * The values both GPU sources give, side by side: one NVML read taken between two nvidia-smi
 * reads, so that a value which moves (temperature, power, clocks) can be told from one the two
 * sources disagree on. A value is `=` when NVML's equals either nvidia-smi read, `~` when it lies
 * between them (it moved during the reads), `≠` otherwise.
 */

export type Verdict = '=' | '~' | '≠';

export interface ValueRow {
  readonly gpu: string;
  readonly name: string;
  readonly before: string;
  readonly nvml: string;
  readonly after: string;
  readonly verdict: Verdict;
}

type Reading = number | string | undefined;

interface Field {
  readonly name: string;
  readonly read: (sample: GpuSample) => Reading;
}

const MIB = 1024 * 1024;
const mhz = (hz: number | undefined): number | undefined => (hz === undefined ? undefined : hz / 1e6);

/** `volatile sram 0/0 dram 0/0; aggregate sram 0/0 dram 12/0`: corrected/uncorrected by scope and location. */
function eccText(sample: GpuSample): string | undefined {
  if (sample.ecc.length === 0) return undefined;
  const parts: string[] = [];
  for (const scope of ['volatile', 'aggregate'] as const) {
    const counts = sample.ecc.filter((count) => count.scope === scope);
    const locations = [...new Set(counts.map((count) => count.location))].sort();
    const of = (location: string, type: string): string => String(counts.find((count) => count.location === location && count.type === type)?.count ?? '-');
    if (locations.length > 0)
      parts.push(`${scope} ${locations.map((location) => `${location} ${of(location, 'correctable')}/${of(location, 'uncorrectable')}`).join(' ')}`);
  }
  return parts.join('; ');
}

const FIELDS: readonly Field[] = [
  { name: 'temperature, °C', read: (s) => s.temperatureCelsius },
  { name: 'memory temperature, °C', read: (s) => s.memoryTemperatureCelsius },
  { name: 'power draw, W', read: (s) => s.powerDrawWatts },
  { name: 'power limit, W', read: (s) => s.powerLimitWatts },
  { name: 'utilisation, %', read: (s) => (s.utilizationRatio === undefined ? undefined : Math.round(s.utilizationRatio * 100)) },
  { name: 'graphics clock, MHz', read: (s) => mhz(s.clocks?.graphics) },
  { name: 'SM clock, MHz', read: (s) => mhz(s.clocks?.sm) },
  { name: 'memory clock, MHz', read: (s) => mhz(s.clocks?.memory) },
  { name: 'video clock, MHz', read: (s) => mhz(s.clocks?.video) },
  { name: 'max graphics clock, MHz', read: (s) => mhz(s.maxClocks?.graphics) },
  { name: 'max memory clock, MHz', read: (s) => mhz(s.maxClocks?.memory) },
  { name: 'memory used, MiB', read: (s) => (s.memoryUsedBytes === undefined ? undefined : s.memoryUsedBytes / MIB) },
  { name: 'memory total, MiB', read: (s) => (s.memoryTotalBytes === undefined ? undefined : s.memoryTotalBytes / MIB) },
  { name: 'PCIe generation', read: (s) => s.pcieLinkGeneration },
  { name: 'PCIe width', read: (s) => s.pcieLinkWidth },
  { name: 'PCIe replay counter', read: (s) => s.pcieReplayErrors },
  {
    name: 'throttle reasons active',
    read: (s) =>
      s.throttleReasons === undefined
        ? undefined
        : Object.entries(s.throttleReasons)
            .filter(([, active]) => active)
            .map(([reason]) => reason)
            .sort()
            .join(',') || 'none',
  },
  { name: 'throttle reasons known', read: (s) => (s.throttleReasons === undefined ? undefined : Object.keys(s.throttleReasons).length) },
  { name: 'ECC errors, corrected/uncorrected', read: (s) => eccText(s) },
  {
    name: 'remapped rows',
    read: (s) =>
      s.remappedRows === undefined
        ? undefined
        : `${s.remappedRows.correctable}/${s.remappedRows.uncorrectable} pending ${s.remappedRows.pending} failure ${s.remappedRows.failure}`,
  },
  { name: 'fabric', read: (s) => (s.fabric === undefined ? undefined : `${s.fabric.state} ${s.fabric.success}`) },
  { name: 'MIG', read: (s) => (s.migEnabled === undefined ? undefined : String(s.migEnabled)) },
  {
    name: 'processes',
    read: (s) =>
      s.processes === undefined
        ? undefined
        : s.processes
            .map((p) => `${p.pid} ${p.type ?? '?'} ${p.name ?? '?'} ${p.usedMemoryBytes === undefined ? '?' : p.usedMemoryBytes / MIB}`)
            .sort()
            .join('; ') || 'none',
  },
];

function show(value: Reading): string {
  if (value === undefined) return 'n/a';
  return typeof value === 'number' ? String(Math.round(value * 100) / 100) : value;
}

function same(a: Reading, b: Reading): boolean {
  if (typeof a === 'number' && typeof b === 'number') return Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a));
  return a === b;
}

function verdict(before: Reading, nvml: Reading, after: Reading): Verdict {
  if (same(before, nvml) || same(after, nvml)) return '=';
  if (typeof before === 'number' && typeof after === 'number' && typeof nvml === 'number' && nvml >= Math.min(before, after) && nvml <= Math.max(before, after))
    return '~';
  return '≠';
}

/** Each GPU's values, matched by PCI bus id; a GPU one source lacks is one `≠` row. */
export function compareGpuValues(before: readonly GpuSample[], nvml: readonly GpuSample[], after: readonly GpuSample[]): ValueRow[] {
  const rows: ValueRow[] = [];
  const byBus = (samples: readonly GpuSample[]) => new Map(samples.map((sample) => [sample.pciBusId ?? sample.uuid ?? String(sample.index), sample]));
  const [first, fromNvml, second] = [byBus(before), byBus(nvml), byBus(after)];
  for (const key of new Set([...first.keys(), ...fromNvml.keys()])) {
    const a = first.get(key);
    const n = fromNvml.get(key);
    const b = second.get(key);
    const gpu = `${(a ?? n)?.index ?? '?'} (${key})`;
    if (a === undefined || n === undefined || b === undefined) {
      rows.push({ gpu, name: 'listed', before: String(a !== undefined), nvml: String(n !== undefined), after: String(b !== undefined), verdict: '≠' });
      continue;
    }
    for (const field of FIELDS) {
      const [x, y, z] = [field.read(a), field.read(n), field.read(b)];
      rows.push({ gpu, name: field.name, before: show(x), nvml: show(y), after: show(z), verdict: verdict(x, y, z) });
    }
  }
  return rows;
}

/** NVLink counters: how many each source gives, and those whose values differ (by GPU, link, type). */
export function compareNvlink(
  nvidiaSmi: readonly NvlinkErrorCount[],
  nvml: readonly NvlinkErrorCount[],
): { nvidiaSmi: number; nvml: number; differing: string[] } {
  const key = (count: NvlinkErrorCount) => `GPU ${count.gpu} link ${count.link} ${count.type}`;
  const fromSmi = new Map(nvidiaSmi.map((count) => [key(count), count.count]));
  const fromNvml = new Map(nvml.map((count) => [key(count), count.count]));
  const differing: string[] = [];
  for (const name of new Set([...fromSmi.keys(), ...fromNvml.keys()])) {
    if (fromSmi.get(name) !== fromNvml.get(name)) differing.push(`${name}: nvidia-smi ${fromSmi.get(name) ?? 'none'}, NVML ${fromNvml.get(name) ?? 'none'}`);
  }
  return { nvidiaSmi: nvidiaSmi.length, nvml: nvml.length, differing };
}
