/**
 * Pure parser of `nvidia-smi nvlink -e` (`--errorcounters`): per-GPU, per-link NVLink error
 * counters. The shape, as the captures in test/fixtures/realworld/nvidia-smi-nvlink/ show it:
 *
 *   GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-…)
 *            Link 0: Replay Errors: 0
 *            Link 0: Recovery Errors: 0
 *            Link 0: CRC Errors: 0
 *
 * with the link lines indented by spaces or a tab, blank lines between links, and the UUID
 * missing on some parts (GB300). Lines of any other shape (summaries, elisions) are skipped.
 */

export interface NvlinkErrorCount {
  /** The GPU index nvidia-smi printed. */
  readonly gpu: number;
  readonly uuid?: string | undefined;
  readonly link: number;
  /** `replay`, `recovery`, `crc`, `crc_flit`, `crc_data`, … from the counter's name. */
  readonly type: string;
  readonly count: number;
}

const GPU_LINE = /^GPU (\d+): .*?(?:\(UUID: (GPU-[0-9a-fA-F-]+)\))?\s*$/;
const LINK_LINE = /^\s+Link (\d+): ([A-Za-z][A-Za-z ]{0,40}?) Errors: (\d+)\s*$/;

/** `CRC Flit` → `crc_flit`: a label value from a small, known-shaped set. */
function counterType(name: string): string {
  return name.trim().toLowerCase().replace(/\s+/g, '_');
}

export function parseNvlinkErrors(text: string): NvlinkErrorCount[] {
  const counts: NvlinkErrorCount[] = [];
  let current: { gpu: number; uuid: string | undefined } | undefined;
  for (const line of text.split('\n')) {
    const gpuLine = GPU_LINE.exec(line);
    if (gpuLine) {
      current = { gpu: Number(gpuLine[1]), uuid: gpuLine[2] };
      continue;
    }
    const linkLine = LINK_LINE.exec(line);
    if (!linkLine || current === undefined) continue;
    const count = Number(linkLine[3]);
    if (!Number.isSafeInteger(count)) continue;
    counts.push({ gpu: current.gpu, uuid: current.uuid, link: Number(linkLine[1]), type: counterType(linkLine[2] ?? ''), count });
  }
  return counts;
}
