/**
 * Reads the iteration lines of Megatron-LM and Megatron-DeepSpeed training logs into records;
 * the failures written into the same stdout are read by training-log-failures.ts.
 * Pure: no I/O, no clock; every function here takes one line and never throws.
 *
 * Iteration line (Megatron-LM `megatron/training/training.py`, `training_log`):
 * ` [<datetime>] iteration N/ M | consumed samples: … | elapsed time per iteration (ms): … |
 * learning rate: … | global batch size: … | <loss key>: … | loss scale: … | grad norm: … |
 * number of skipped iterations: … | number of nan iterations: … |`. Megatron-DeepSpeed prints
 * `elapsed time per iteration (s)`, `samples per second` and `TFLOPs`; launchers prepend
 * `[default3]:` (torchrun) or `3: ` (srun --label).
 */

export interface IterationRecord {
  readonly iteration: number;
  /** The run's planned number of iterations (`N/ M`). */
  readonly totalIterations: number;
  /** The log's own timestamp (`[YYYY-MM-DD HH:MM:SS(.ffffff)]`), read as this node's local time. */
  readonly timestamp?: Date;
  /** Elapsed time per iteration over the logging interval, in seconds whatever unit the log used. */
  readonly iterationSeconds?: number;
  readonly learningRate?: number;
  readonly lossScale?: number;
  readonly gradNorm?: number;
  /** Loss values by normalised key (`lm loss` → `lm_loss`); NaN stays NaN. */
  readonly losses: Readonly<Record<string, number>>;
  /** Iterations skipped (fp16 overflow) in the logging interval. */
  readonly skippedIterations?: number;
  /** Iterations with a NaN loss in the logging interval. */
  readonly nanIterations?: number;
  readonly samplesPerSecond?: number;
  readonly tflopsPerGpu?: number;
}

/** A loss key as a label value: `lm loss` → `lm_loss`, `mtp_1 loss` → `mtp_1_loss`. */
export function normaliseLossKey(key: string): string {
  return key
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, '_')
    .replace(/^_+|_+$/g, '');
}

/** Python prints non-finite floats as `nan`, `inf`, `-inf`. */
function parseLogNumber(text: string): number | undefined {
  const value = text.trim();
  if (/^[+-]?nan$/i.test(value)) return Number.NaN;
  if (/^\+?inf(inity)?$/i.test(value)) return Number.POSITIVE_INFINITY;
  if (/^-inf(inity)?$/i.test(value)) return Number.NEGATIVE_INFINITY;
  if (!/^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i.test(value)) return undefined;
  return Number(value);
}

/** Shifting the decimal exponent keeps 24379.9 ms at exactly 24.3799 s; dividing gives 24.379900000000003. */
function millisecondsToSeconds(text: string, value: number): number {
  const plain = text.trim();
  return Number.isFinite(value) && !/e/i.test(plain) ? Number(`${plain}e-3`) : value / 1000;
}

const ITERATION = /(?:^|[\s\]:|])iteration\s+(\d+)\s*\/\s*(\d+)\s*\|/;
const TIMESTAMP = /\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,6}))?\]\s*$/;

function parseTimestamp(before: string): Date | undefined {
  const match = TIMESTAMP.exec(before);
  if (!match) return undefined;
  const [, year, month, day, hour, minute, second, fraction = '0'] = match.map((part) => part ?? '');
  // Megatron formats datetime.now(): the training process's local time, which is this node's.
  const date = new Date(Number(year), Number(month) - 1, Number(day), Number(hour), Number(minute), Number(second), Math.floor(Number(`0.${fraction}`) * 1000));
  return Number.isNaN(date.getTime()) ? undefined : date;
}

/** Keys that are not losses although some contain the word, and keys not exported. */
const IGNORED_KEYS = new Set(['consumed samples', 'consumed tokens', 'skipped samples', 'global batch size', 'num zeros', 'params norm']);

/** Parses one Megatron iteration line; undefined for any other line. */
export function parseIterationLine(line: string): IterationRecord | undefined {
  const match = ITERATION.exec(line);
  if (!match) return undefined;
  const iteration = Number(match[1]);
  const totalIterations = Number(match[2]);
  if (!Number.isSafeInteger(iteration) || !Number.isSafeInteger(totalIterations)) return undefined;

  const fields: {
    -readonly [K in keyof IterationRecord]?: IterationRecord[K];
  } = {};
  const losses: Record<string, number> = {};
  // Only `key: value |` pieces count: a line cut short (a truncated paste, a crash mid-write)
  // may end in half a number, which must not be taken for the value.
  const pieces = line.slice(match.index + match[0].length).split('|');
  pieces.pop();
  for (const piece of pieces) {
    const colon = piece.lastIndexOf(':');
    if (colon < 0) continue;
    const key = piece.slice(0, colon).trim().replace(/\s+/g, ' ');
    const text = piece.slice(colon + 1);
    const value = parseLogNumber(text);
    if (value === undefined || key === '') continue;
    const lower = key.toLowerCase();
    if (lower === 'elapsed time per iteration (ms)') fields.iterationSeconds = millisecondsToSeconds(text, value);
    else if (lower === 'elapsed time per iteration (s)') fields.iterationSeconds = value;
    else if (lower === 'learning rate') fields.learningRate = value;
    else if (lower === 'loss scale') fields.lossScale = value;
    else if (lower === 'grad norm') fields.gradNorm = value;
    else if (lower === 'number of skipped iterations') fields.skippedIterations = value;
    else if (lower === 'number of nan iterations') fields.nanIterations = value;
    else if (lower === 'samples per second') fields.samplesPerSecond = value;
    else if (lower === 'tflops' || lower === 'throughput per gpu (tflop/s/gpu)') fields.tflopsPerGpu = value;
    else if (IGNORED_KEYS.has(lower)) continue;
    else if (/loss/.test(lower)) {
      const name = normaliseLossKey(key);
      if (name !== '') losses[name] = value;
    }
  }
  const timestamp = parseTimestamp(line.slice(0, match.index + 1));
  return { iteration, totalIterations, ...(timestamp ? { timestamp } : {}), ...fields, losses };
}
