import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { InputError, errorMessage } from '../core/errors.js';
import { Topology } from '../core/topology.js';
import { analyzeFlightRecorder, splitRankKeyedDumps, type FlightRecorderAnalysis } from '../analyzers/flight-recorder-analysis.js';
import { aggregateStacks } from '../analyzers/stacks/aggregate.js';
import { printableJson, runCommand } from './common.js';

/** `steadfast analyze …`: the runtime analyzers on captured evidence, JSON on stdout with stable field names. */

const RANK_FILE = /^rank-(0|[1-9]\d*)\.txt$/;
const RANK_JSON_FILE = /^rank-(0|[1-9]\d*)\.json$/;

function readText(path: string, what: string): string {
  try {
    return readFileSync(path, 'utf8');
  } catch (error) {
    throw new InputError(`cannot read ${what} ${path}: ${errorMessage(error)}`);
  }
}

function readJson(path: string, what: string): unknown {
  const text = readText(path, what);
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new InputError(`${what} ${path} is not JSON: ${errorMessage(error)}`);
  }
}

function listDirectory(dir: string, what: string): string[] {
  try {
    if (!statSync(dir).isDirectory()) throw new InputError(`${what} ${dir} is not a directory`);
    return readdirSync(dir).sort();
  } catch (error) {
    if (error instanceof InputError) throw error;
    throw new InputError(`cannot read ${what} ${dir}: ${errorMessage(error)}`);
  }
}

/** Why `path` is not a plain file, or null when it is one. */
function notAFile(path: string): string | null {
  try {
    return statSync(path).isFile() ? null : 'not a plain file';
  } catch (error) {
    return errorMessage(error);
  }
}

/** One `rank-<N>.txt` per rank, each holding that rank's py-spy output (one dump or several in a row). */
function readRankDumps(dir: string, topology: Topology): Map<number, string> {
  const dumps = new Map<number, string>();
  for (const name of listDirectory(dir, 'dumps directory')) {
    const match = RANK_FILE.exec(name);
    if (!match) throw new InputError(`dumps directory ${dir}: "${name}" is not named rank-<N>.txt`);
    const rank = Number(match[1]);
    if (rank >= topology.ranks.length) {
      throw new InputError(`dumps directory ${dir}: ${name} is for rank ${rank}, but the topology has ranks 0-${topology.ranks.length - 1}`);
    }
    const path = join(dir, name);
    const problem = notAFile(path);
    if (problem !== null) throw new InputError(`dumps directory ${dir}: ${name}: ${problem}`);
    dumps.set(rank, readText(path, 'dump file'));
  }
  if (dumps.size === 0) throw new InputError(`dumps directory ${dir} holds no rank-<N>.txt files`);
  return dumps;
}

/**
 * Flight-recorder dumps decoded to JSON: `rank-<N>.json` holds rank N's dump; any other `*.json`
 * holds several, keyed `rank<N>`. Other files are ignored (the original pickles may sit beside them).
 */
function readFlightRecorder(dir: string, topology: Topology): FlightRecorderAnalysis {
  const dumps = new Map<number, unknown>();
  const add = (rank: number, dump: unknown, source: string): void => {
    if (rank >= topology.ranks.length) throw new InputError(`flight recorder ${source}: rank ${rank} is not in the topology`);
    if (dumps.has(rank)) throw new InputError(`flight recorder ${source}: rank ${rank} appears twice`);
    dumps.set(rank, dump);
  };
  for (const name of listDirectory(dir, 'flight recorder directory')) {
    if (!name.endsWith('.json')) continue;
    const path = join(dir, name);
    const value = readJson(path, 'flight recorder file');
    const single = RANK_JSON_FILE.exec(name);
    if (single) {
      add(Number(single[1]), value, path);
      continue;
    }
    const byRank = splitRankKeyedDumps(value);
    if (byRank.size === 0) throw new InputError(`flight recorder file ${path} has no rank<N> keys and is not named rank-<N>.json`);
    for (const [rank, dump] of byRank) add(rank, dump, path);
  }
  if (dumps.size === 0) throw new InputError(`flight recorder directory ${dir} holds no .json dumps`);
  return analyzeFlightRecorder(dumps);
}

function print(value: unknown): void {
  process.stdout.write(`${printableJson(value, 2)}\n`);
}

export function analyzeCommand(): Command {
  const analyze = new Command('analyze').description('Runtime analyzers on captured evidence: stack aggregation (ByteRobust §5).');

  analyze
    .command('stacks')
    .description(
      "Group ranks by the training thread's py-spy stack, take the dominant groups as healthy and over-evict the parallel group the outliers share (ByteRobust §5.1).",
    )
    .argument('<dumps-dir>', "directory with one rank-<N>.txt per rank, each that rank's `py-spy dump` output")
    .requiredOption('--topology <file>', 'topology JSON: {"ranks": [...]} or sizes with an order string')
    .option('--flight-recorder <dir>', 'NCCL flight-recorder dumps decoded to JSON; ranks behind in a collective join the outliers')
    .action(async (dumpsDir: string, options: { topology: string; flightRecorder?: string }) => {
      await runCommand(async () => {
        const topology = Topology.from(readJson(options.topology, 'topology file'));
        const dumps = readRankDumps(dumpsDir, topology);
        const flightRecorder = options.flightRecorder === undefined ? undefined : readFlightRecorder(options.flightRecorder, topology);
        const result = aggregateStacks(dumps, topology, { externalOutliers: flightRecorder?.behindRanks ?? [] });
        print(flightRecorder === undefined ? result : { ...result, flightRecorder });
      });
    });

  return analyze;
}
