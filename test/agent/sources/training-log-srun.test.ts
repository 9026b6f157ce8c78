import { describe, expect, it } from 'vitest';
import { TrainingErrorParser, type TrainingErrorReport } from '../../../agent/sources/training-log-failures.js';
import { NCCL_TORCH_ERRORS, sampleLines } from '../helpers.js';

/**
 * srun's task failure lines, for ranks srun starts itself (no torchrun): the batch job's output
 * as captured in the lab, one job per `### ` section, each read by a fresh parser as an agent
 * following that file would (the agent flushes once the log has been quiet for 2 s).
 */
function sections(): Map<string, string[]> {
  const found = new Map<string, string[]>();
  let current: string[] = [];
  for (const line of sampleLines(NCCL_TORCH_ERRORS, 'srun_task_failures_lab.txt')) {
    if (line.startsWith('### ')) found.set(line.slice(4), (current = []));
    else current.push(line);
  }
  return found;
}

function reportsOf(lines: readonly string[]): TrainingErrorReport[] {
  const parser = new TrainingErrorParser();
  return [...lines.flatMap((line) => parser.push(line)), ...parser.flush()];
}

const failed = (reports: TrainingErrorReport[]) => reports.filter((report) => report.kind === 'child_failed');

describe('srun task failures in a batch job log', () => {
  const jobs = [...sections().entries()];

  it('has the four captured jobs', () => {
    expect(jobs.map(([title]) => title.split(':')[1]?.trim().split(' ').slice(0, 3).join(' '))).toEqual([
      'rank 1 raises',
      'rank 0 raises',
      'both ranks raise',
      'the job is',
    ]);
  });

  it('reports a rank that raised once, with its task as the rank, its exit code and its Python exception, and not the rank srun ended because of it', () => {
    const [, lines] = jobs[0] ?? ['', []];
    const reports = failed(reportsOf(lines));
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ rank: 1, exitCode: 1, ranks: [1], failures: [{ rank: 1, host: 'node-2', exitCode: 1 }] });
    expect(reports[0]?.message).toBe(
      "srun: task 1 on node-2 exited with exit code 1; ended with it: task 0 on node-1 (Terminated); TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'",
    );
  });

  it('keeps the first line of a CUDA-style RuntimeError, and still counts the CUDA error itself (in the source line and the exception)', () => {
    const [, lines] = jobs[1] ?? ['', []];
    const reports = reportsOf(lines);
    expect(reports.map((report) => report.kind)).toEqual(['cuda_error', 'cuda_error', 'child_failed']);
    expect(reports[2]).toMatchObject({ rank: 0, exitCode: 1 });
    expect(reports[2]?.message).toBe(
      'srun: task 0 on node-1 exited with exit code 1; ended with it: task 1 on node-2 (Terminated); RuntimeError: CUDA error: an illegal memory access was encountered',
    );
  });

  it("folds two ranks failing in one step into one report, the first listed as the root cause, even when a traceback comes after srun's first line", () => {
    const [, lines] = jobs[2] ?? ['', []];
    const reports = failed(reportsOf(lines));
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ rank: 0, ranks: [0, 1] });
    expect(reports[0]?.message).toBe(
      "srun: task 0 on node-1 exited with exit code 1; also failed: task 1 on node-2 exited with exit code 1; KeyError: 'attention_mask'",
    );
  });

  it('reports nothing for a job that was cancelled: its tasks were only terminated', () => {
    const [, lines] = jobs[3] ?? ['', []];
    expect(reportsOf(lines)).toEqual([]);
  });

  it('reports one failure per step when the same log holds several, as an agent that flushes in between reads them', () => {
    const parser = new TrainingErrorParser();
    const reports: TrainingErrorReport[] = [];
    for (const [, lines] of jobs) {
      reports.push(...lines.flatMap((line) => parser.push(line)));
      expect(parser.pending).toBe(lines.some((line) => line.startsWith('srun: error:')));
      reports.push(...parser.flush());
    }
    expect(failed(reports).map((report) => report.rank)).toEqual([1, 0, 0]);
  });

  it('leaves srun echoing torchrun to torchrun: a ChildFailedError summary and the srun line after it are one failure', () => {
    const reports = failed(reportsOf(sampleLines(NCCL_TORCH_ERRORS, 'torch_elastic_childfailederror_from_issues.txt')));
    expect(reports.some((report) => report.message.startsWith('srun'))).toBe(false);
  });

  it('attaches no exception printed long before the failure, and handles task ranges', () => {
    const parser = new TrainingErrorParser();
    const old = ['Traceback (most recent call last):', '  File "x.py", line 1, in <module>', 'ValueError: handled and logged long ago'];
    const filler = Array.from({ length: 500 }, (_, index) => `[rank 0] iteration ${index} loss 0.1`);
    const reports = [
      ...[...old, ...filler, 'srun: error: gpu-7: tasks 4-6: Segmentation fault (core dumped)'].flatMap((line) => parser.push(line)),
      ...parser.flush(),
    ];
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ kind: 'child_failed', rank: 4, ranks: [4, 5, 6] });
    expect(reports[0]?.message).toBe(
      'srun: task 4 on gpu-7 ended: Segmentation fault (core dumped); also failed: task 5 on gpu-7 ended: Segmentation fault (core dumped), task 6 on gpu-7 ended: Segmentation fault (core dumped)',
    );
  });
});
