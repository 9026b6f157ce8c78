import { normalizePciBusId } from '../../core/names.js';

/**
 * `nvidia-smi --query-compute-apps=… --format=csv`: the processes with a compute context on
 * each GPU, for the agent that reads the GPUs from dcgm-exporter (whose series name no pids).
 * Columns are found by the header's names, so the query may list them in any order and with or
 * without units (`used_gpu_memory [MiB]` → `2566 MiB`); nvidia-smi separates fields with a
 * comma and a space. A row without a valid pid is skipped, not fatal.
 */

export interface ComputeApp {
  readonly pid: number;
  readonly uuid?: string | undefined;
  /** `dddd:bb:dd`, as the rest of the agent names GPUs. */
  readonly pciBusId?: string | undefined;
  readonly name?: string | undefined;
  readonly usedMemoryBytes?: number | undefined;
}

/** The query the agent runs; its output parses with parseComputeApps. */
export const COMPUTE_APPS_QUERY = ['--query-compute-apps=gpu_uuid,gpu_bus_id,pid,process_name,used_memory', '--format=csv'];

const MISSING = /^\[?(N\/A|Not Supported|Insufficient Permissions|Unknown Error)\]?$/i;

function field(value: string | undefined): string | undefined {
  const trimmed = value?.trim();
  return trimmed === undefined || trimmed === '' || MISSING.test(trimmed) ? undefined : trimmed;
}

function mebibytes(value: string | undefined): number | undefined {
  const match = /^(\d+(?:\.\d+)?)(?:\s*MiB)?$/.exec(field(value) ?? '');
  return match ? Math.round(Number(match[1]) * 1024 * 1024) : undefined;
}

/** The header's column names without their units: `used_gpu_memory [MiB]` → `used_gpu_memory`. */
function columnNames(header: string): string[] {
  return header.split(',').map((name) => name.trim().replace(/\s*\[[^\]]*\]$/, ''));
}

export function parseComputeApps(csv: string): ComputeApp[] {
  const lines = csv.split(/\r?\n/).filter((line) => line.trim() !== '');
  const [header, ...rows] = lines;
  if (header === undefined) return [];
  const names = columnNames(header);
  const at = (row: string[], ...candidates: string[]): string | undefined => {
    for (const candidate of candidates) {
      const index = names.indexOf(candidate);
      if (index >= 0) return row[index];
    }
    return undefined;
  };
  const apps: ComputeApp[] = [];
  for (const line of rows) {
    // A process name may hold ", " itself: the fields after it are counted from the end.
    const parts = line.split(', ');
    const row = parts.length > names.length ? joinExtra(parts, names.length, names.indexOf('process_name')) : parts;
    const pid = Number(field(at(row, 'pid')));
    if (!Number.isSafeInteger(pid) || pid <= 0) continue;
    const bus = field(at(row, 'gpu_bus_id', 'pci.bus_id'));
    apps.push({
      pid,
      uuid: field(at(row, 'gpu_uuid')),
      pciBusId: bus === undefined ? undefined : normalizePciBusId(bus),
      name: field(at(row, 'process_name', 'name')),
      usedMemoryBytes: mebibytes(at(row, 'used_gpu_memory', 'used_memory')),
    });
  }
  return apps;
}

/** Rejoins the fields a process name with `, ` in it was split into. */
function joinExtra(parts: string[], columns: number, nameIndex: number): string[] {
  if (nameIndex < 0) return parts.slice(0, columns);
  const extra = parts.length - columns;
  return [...parts.slice(0, nameIndex), parts.slice(nameIndex, nameIndex + extra + 1).join(', '), ...parts.slice(nameIndex + extra + 1)];
}
