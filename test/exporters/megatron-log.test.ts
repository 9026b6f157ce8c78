import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { normaliseLossKey, parseIterationLine, stripLauncherPrefix, TrainingErrorParser, type TrainingErrorReport } from '../../exporters/sources/megatron-log.js';
import { REALWORLD } from './helpers.js';

const MEGATRON_LOGS = join(REALWORLD, 'megatron-logs');
const NCCL_TORCH_ERRORS = join(REALWORLD, 'nccl-torch-errors');
const LOG_FILES = readdirSync(MEGATRON_LOGS).filter((name) => name.endsWith('.out') || name.endsWith('.txt'));

function lines(dir: string, name: string): string[] {
  return readFileSync(join(dir, name), 'utf8').split('\n');
}

/** The first line of the file that contains `marker`. */
function lineWith(dir: string, name: string, marker: string): string {
  const line = lines(dir, name).find((candidate) => candidate.includes(marker));
  if (line === undefined) throw new Error(`no line with "${marker}" in ${name}`);
  return line;
}

function reportsOf(dir: string, name: string): TrainingErrorReport[] {
  const parser = new TrainingErrorParser();
  return [...lines(dir, name).flatMap((line) => parser.push(line)), ...parser.flush()];
}

describe('Megatron iteration lines', () => {
  it.each(LOG_FILES)('parses every iteration line of %s, each with its iteration and elapsed time', (name) => {
    const iterationLines = lines(MEGATRON_LOGS, name).filter((line) => /elapsed time per iteration \((ms|s)\)/.test(line));
    expect(iterationLines.length).toBeGreaterThan(0);
    for (const line of iterationLines) {
      const record = parseIterationLine(line);
      expect(record, line).toBeDefined();
      expect(record?.iteration, line).toBeGreaterThan(0);
      expect(record?.iterationSeconds, line).toBeGreaterThan(0);
    }
  });

  it('finds exactly the 63 iteration lines of the BLOOM chronicles and nothing else there', () => {
    const records = lines(MEGATRON_LOGS, 'bigscience_chronicles_iteration_lines.txt').flatMap((line) => parseIterationLine(line) ?? []);
    expect(records).toHaveLength(63);
  });

  it('reads a Megatron-LM line with the elapsed time in milliseconds, a skipped-step count and no loss on a fully skipped interval', () => {
    const skipped = parseIterationLine(lineWith(MEGATRON_LOGS, 'bigscience_megatron-lm_gpt2_base_n4_tp4_pp4_2021.out', 'iteration       10/'));
    expect(skipped).toEqual({
      iteration: 10,
      totalIterations: 1000,
      iterationSeconds: 2.1522,
      learningRate: 0,
      lossScale: 8388608,
      skippedIterations: 10,
      nanIterations: 0,
      losses: {},
    });
    const trained = parseIterationLine(lineWith(MEGATRON_LOGS, 'bigscience_megatron-lm_gpt2_base_n4_tp4_pp4_2021.out', 'iteration       30/'));
    expect(trained).toMatchObject({ iteration: 30, iterationSeconds: 1.3761, learningRate: 1.5e-4, lossScale: 16384, gradNorm: 16.999, skippedIterations: 1, losses: { lm_loss: 22.47505 } });
  });

  it('reads the fp16 loss-scale backoff of a run whose three iterations were all skipped', () => {
    const records = lines(MEGATRON_LOGS, 'bigscience_megatron-lm_gpt2_perf_n16_2021.out').flatMap((line) => parseIterationLine(line) ?? []);
    expect(records.map((record) => [record.iteration, record.lossScale, record.skippedIterations, record.losses])).toEqual([
      [1, 4294967296, 1, {}],
      [2, 2147483648, 1, {}],
      [3, 1073741824, 1, {}],
    ]);
  });

  it('reads a Megatron-DeepSpeed line with loss, loss scale and grad norm', () => {
    const record = parseIterationLine(lineWith(MEGATRON_LOGS, 'bigscience_megatron-deepspeed_gpt2_3d_n16_2021.out', 'iteration        1/'));
    expect(record).toEqual({
      iteration: 1,
      totalIterations: 1000,
      iterationSeconds: 144.9156,
      learningRate: 1.875e-5,
      lossScale: 12,
      gradNorm: 67.593,
      skippedIterations: 0,
      nanIterations: 0,
      losses: { lm_loss: 12.44238 },
    });
  });

  it('reads a BLOOM line behind a torchrun prefix with the elapsed time in seconds, samples per second and TFLOPs', () => {
    const record = parseIterationLine(lineWith(MEGATRON_LOGS, 'bigscience_chronicles_iteration_lines.txt', 'iteration    12695/'));
    expect(record).toEqual({
      iteration: 12695,
      totalIterations: 115311,
      iterationSeconds: 105.22,
      learningRate: 5.969e-5,
      gradNorm: 0.174,
      skippedIterations: 0,
      nanIterations: 0,
      samplesPerSecond: 19.463,
      tflopsPerGpu: 149.02,
      losses: { lm_loss: 2.463556 },
    });
  });

  it('keeps what a line cut short says and drops its unfinished last field', () => {
    const record = parseIterationLine(lineWith(MEGATRON_LOGS, 'bigscience_chronicles_iteration_lines.txt', 'iteration   42780/'));
    expect(record).toEqual({ iteration: 42780, totalIterations: 115311, iterationSeconds: 105.16, losses: {} });
  });

  it('reads the current format: timestamp, TFLOP/s per GPU, and every loss key, MoE auxiliary loss included', () => {
    const modern = parseIterationLine(lineWith(MEGATRON_LOGS, 'megatron_iteration_lines_from_public_reports.txt', '[2026-01-16 07:32:24]'));
    expect(modern).toEqual({
      iteration: 5,
      totalIterations: 100,
      timestamp: new Date(2026, 0, 16, 7, 32, 24),
      iterationSeconds: 15.8,
      tflopsPerGpu: 490,
      learningRate: 4.134e-7,
      lossScale: 1,
      gradNorm: 2.87,
      skippedIterations: 0,
      nanIterations: 0,
      losses: { lm_loss: 13.4424, seq_load_balancing_loss: 1.000203 },
    });
    const prefixed = parseIterationLine(lineWith(MEGATRON_LOGS, 'megatron_iteration_lines_from_public_reports.txt', '[default0]: [2026-09-11'));
    expect(prefixed).toMatchObject({ iteration: 3, timestamp: new Date(2026, 8, 11, 12, 6, 52, 987), iterationSeconds: 24.3799, tflopsPerGpu: 26.8, losses: { lm_loss: 11.07468 } });
  });

  it('keeps a NaN loss as NaN and reads the nan-iteration count', () => {
    const record = parseIterationLine(
      ' iteration      300/    1000 | consumed samples:  1200 | elapsed time per iteration (ms): 1500.0 | learning rate: 1.000E-04 | global batch size:     4 | lm loss: nan | loss scale: 1.0 | grad norm: inf | number of skipped iterations:   0 | number of nan iterations:   1 |',
    );
    expect(record?.losses.lm_loss).toBeNaN();
    expect(record?.gradNorm).toBe(Number.POSITIVE_INFINITY);
    expect(record?.nanIterations).toBe(1);
  });

  it('ignores lines that only look alike: validation loss, timers, argument dumps', () => {
    const name = 'bigscience_megatron-lm_gpt2_base_n4_tp4_pp4_2021.out';
    expect(parseIterationLine(lineWith(MEGATRON_LOGS, name, 'validation loss at iteration 100'))).toBeUndefined();
    expect(parseIterationLine(lineWith(MEGATRON_LOGS, name, 'time (ms) |'))).toBeUndefined();
    expect(parseIterationLine('  train_iters ..................................... 1000')).toBeUndefined();
  });

  it('normalises loss keys into label values and strips launcher prefixes', () => {
    expect(normaliseLossKey('lm loss')).toBe('lm_loss');
    expect(normaliseLossKey('mtp_1 loss')).toBe('mtp_1_loss');
    expect(normaliseLossKey('Load-Balancing Loss')).toBe('load_balancing_loss');
    expect(stripLauncherPrefix('[default3]:  what():  x')).toBe('  what():  x');
    expect(stripLauncherPrefix('0:  iteration 1/ 2 |')).toBe(' iteration 1/ 2 |');
    expect(stripLauncherPrefix('[80746] [rank0]:[E321 02:07:08]')).toBe('[E321 02:07:08]');
  });
});

describe('failures in training logs', () => {
  it('reports every NCCL watchdog timeout once, with the rank that timed out, and not the follow-up "detected by watchdog" lines', () => {
    const reports = reportsOf(NCCL_TORCH_ERRORS, 'nccl_watchdog_timeout_lines_from_issues.txt');
    expect(reports.every((report) => report.kind === 'nccl_timeout')).toBe(true);
    expect(reports.map((report) => (report.kind === 'nccl_timeout' ? report.rank : 'other'))).toEqual([1, 3, 2, 6, 7, 0, 0, 7, 7, 3, 0, 4, 0, 4, 1, 0, undefined]);
    expect(reports[0]).toEqual({
      kind: 'nccl_timeout',
      rank: 1,
      seqNum: 469508,
      opType: 'ALLREDUCE',
      timeoutMs: 1800000,
      ranForMs: 1802212,
      message: 'rank 1: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=469508, OpType=ALLREDUCE, Timeout(ms)=1800000) ran for 1802212 milliseconds before timing out.',
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
        message: 'NCCL error in: /opt/conda/conda-bld/pytorch_1616554793803/work/torch/lib/c10d/ProcessGroupNCCL.cpp:825, unhandled system error, NCCL version 2.7.8',
      },
    ]);
  });

  it.each(LOG_FILES)('finds no failure in the healthy (or cancelled) run %s', (name) => {
    expect(reportsOf(MEGATRON_LOGS, name)).toEqual([]);
  });
});

describe('robustness', () => {
  const realLines = [...LOG_FILES.flatMap((name) => lines(MEGATRON_LOGS, name).slice(0, 400)), ...readdirSync(NCCL_TORCH_ERRORS).flatMap((name) => lines(NCCL_TORCH_ERRORS, name))];

  it('never throws on arbitrary strings, nor on real lines cut or spliced at random', () => {
    const parser = new TrainingErrorParser();
    const mangled = fc.tuple(fc.constantFrom(...realLines), fc.nat(), fc.string()).map(([line, cut, insert]) => line.slice(0, cut % (line.length + 1)) + insert + line.slice(cut % (line.length + 1)));
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
