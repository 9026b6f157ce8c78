import { writeFileSync } from 'node:fs';
import { Command, InvalidArgumentError } from 'commander';
import { InputError, errorMessage } from '../../core/errors.js';
import { compareStrategies, type EttrComparison } from '../ettr/compare.js';
import { LAB_SWAP_TARGET_SECONDS, SWAP_FIGURES, type HotSwapOptions, type SwapFigures } from '../ettr/hot-swap.js';
import { PAPER_JOB } from '../ettr/model.js';
import { ettrParams, type EttrOptions } from '../ettr/params.js';
import { reportJson, reportText } from '../ettr/report.js';
import { sensitivity, type Sensitivity } from '../ettr/sensitivity.js';
import { parsePositiveInt, runCommand } from '../../cli/common.js';

/** `steadfast simulate …`: what steadfast's policies are worth on a simulated job. */

function positiveNumber(value: string): number {
  const number = Number(value);
  if (!(number > 0) || !Number.isFinite(number)) throw new InvalidArgumentError('must be a positive number');
  return number;
}

function wholeNumber(value: string): number {
  const number = Number(value);
  if (value.trim() === '' || !Number.isInteger(number) || number < 0) throw new InvalidArgumentError('must be a whole number of at least 0');
  return number;
}

function share(value: string): number {
  const number = Number(value);
  if (value.trim() === '' || !(number >= 0 && number <= 1)) throw new InvalidArgumentError('must be a share between 0 and 1');
  return number;
}

function swapFigures(value: string): SwapFigures {
  const found = SWAP_FIGURES.find((figures) => figures === value);
  if (found === undefined) throw new InvalidArgumentError(`must be one of ${SWAP_FIGURES.join(', ')}`);
  return found;
}

interface EttrFlags {
  hotSwap: boolean;
  swapFigures: SwapFigures;
  swapSeconds?: number;
  swapFallback: number;
  swapTimeout: number;
  nodesPerSpare: number;
  stepSeconds: number;
  gpus?: number;
  nodes?: number;
  days: number;
  seed: number;
  checkpointMinutes?: number;
  standby?: number;
  json?: boolean;
  plot?: string;
  sensitivity?: boolean;
}

const GPUS_PER_NODE = PAPER_JOB.gpus / PAPER_JOB.nodes;

/** --nodes and --gpus follow each other at 8 GPUs a node when only one is given (ByteRobust §8 testbed). */
function jobShape(flags: EttrFlags): { nodes: number; gpus: number } {
  if (flags.nodes !== undefined) return { nodes: flags.nodes, gpus: flags.gpus ?? flags.nodes * GPUS_PER_NODE };
  if (flags.gpus === undefined) return { nodes: PAPER_JOB.nodes, gpus: PAPER_JOB.gpus };
  if (flags.gpus % GPUS_PER_NODE !== 0) throw new InputError(`--gpus ${flags.gpus} is not a multiple of ${GPUS_PER_NODE}; give --nodes too`, 'gpus');
  return { nodes: flags.gpus / GPUS_PER_NODE, gpus: flags.gpus };
}

/** A one-line bar on stderr, redrawn in place; only on a terminal, so logs and pipes stay clean. */
function progressBar(label: string): { update: (fraction: number) => void; done: () => void } {
  const stream = process.stderr;
  if (!stream.isTTY) return { update: () => undefined, done: () => undefined };
  let drawn = -1;
  return {
    update: (fraction) => {
      const percent = Math.max(0, Math.min(100, Math.floor(fraction * 100)));
      if (percent === drawn) return;
      drawn = percent;
      const filled = Math.round(percent / 4);
      stream.write(`\r${label} [${'#'.repeat(filled)}${'.'.repeat(25 - filled)}] ${String(percent).padStart(3)}%`);
    },
    done: () => {
      if (drawn >= 0) stream.write('\r\x1b[K');
    },
  };
}

export function simulateCommand(): Command {
  const simulate = new Command('simulate').description("Simulations that put numbers on steadfast's recovery policy.");

  simulate
    .command('ettr')
    .description(
      "Discrete-event simulation of one long training job with ByteRobust's incident mix (Table 1) and recovery costs (Tables 3, 6, 7; Fig. 12), " +
        "recovered by steadfast's real recovery ladder with warm standbys, against the requeue and reschedule baselines (§8.2.1). Prints ETTR (§8.1.3).",
    )
    .option('--gpus <n>', `GPUs in the job (default ${PAPER_JOB.gpus}, or ${GPUS_PER_NODE} per node)`, parsePositiveInt)
    .option('--nodes <n>', `machines in the job (default ${PAPER_JOB.nodes}, or GPUs / ${GPUS_PER_NODE})`, parsePositiveInt)
    .option('--days <d>', 'wall-clock days simulated', positiveNumber, PAPER_JOB.days)
    .option('--seed <s>', 'seed of the incident draw', wholeNumber, 1)
    .option('--checkpoint-minutes <m>', "checkpoint interval (default: Daly's optimum for the job's MTBF)", positiveNumber)
    .option('--standby <k>', 'warm standby machines (default: P99 of the daily machine-failure binomial, §6.2)', wholeNumber)
    .option('--no-hot-swap', 'leave out the run of steadfast with hot swap (machine faults recovered by a spare inside the running job, DeadPool §V-C)')
    .option(
      '--swap-figures <source>',
      `the swap's time: deadpool (§VII-B3, scaled to the job's GPUs) or lab (its ${LAB_SWAP_TARGET_SECONDS} s target)`,
      swapFigures,
      'deadpool',
    )
    .option('--swap-seconds <s>', "the swap's time, set directly (overrides --swap-figures)", positiveNumber)
    .option('--swap-fallback <share>', 'share of swaps that do not finish and relaunch as today after the bound', share, 0.1)
    .option('--swap-timeout <s>', "the job's hotSwap.timeoutSeconds; the bound is min(it, max(10, 40 × step))", parsePositiveInt, 60)
    .option('--nodes-per-spare <n>', 'one idle spare per this many nodes (at least one)', parsePositiveInt, 300)
    .option('--step-seconds <s>', 'training step time: a swap loses at most one step', positiveNumber, 10)
    .option('--json', 'print one JSON object on stdout instead of the table')
    .option('--plot <file>', 'write ETTR against standby pool size and checkpoint interval as a PNG, or as SVG when the file ends in .svg (runs the sweep)')
    .option('--sensitivity', 'sweep the standby pool size and the checkpoint interval (5 seeds each)')
    .action(async (flags: EttrFlags) => {
      await runCommand(async () => {
        const shape = jobShape(flags);
        const hotSwap: HotSwapOptions | null = flags.hotSwap
          ? {
              figures: flags.swapFigures,
              swapSeconds: flags.swapSeconds,
              fallbackShare: flags.swapFallback,
              timeoutSeconds: flags.swapTimeout,
              nodesPerSpare: flags.nodesPerSpare,
              stepSeconds: flags.stepSeconds,
            }
          : null;
        const options: EttrOptions = {
          ...shape,
          days: flags.days,
          seed: flags.seed,
          checkpointMinutes: flags.checkpointMinutes,
          standby: flags.standby,
          hotSwap,
        };
        const params = ettrParams(options);

        const bar = progressBar('simulating');
        const sweep = flags.sensitivity === true || flags.plot !== undefined;
        let table: Sensitivity | undefined;
        let comparison: EttrComparison;
        try {
          comparison = compareStrategies(params, { onProgress: (fraction) => bar.update(sweep ? fraction * 0.2 : fraction) });
          if (sweep) table = sensitivity(params, { onProgress: (fraction) => bar.update(0.2 + fraction * 0.8) });
        } finally {
          bar.done();
        }

        if (flags.plot !== undefined && table !== undefined) {
          // Loaded only here: every steadfast command (the node agent too) shares this CLI, and
          // only --plot needs Vega and resvg in memory.
          const { ettrPlot, plotFormatFor } = await import('../ettr/plot.js');
          // Drawn before the write so a rendering failure is reported as itself, not as a bad path.
          const picture = await ettrPlot(table, { format: plotFormatFor(flags.plot) });
          try {
            writeFileSync(flags.plot, picture);
          } catch (error) {
            throw new InputError(`cannot write plot file ${flags.plot}: ${errorMessage(error)}`, 'plot');
          }
        }
        const extra = { sensitivity: table, plot: flags.plot };
        if (flags.json === true) process.stdout.write(`${JSON.stringify(reportJson(comparison, extra), null, 2)}\n`);
        else process.stdout.write(reportText(comparison, extra));
      });
    });

  return simulate;
}
