import { describe, expect, it } from 'vitest';
import { normaliseLossKey, parseIterationLine } from '../../../agent/sources/megatron-log.js';
import { MEGATRON_LOGS, MEGATRON_LOG_FILES, sampleLines } from '../helpers.js';

/** The first line of the file that contains `marker`. */
function lineWith(dir: string, name: string, marker: string): string {
  const line = sampleLines(dir, name).find((candidate) => candidate.includes(marker));
  if (line === undefined) throw new Error(`no line with "${marker}" in ${name}`);
  return line;
}

describe('Megatron iteration lines', () => {
  it.each(MEGATRON_LOG_FILES)('parses every iteration line of %s, each with its iteration and elapsed time', (name) => {
    const iterationLines = sampleLines(MEGATRON_LOGS, name).filter((line) => /elapsed time per iteration \((ms|s)\)/.test(line));
    expect(iterationLines.length).toBeGreaterThan(0);
    for (const line of iterationLines) {
      const record = parseIterationLine(line);
      expect(record, line).toBeDefined();
      expect(record?.iteration, line).toBeGreaterThan(0);
      expect(record?.iterationSeconds, line).toBeGreaterThan(0);
    }
  });

  it('finds exactly the 63 iteration lines of the BLOOM chronicles and nothing else there', () => {
    const records = sampleLines(MEGATRON_LOGS, 'bigscience_chronicles_iteration_lines.txt').flatMap((line) => parseIterationLine(line) ?? []);
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
    expect(trained).toMatchObject({
      iteration: 30,
      iterationSeconds: 1.3761,
      learningRate: 1.5e-4,
      lossScale: 16384,
      gradNorm: 16.999,
      skippedIterations: 1,
      losses: { lm_loss: 22.47505 },
    });
  });

  it('reads the fp16 loss-scale backoff of a run whose three iterations were all skipped', () => {
    const records = sampleLines(MEGATRON_LOGS, 'bigscience_megatron-lm_gpt2_perf_n16_2021.out').flatMap((line) => parseIterationLine(line) ?? []);
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
    expect(prefixed).toMatchObject({
      iteration: 3,
      timestamp: new Date(2026, 8, 11, 12, 6, 52, 987),
      iterationSeconds: 24.3799,
      tflopsPerGpu: 26.8,
      losses: { lm_loss: 11.07468 },
    });
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

  it('normalises loss keys into label values', () => {
    expect(normaliseLossKey('lm loss')).toBe('lm_loss');
    expect(normaliseLossKey('mtp_1 loss')).toBe('mtp_1_loss');
    expect(normaliseLossKey('Load-Balancing Loss')).toBe('load_balancing_loss');
  });
});
