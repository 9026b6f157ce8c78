import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { analyzeFlightRecorder, splitRankKeyedDumps, type FlightRecorderAnalysis } from '../../analyzers/flight-recorder-analysis.js';

const DIR = 'test/fixtures/realworld/pytorch-flight-recorder';

function analyse(fault: string): FlightRecorderAnalysis {
  return analyzeFlightRecorder(splitRankKeyedDumps(JSON.parse(readFileSync(`${DIR}/${fault}_all16ranks_decoded.json`, 'utf8'))));
}

/** Rows of nvidia-resiliency-ext's table: PGID | Process Group Desc | Op Type | Size | Dtype | Missing Ranks. */
function referenceRows(fault: string): Array<{ pg: string; desc: string; op: string; size: string; dtype: string; missing: number[] }> {
  const lines = readFileSync(`${DIR}/${fault}_nvrx_analysis_reference.txt`, 'utf8').trim().split('\n').slice(1);
  return lines.map((line) => {
    const [pg = '', desc = '', op = '', size = '', dtype = '', missing = ''] = line.split('|').map((cell) => cell.trim());
    return { pg, desc, op, size, dtype, missing: missing.split(',').map(Number) };
  });
}

function injectedRanks(fault: string): number[] {
  const match = /Fault ranks: \[([\d, ]+)\]/.exec(readFileSync(`${DIR}/${fault}_fault_injection.log`, 'utf8'));
  return (match?.[1] ?? '').split(',').map(Number);
}

describe('analyzeFlightRecorder on the nvidia-resiliency-ext dumps (16 ranks, TP2/PP4/EP4)', () => {
  for (const fault of ['gpu_error_1st', 'lock_gil_2nd']) {
    it(`${fault}: the earliest collective each behind rank never issued is the reference table's row`, () => {
      const result = analyse(fault);
      // Findings are ordered by when the waiting peers created the collective; keep each rank's first.
      const firstPerRank = new Map<string, (typeof result.missing)[number]>();
      for (const finding of result.missing) {
        const key = finding.missingRanks.join(',');
        if (!firstPerRank.has(key)) firstPerRank.set(key, finding);
      }
      const ours = [...firstPerRank.values()].map((finding) => ({
        pg: finding.processGroup,
        desc: finding.description,
        op: finding.op,
        size: finding.size,
        dtype: finding.dtype,
        missing: finding.missingRanks,
      }));
      const expected = referenceRows(fault).map((row) => ({ ...row, desc: row.desc.replace(/,\d+$/, '') }));
      expect(ours.sort((a, b) => a.pg.localeCompare(b.pg))).toEqual(expected.sort((a, b) => a.pg.localeCompare(b.pg)));
    });
  }

  it('gpu_error_1st: names both GPU-faulted ranks: 12 never issued all_to_all 20537, 14 never completed 20530', () => {
    const result = analyse('gpu_error_1st');
    expect(result.missing[0]).toMatchObject({ processGroup: '74', members: [12, 13, 14, 15], collectiveSeq: 20537, missingRanks: [12] });
    expect(result.stalled.find((finding) => finding.processGroup === '74')).toEqual({
      processGroup: '74',
      description: 'EXPERT_MODEL_PARALLEL_GROUP',
      members: [12, 13, 14, 15],
      peersCompleted: 20536,
      stalledRanks: [12, 14],
    });
    expect(result.behindRanks).toEqual(injectedRanks('gpu_error_1st'));
  });

  it('lock_gil_2nd: reads the two GIL-locked ranks, which recorded no entries, from their pg_status', () => {
    const result = analyse('lock_gil_2nd');
    expect(result.behindRanks).toEqual(injectedRanks('lock_gil_2nd'));
    expect(result.stalled).toEqual([]);
    expect(result.unreadableRanks).toEqual([]);
  });

  it('leaves point-to-point pipeline groups out: their counters differ by stage', () => {
    for (const fault of ['gpu_error_1st', 'lock_gil_2nd']) {
      const result = analyse(fault);
      const descriptions = [...result.missing, ...result.stalled].map((finding) => finding.description);
      expect(descriptions.filter((description) => description.startsWith('PIPELINE'))).toEqual([]);
    }
  });
});

describe('analyzeFlightRecorder on odd input', () => {
  it('reports dumps it cannot read and entries it skips, and never throws', () => {
    const group = { '7': { desc: 'TP', ranks: '[0, 1]' } };
    const entry = (seq: number) => ({
      pg_id: 3,
      process_group: ['7', 'TP'],
      collective_seq_id: seq,
      profiling_name: 'nccl:all_reduce',
      input_sizes: [[4]],
      input_dtypes: ['Float'],
      is_p2p: false,
    });
    const result = analyzeFlightRecorder(
      new Map<number, unknown>([
        [
          0,
          {
            pg_config: group,
            pg_status: { '3': { last_enqueued_collective: 5, last_completed_collective: 5 } },
            entries: [entry(4), entry(5), { nonsense: true }],
          },
        ],
        [1, { pg_config: group, pg_status: { '3': { last_enqueued_collective: 4, last_completed_collective: 4 } }, entries: [entry(4)] }],
        [2, 'not a dump'],
        [3, null],
      ]),
    );
    expect(result.unreadableRanks).toEqual([2, 3]);
    expect(result.skippedEntries).toBe(1);
    expect(result.missing).toEqual([
      { processGroup: '7', description: 'TP', members: [0, 1], collectiveSeq: 5, op: 'nccl:all_reduce', size: '4', dtype: 'Float', missingRanks: [1] },
    ]);
    expect(result.stalled).toEqual([{ processGroup: '7', description: 'TP', members: [0, 1], peersCompleted: 5, stalledRanks: [1] }]);
    expect(result.behindRanks).toEqual([1]);
  });

  it('splits only rank<N> keys out of a combined file', () => {
    expect([...splitRankKeyedDumps({ rank0: 1, rank12: 2, rank01: 3, version: 4 })]).toEqual([
      [0, 1],
      [12, 2],
    ]);
    expect(splitRankKeyedDumps([1, 2]).size).toBe(0);
  });
});
