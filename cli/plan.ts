import { readFileSync } from 'node:fs';
import { Command, InvalidArgumentError } from 'commander';
import { z } from 'zod';
import { InputError, errorMessage } from '../core/errors.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import { Topology } from '../core/topology.js';
import { parseOrThrow } from '../core/validate.js';
import { planBackups } from '../actuators/backup-placement.js';
import { optimalCheckpointInterval } from '../actuators/checkpoint-interval.js';
import { planMicrobatches } from '../analyzers/microbatch.js';
import { machineIds, maxSuspects, replayGroups, replaySuspects, type FailedReplayGroups } from '../analyzers/replay/plan.js';
import { standbyPoolSize } from '../actuators/standby-sizing.js';
import { parsePositiveInt, runCommand } from './common.js';

/** `steadfast plan …`: the recovery planners as JSON on stdout, with stable field names. */

function probability(value: string): number {
  const number = Number(value);
  if (!(number >= 0 && number <= 1)) throw new InvalidArgumentError('must be a probability between 0 and 1');
  return number;
}

function positiveNumber(value: string): number {
  const number = Number(value);
  if (!(number > 0) || !Number.isFinite(number)) throw new InvalidArgumentError('must be a positive number');
  return number;
}

/** `--machines`: a count Z (machines 0…Z−1), or a comma-separated list of node names in id order. */
function machineList(value: string): number[] | string[] {
  const text = value.trim();
  if (/^\d+$/.test(text)) {
    const count = Number(text);
    if (count < 1) throw new InvalidArgumentError('must be a machine count of at least 1 or a comma-separated list of node names');
    return machineIds(count);
  }
  const names = text.split(',').map((name) => name.trim());
  const bad = names.find((name) => !NODE_NAME_PATTERN.test(name));
  if (bad !== undefined) throw new InvalidArgumentError(`must be a machine count or a comma-separated list of node names; "${bad}" is not a node name`);
  const twice = names.find((name, index) => names.indexOf(name) !== index);
  if (twice !== undefined) throw new InvalidArgumentError(`lists node ${twice} twice`);
  return names;
}

/** `--failed A,B`: the 0-based indices of the failing horizontal and vertical groups. */
function failedGroups(value: string): FailedReplayGroups {
  const match = /^\s*(\d+)\s*,\s*(\d+)\s*$/.exec(value);
  if (!match) throw new InvalidArgumentError('must be A,B: the 0-based index of the failing horizontal group, then of the failing vertical group');
  return { horizontal: Number(match[1]), vertical: Number(match[2]) };
}

function readJson(path: string, what: string): unknown {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (error) {
    throw new InputError(`cannot read ${what} file ${path}: ${errorMessage(error)}`);
  }
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    throw new InputError(`${what} file ${path} is not JSON: ${errorMessage(error)}`);
  }
}

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value, null, 2)}\n`);
}

export function planCommand(): Command {
  const plan = new Command('plan').description(
    'Planners: warm standby pool size, checkpoint backup placement, checkpoint interval, micro-batch assignment, dual-phase replay groups.',
  );

  plan
    .command('standby')
    .description('Warm standby pool size: the quantile (default P99) of Binomial(nodes, daily failure rate) (ByteRobust §6.2).')
    .requiredOption('--nodes <n>', 'machines in the job or cluster', parsePositiveInt)
    .requiredOption('--daily-failure-rate <p>', 'probability that one machine fails on a given day', probability)
    .option('--quantile <q>', 'share of days the pool must cover', probability, 0.99)
    .action(async (options: { nodes: number; dailyFailureRate: number; quantile: number }) => {
      await runCommand(async () => print(standbyPoolSize(options.nodes, options.dailyFailureRate, options.quantile)));
    });

  plan
    .command('backups')
    .description("Place each rank's checkpoint backups outside its TP, PP and DP groups and across racks (ByteRobust §6.3, DeadPool §V-C).")
    .requiredOption('--topology <file>', 'topology JSON: {"ranks": [...]} or sizes with an order string')
    .option('--replicas <k>', 'backups per shard', parsePositiveInt, 1)
    .option('--racks <file>', 'JSON object mapping node name to rack or switch')
    .option('--node-failure-rate <p>', 'per-node failure probability, to report the loss probability', probability)
    .action(async (options: { topology: string; replicas: number; racks?: string; nodeFailureRate?: number }) => {
      await runCommand(async () => {
        const topology = Topology.from(readJson(options.topology, 'topology'));
        const racks = options.racks ? parseOrThrow(z.record(z.string(), z.string()), readJson(options.racks, 'racks'), 'racks file') : undefined;
        print(planBackups(topology, { replicas: options.replicas, racks, nodeFailureRate: options.nodeFailureRate }));
      });
    });

  plan
    .command('checkpoint')
    .description("Checkpoint interval that minimises lost work: Young's √(2·C·MTBF) and Daly's refinement.")
    .requiredOption('--mtbf-hours <h>', 'mean time between failures of the whole job, in hours', positiveNumber)
    .requiredOption('--checkpoint-seconds <c>', 'time to write one checkpoint, in seconds', positiveNumber)
    .action(async (options: { mtbfHours: number; checkpointSeconds: number }) => {
      await runCommand(async () => print(optimalCheckpointInterval(options.mtbfHours, options.checkpointSeconds)));
    });

  plan
    .command('microbatch')
    .description("Exact micro-batch assignment over DP groups minimising the slowest group's time (Greyhound's rebalancing problem).")
    .requiredOption('--times <t1,t2,...>', 'seconds per micro-batch of each DP group, comma-separated')
    .requiredOption('--microbatches <M>', 'micro-batches per iteration in total', parsePositiveInt)
    .option('--pp <P>', 'pipeline stages: every group gets a multiple of P (1F1B)', parsePositiveInt)
    .action(async (options: { times: string; microbatches: number; pp?: number }) => {
      await runCommand(async () => {
        const times = options.times.split(',').map((value) => Number(value.trim()));
        print(planMicrobatches(times, options.microbatches, options.pp === undefined ? {} : { multipleOf: options.pp }));
      });
    });

  plan
    .command('replay')
    .description(
      'Dual-phase replay groups (ByteRobust §4.2, Algorithm 1): horizontal groups of M consecutive machines, vertical groups of the machines ' +
        'with equal id mod Z/M; with --failed, the suspects in both failing groups. Group indices are 0-based.',
    )
    .requiredOption('--machines <Z|names>', 'machine count Z (ids 0..Z-1), or node names comma-separated in id order', machineList)
    .requiredOption('--group-size <M>', 'machines per replay group, a divisor of Z (a multiple of the PP size; M <= Z/M for one suspect)', parsePositiveInt)
    .option('--failed <A,B>', '0-based indices of the failing horizontal group A and the failing vertical group B', failedGroups)
    .action(async (options: { machines: number[] | string[]; groupSize: number; failed?: FailedReplayGroups }) => {
      await runCommand(async () => {
        const { failed } = options;
        const machines: readonly (number | string)[] = options.machines;
        const groups = replayGroups(machines, options.groupSize);
        if (failed === undefined) {
          print(groups);
          return;
        }
        const { suspects } = replaySuspects(machines, options.groupSize, failed);
        if (suspects.length === 0) {
          process.stderr.write(
            'steadfast: the failing groups share no machine: the replays disagree (more than one faulty machine, or a fault that did not reproduce)\n',
          );
        } else if (suspects.length > 1) {
          const perPhase = machines.length / options.groupSize;
          process.stderr.write(
            `steadfast: group size ${options.groupSize} > ${perPhase} groups, so one fault leaves up to ${maxSuspects(machines.length, options.groupSize)} suspects (Algorithm 1 line 10)\n`,
          );
        }
        print({ ...groups, suspects });
      });
    });

  return plan;
}
