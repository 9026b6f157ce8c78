import { readFileSync } from 'node:fs';
import { Command, InvalidArgumentError } from 'commander';
import { InputError, errorMessage } from '../core/errors.js';
import { Topology } from '../core/topology.js';
import { detectFailSlow, type FailSlowSample } from '../analyzers/failslow.js';
import { MultiSignalDetector, scoreMoment, type Evidence, type Suspect } from '../analyzers/multisignal.js';
import { PrometheusFeatureSource, detectorFeatures, type FeatureSource } from '../analyzers/multisignal-source.js';
import { runCommand } from './common.js';

/** `steadfast detect …`: the detectors over recorded data, as JSON on stdout with stable field names. */

const COLUMNS = ['time', 'rank', 'iteration_seconds'] as const;
type Column = (typeof COLUMNS)[number];

export function detectCommand(): Command {
  const detect = new Command('detect').description('Detectors over recorded data: fail-slow iterations (Greyhound §4), multi-signal suspects (504-GPU report).');

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

  detect
    .command('suspects')
    .description(
      'Multi-signal detection over a past window (the 504-GPU report): every node scored against its peers at each step from Prometheus, and the nodes unlike them persistently.',
    )
    .requiredOption('--prometheus <url>', 'Prometheus base URL, e.g. http://prometheus:9090')
    .option('--nodes <a,b,...>', 'judge only these nodes against each other (one job\'s nodes: peers doing the same work)')
    .option('--at <time>', 'end of the window: ISO 8601 or unix seconds (default now)')
    .option('--minutes <m>', 'length of the window', positiveNumber, 15)
    .option('--step-seconds <s>', 'seconds between evaluations', positiveNumber, 60)
    .action(async (options: { prometheus: string; nodes?: string; at?: string; minutes: number; stepSeconds: number }) => {
      await runCommand(async () => {
        if (!URL.canParse(options.prometheus) || !/^https?:$/.test(new URL(options.prometheus).protocol)) throw new InputError(`--prometheus: not an http(s) URL: ${options.prometheus}`, 'prometheus');
        const end = parseTime(options.at);
        const steps = Math.floor((options.minutes * 60) / options.stepSeconds);
        if (steps < 1 || steps > 10_000) throw new InputError(`--minutes / --step-seconds: ${steps} evaluations; between 1 and 10000 are allowed`, 'minutes');
        const only = options.nodes === undefined ? undefined : new Set(options.nodes.split(',').map((node) => node.trim()).filter(Boolean));
        process.stdout.write(`${JSON.stringify(await suspectsOverWindow(new PrometheusFeatureSource({ url: options.prometheus }), { end, steps, stepMs: options.stepSeconds * 1000, only }), null, 2)}\n`);
      });
    });

  return detect;
}

function positiveNumber(value: string): number {
  const number = Number(value);
  if (!(number > 0) || !Number.isFinite(number)) throw new InvalidArgumentError('must be a positive number');
  return number;
}

function parseTime(value: string | undefined): number {
  if (value === undefined) return Date.now();
  const number = Number(value);
  const time = Number.isFinite(number) ? number * 1000 : Date.parse(value);
  if (!Number.isFinite(time)) throw new InputError(`--at: not a time: ${value} (ISO 8601 or unix seconds)`, 'at');
  return time;
}

/**
 * Replays the detector over `steps` evaluations ending at `end`: what it would have raised,
 * and for every node how often it stood out, worst first — the view an engineer wants after an
 * incident. Features Prometheus could not answer are listed, not fatal.
 */
export async function suspectsOverWindow(
  source: FeatureSource,
  window: { end: number; steps: number; stepMs: number; only?: ReadonlySet<string> | undefined },
): Promise<{ from: string; to: string; evaluations: number; suspects: Suspect[]; nodes: { node: string; anomalousIn: number; worstScore: number; evidence: readonly Evidence[] }[]; failures: string[] }> {
  const detector = new MultiSignalDetector({ features: detectorFeatures() });
  const tally = new Map<string, { anomalousIn: number; worstScore: number; evidence: readonly Evidence[] }>();
  const failures = new Set<string>();
  const raised = new Map<string, Suspect>();
  const start = window.end - (window.steps - 1) * window.stepMs;
  for (let step = 0; step < window.steps; step += 1) {
    const time = start + step * window.stepMs;
    const reading = await source.read(time);
    for (const failure of reading.failures) failures.add(failure.message);
    const matrix = window.only ? Object.fromEntries(Object.entries(reading.matrix).filter(([node]) => window.only?.has(node))) : reading.matrix;
    const moment = scoreMoment(matrix, detector.settings);
    for (const score of moment.nodes) {
      if (!score.anomalous) continue;
      const entry = tally.get(score.node) ?? { anomalousIn: 0, worstScore: 0, evidence: [] };
      entry.anomalousIn += 1;
      if (score.score > entry.worstScore) Object.assign(entry, { worstScore: score.score, evidence: score.evidence });
      tally.set(score.node, entry);
    }
    for (const suspect of detector.evaluate(time, matrix).suspects) raised.set(suspect.node, suspect);
  }
  const nodes = [...tally.entries()].map(([node, entry]) => ({ node, ...entry })).sort((a, b) => b.anomalousIn - a.anomalousIn || b.worstScore - a.worstScore);
  return { from: new Date(start).toISOString(), to: new Date(window.end).toISOString(), evaluations: window.steps, suspects: [...raised.values()], nodes, failures: [...failures] };
}

/**
 * Parses `time,rank,iteration_seconds` rows (columns in any order, blank lines skipped), with
 * each sample's line number. Every error names the file, the line and the field.
 */
export function parseIterationCsv(text: string, source = 'input'): { samples: FailSlowSample[]; lineNumbers: number[] } {
  const lines = text.split(/\r?\n/);
  const headerAt = lines.findIndex((line) => line.trim() !== '');
  if (headerAt < 0) throw new InputError(`${source}: empty file; expected the header ${COLUMNS.join(',')}`, 'header');
  const header = (lines[headerAt] as string).replace(/^\uFEFF/, '').split(',').map((name) => name.trim());
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
