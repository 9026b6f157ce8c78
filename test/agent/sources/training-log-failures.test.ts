import { readdirSync } from 'node:fs';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { parseIterationLine } from '../../../agent/sources/megatron-log.js';
import { stripLauncherPrefix, TrainingErrorParser, type TrainingErrorReport } from '../../../agent/sources/training-log-failures.js';
import { MEGATRON_LOGS, MEGATRON_LOG_FILES, NCCL_TORCH_ERRORS, sampleLines } from '../helpers.js';

function reportsOf(dir: string, name: string): TrainingErrorReport[] {
  const parser = new TrainingErrorParser();
  return [...sampleLines(dir, name).flatMap((line) => parser.push(line)), ...parser.flush()];
}

describe('failures in training logs', () => {
  it('strips launcher prefixes', () => {
    expect(stripLauncherPrefix('[default3]:  what():  x')).toBe('  what():  x');
    expect(stripLauncherPrefix('0:  iteration 1/ 2 |')).toBe(' iteration 1/ 2 |');
    expect(stripLauncherPrefix('[80746] [rank0]:[E321 02:07:08]')).toBe('[E321 02:07:08]');
  });

  it('reports every NCCL watchdog timeout once, with the rank that timed out, and not the follow-up "detected by watchdog" lines', () => {
    const reports = reportsOf(NCCL_TORCH_ERRORS, 'nccl_watchdog_timeout_lines_from_issues.txt');
    expect(reports.every((report) => report.kind === 'nccl_timeout')).toBe(true);
    expect(reports.map((report) => (report.kind === 'nccl_timeout' ? report.rank : 'other'))).toEqual([
      1,
      3,
      2,
      6,
      7,
      0,
      0,
      7,
      7,
      3,
      0,
      4,
      0,
      4,
      1,
      0,
      undefined,
    ]);
    expect(reports[0]).toEqual({
      kind: 'nccl_timeout',
      rank: 1,
      seqNum: 469508,
      opType: 'ALLREDUCE',
      timeoutMs: 1800000,
      ranForMs: 1802212,
      message:
        'rank 1: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.',
    });
    // Glued to a tqdm bar; PyTorch 2.4 glog prefix; reduce-scatter on PG 1.
    expect(reports[5]).toMatchObject({ rank: 0, seqNum: 96120, ranForMs: 25624887 });
    expect(reports[8]).toMatchObject({ rank: 7, seqNum: 80078, opType: 'BROADCAST', timeoutMs: 600000, ranForMs: 600026 });
    expect(reports[10]).toMatchObject({ rank: 0, seqNum: 7753, opType: '_REDUCE_SCATTER_BASE' });
    expect(reports[16]).toMatchObject({ seqNum: 49, timeoutMs: 18000000, ranForMs: 18005607 });
  });

  it('folds each torchrun ChildFailedError summary into one report naming the root-cause rank, every failed rank and the exit code', () => {
    const reports = reportsOf(NCCL_TORCH_ERRORS, 'torch_elastic_childfailederror_from_issues.txt');
    expect(reports.map((report) => (report.kind === 'child_failed' ? [report.rank, report.exitCode, report.ranks] : report.kind))).toEqual([
      [0, -6, [0, 1, 2]],
      [10, -6, [10]],
      [1, -6, [1, 3]],
      // Agent lines with no summary after them: only the local rank is known.
      [undefined, -6, []],
      [undefined, 1, []],
      [undefined, 1, []],
    ]);
    const [mmseg, accelerate, , agent] = reports;
    expect(mmseg?.message).toBe(
      'ChildFailedError: tools/train.py failed; root cause rank 0 (local_rank 0) exitcode -6 on neptun.informatik.uni-kl.de; also failed: rank 1 (local_rank 1) exitcode -6 on neptun.informatik.uni-kl.de, rank 2 (local_rank 2) exitcode -6 on neptun.informatik.uni-kl.de',
    );
    expect(accelerate).toMatchObject({
      failures: [{ rank: 10, localRank: 2, exitCode: -6, pid: 214033, host: 'SH-IDC1-10-140-24-95', traceback: 'Signal 6 (SIGABRT) received by PID 214033' }],
    });
    expect(accelerate?.message).toContain('exitcode -6');
    expect(agent).toMatchObject({ failures: [{ localRank: 0, exitCode: -6, pid: 16 }] });
    expect(agent?.message).toBe('torchrun worker failed (binary /opt/conda/bin/python); failed: local_rank 0 exitcode -6');
  });

  it('takes the agent "failed (exitcode …)" line and the summary after it for one failure', () => {
    const parser = new TrainingErrorParser();
    const log = [
      '[2024-05-08 08:47:31,877] torch.distributed.elastic.multiprocessing.api: [ERROR] failed (exitcode: 1) local_rank: 2 (pid: 5939) of binary: /usr/bin/python',
      'Traceback (most recent call last):',
      '    raise ChildFailedError(',
      'torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ',
      '============================================================',
      'train.py FAILED',
      '------------------------------------------------------------',
      'Failures:',
      '  <NO_OTHER_FAILURES>',
      '------------------------------------------------------------',
      'Root Cause (first observed failure):',
      '[0]:',
      '  time      : 2024-05-08_08:47:31',
      '  host      : gpu-7',
      '  rank      : 18 (local_rank: 2)',
      '  exitcode  : 1 (pid: 5939)',
      '  error_file: /tmp/torchelastic_x/error.json',
      '  traceback : Traceback (most recent call last):',
      '      File "train.py", line 3, in <module>',
      '    RuntimeError: boom',
      '============================================================',
    ];
    const reports = log.flatMap((line) => parser.push(line));
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ kind: 'child_failed', rank: 18, exitCode: 1, ranks: [18], failures: [{ errorFile: '/tmp/torchelastic_x/error.json' }] });
    // The closing rule ended the report: nothing is left open.
    expect(parser.pending).toBe(false);
    expect(parser.flush()).toEqual([]);
  });

  it('reports the CUDA error thrown in the NCCL watchdog thread once, and the NCCL error of a broken network', () => {
    const reports = reportsOf(NCCL_TORCH_ERRORS, 'bigscience_nccl_cuda_error_crash.txt');
    expect(reports).toEqual([
      { kind: 'cuda_error', message: 'CUDA error: unknown error' },
      {
        kind: 'nccl_error',
        message:
          'NCCL error in: /opt/conda/conda-bld/pytorch_1616554793803/work/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8',
      },
    ]);
  });

  it.each(MEGATRON_LOG_FILES)('finds no failure in the healthy (or cancelled) run %s', (name) => {
    expect(reportsOf(MEGATRON_LOGS, name)).toEqual([]);
  });
});

describe('robustness', () => {
  const realLines = [
    ...MEGATRON_LOG_FILES.flatMap((name) => sampleLines(MEGATRON_LOGS, name).slice(0, 400)),
    ...readdirSync(NCCL_TORCH_ERRORS).flatMap((name) => sampleLines(NCCL_TORCH_ERRORS, name)),
  ];

  it('never throws on arbitrary strings, nor on real lines cut or spliced at random', () => {
    const parser = new TrainingErrorParser();
    const mangled = fc
      .tuple(fc.constantFrom(...realLines), fc.nat(), fc.string())
      .map(([line, cut, insert]) => line.slice(0, cut % (line.length + 1)) + insert + line.slice(cut % (line.length + 1)));
    fc.assert(
      fc.property(fc.oneof(fc.string(), fc.string({ unit: 'binary' }), mangled), (line) => {
        parseIterationLine(line);
        parser.push(line);
        if (line.length % 7 === 0) parser.flush();
      }),
      { numRuns: 2000 },
    );
  });
});
