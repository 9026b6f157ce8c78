import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { parseNvlinkErrors } from '../../../agent/sources/nvlink-errors.js';
import { REALWORLD } from '../helpers.js';

const SAMPLES = join(REALWORLD, 'nvidia-smi-nvlink');

function sample(name: string): string {
  return readFileSync(join(SAMPLES, name), 'utf8');
}

describe('nvidia-smi nvlink -e parser on real outputs', () => {
  it('reads every link counter of an H100 with its GPU and UUID, skipping the elided lines', () => {
    const counts = parseNvlinkErrors(sample('ml-engineering_h100_nvlink-e.txt'));
    expect(counts).toHaveLength(9);
    expect(new Set(counts.map((count) => count.link))).toEqual(new Set([0, 1, 17]));
    expect(new Set(counts.map((count) => count.type))).toEqual(new Set(['replay', 'recovery', 'crc']));
    expect(counts.every((count) => count.gpu === 0 && count.uuid === 'GPU-abcdefab-cdef-abdc-abcd-abababababab' && count.count === 0)).toBe(true);
  });

  it('reads tab-indented links of a GB300 whose GPU line has no UUID', () => {
    expect(parseNvlinkErrors(sample('srt-slurm_gb300_nvlink-e.txt'))).toEqual([
      { gpu: 0, uuid: undefined, link: 0, type: 'replay', count: 0 },
      { gpu: 0, uuid: undefined, link: 0, type: 'recovery', count: 0 },
      { gpu: 0, uuid: undefined, link: 0, type: 'crc', count: 0 },
    ]);
  });

  it('keeps real error counts on the right GPU and link, and ignores summary lines over link ranges', () => {
    expect(parseNvlinkErrors(sample('v100-sxm2_nvlink-e_with-errors.txt'))).toEqual([
      { gpu: 0, uuid: 'GPU-5261e3df-82f6-67b4-9953-4e63527e0e9d', link: 3, type: 'replay', count: 2353 },
      { gpu: 2, uuid: 'GPU-d9eeee97-c180-66de-23e0-d995387934dc', link: 0, type: 'replay', count: 148 },
      { gpu: 2, uuid: 'GPU-d9eeee97-c180-66de-23e0-d995387934dc', link: 0, type: 'crc', count: 65535 },
    ]);
  });

  it('finds nothing in text that is not nvlink -e output', () => {
    expect(parseNvlinkErrors("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")).toEqual([]);
    expect(parseNvlinkErrors('         Link 0: Replay Errors: 5\n')).toEqual([]);
  });
});
