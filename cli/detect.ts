import { readFileSync } from 'node:fs';
import { Command } from 'commander';
import { InputError, errorMessage } from '../core/errors.js';
import { Topology } from '../core/topology.js';
import { detectFailSlow, type FailSlowSample } from '../analyzers/failslow/detector.js';
import { runCommand } from './common.js';
import { suspectsCommand } from './detect-suspects.js';

export { suspectsOverWindow } from './detect-suspects.js';

/** `steadfast detect …`: the detectors over recorded data, as JSON on stdout with stable field names. */

const COLUMNS = ['time', 'rank', 'iteration_seconds'] as const;
type Column = (typeof COLUMNS)[number];

export function detectCommand(): Command {
  const detect = new Command('detect').description(
    'Detectors over recorded data: fail-slow iterations (Greyhound §4), multi-signal suspects (504-GPU report).',
  );

  detect
    .command('failslow')
    .description(
      'Fail-slow detection over per-rank iteration times: BOCD change points verified at ≥ 10 %, slow ranks, and groups slower than their comparable cluster (Greyhound §4.2–4.3).',
    )
    .requiredOption('--input <file>', 'CSV with the header time,rank,iteration_seconds (time in seconds, unix or relative)')
    .option('--topology <file>', 'topology JSON ({"ranks": [...]} or sizes with an order string): compare DP replicas, PP stages and DP groups')
    .action(async (options: { input: string; topology?: string }) => {
      await runCommand(async () => {
        const { samples, lineNumbers } = parseIterationCsv(readText(options.input, 'input'), options.input);
        const topology = options.topology ? Topology.from(parseJson(readText(options.topology, 'topology'), options.topology)) : undefined;
        const outside = topology ? samples.findIndex((sample) => sample.rank >= topology.ranks.length) : -1;
        if (topology && outside >= 0) {
          throw new InputError(
            `${options.input} line ${lineNumbers[outside]}: rank ${samples[outside]?.rank} is not in the topology (${topology.ranks.length} ranks)`,
            'rank',
          );
        }
        process.stdout.write(`${JSON.stringify(detectFailSlow(samples, { topology }), null, 2)}\n`);
      });
    });

  detect.addCommand(suspectsCommand());

  return detect;
}

/**
 * Parses `time,rank,iteration_seconds` rows (columns in any order, blank lines skipped), with
 * each sample's line number. Every error names the file, the line and the field.
 */
export function parseIterationCsv(text: string, source = 'input'): { samples: FailSlowSample[]; lineNumbers: number[] } {
  const lines = text.split(/\r?\n/);
  const headerAt = lines.findIndex((line) => line.trim() !== '');
  if (headerAt < 0) throw new InputError(`${source}: empty file; expected the header ${COLUMNS.join(',')}`, 'header');
  const header = (lines[headerAt] as string)
    .replace(/^\uFEFF/, '')
    .split(',')
    .map((name) => name.trim());
  const position = new Map<string, number>(header.map((name, index) => [name, index]));
  const missing = COLUMNS.filter((column) => !position.has(column));
  const unknown = header.filter((name) => !(COLUMNS as readonly string[]).includes(name));
  if (missing.length > 0 || unknown.length > 0 || header.length !== COLUMNS.length) {
    throw new InputError(
      `${source} line ${headerAt + 1}: header must be ${COLUMNS.join(',')}, got ${JSON.stringify(lines[headerAt])}` +
        (missing.length > 0 ? ` (missing ${missing.join(', ')})` : ''),
      'header',
    );
  }

  const samples: FailSlowSample[] = [];
  const lineNumbers: number[] = [];
  for (let index = headerAt + 1; index < lines.length; index += 1) {
    const line = lines[index] as string;
    if (line.trim() === '') continue;
    const lineNumber = index + 1;
    const fields = line.split(',');
    if (fields.length !== COLUMNS.length) {
      throw new InputError(`${source} line ${lineNumber}: expected ${COLUMNS.length} fields, got ${fields.length}`, `line ${lineNumber}`);
    }
    const value = (column: Column): number => {
      const raw = (fields[position.get(column) as number] as string).trim();
      const number = raw === '' ? Number.NaN : Number(raw);
      if (!Number.isFinite(number)) throw new InputError(`${source} line ${lineNumber}: ${column} is not a number: ${JSON.stringify(raw)}`, column);
      return number;
    };
    const time = value('time');
    const rank = value('rank');
    const iterationSeconds = value('iteration_seconds');
    if (time < 0) throw new InputError(`${source} line ${lineNumber}: time must be ≥ 0, got ${time}`, 'time');
    if (!Number.isSafeInteger(rank) || rank < 0) throw new InputError(`${source} line ${lineNumber}: rank must be a whole number ≥ 0, got ${rank}`, 'rank');
    if (iterationSeconds <= 0) {
      throw new InputError(`${source} line ${lineNumber}: iteration_seconds must be > 0, got ${iterationSeconds}`, 'iteration_seconds');
    }
    samples.push({ time, rank, iterationSeconds });
    lineNumbers.push(lineNumber);
  }
  return { samples, lineNumbers };
}

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (error) {
    throw new InputError(`cannot read ${what} file ${path}: ${errorMessage(error)}`);
  }
}

function parseJson(text: string, path: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new InputError(`topology file ${path} is not JSON: ${errorMessage(error)}`);
  }
}
