import { Command, InvalidArgumentError } from 'commander';
import type { z } from 'zod';
import { InputError } from '../core/errors.js';
import { PrometheusFeatureSource } from '../analyzers/multisignal/source.js';
import { prometheusLabelNameSchema, scrapeJobSchema } from '../core/detector-labels.js';
import { printable, printableJson, runCommand } from './common.js';
import { PEER_MODES, suspectsOverWindow, type PeerMode, type SuspectsReport, type SuspectsWindow } from '../analyzers/multisignal/window.js';

export { PEER_MODES, suspectsOverWindow, type PeerMode, type SuspectsReport, type SuspectsWindow };

/**
 * `steadfast detect suspects`: the multi-signal detector replayed over a past window from
 * Prometheus. Peers are the nodes of one training job (the training-job label), so the command
 * first learns each node's own normal over the hours before the window, then judges the window,
 * and says what it could not judge: features with no data and why, nodes with no job.
 */

interface SuspectsOptions {
  prometheus: string;
  nodes?: string;
  at?: string;
  minutes: number;
  stepSeconds: number;
  peers: string;
  scrapeJob?: string;
  nodeLabel?: string;
  trainingJobLabel?: string;
  baselineHours: number;
  baselineStepMinutes: number;
}

export function suspectsCommand(): Command {
  return new Command('suspects')
    .description(
      'Multi-signal detection over a past window (the 504-GPU report): every node scored against the nodes of its training job at each step from Prometheus, against its own usual difference from them, and the nodes unlike them persistently.',
    )
    .requiredOption('--prometheus <url>', 'Prometheus base URL, e.g. http://prometheus:9090')
    .option('--nodes <a,b,...>', "judge only these nodes, as one group of peers (one job's nodes)")
    .option('--peers <mode>', `who is compared with whom: ${PEER_MODES.join(' | ')} (every node as one group)`, 'training-job')
    .option('--at <time>', 'end of the window: ISO 8601 or unix seconds (default now)')
    .option('--minutes <m>', 'length of the window', nonNegativeNumber, 15)
    .option('--step-seconds <s>', 'seconds between evaluations', positiveNumber, 60)
    .option('--baseline-hours <h>', "hours before the window to learn each node's own normal from (0: none)", nonNegativeNumber, 3)
    .option('--baseline-step-minutes <m>', 'minutes between the readings of that warm-up', positiveNumber, 10)
    .option('--scrape-job <job>', 'scrape job of the node metrics (several as a|b)')
    .option('--node-label <label>', 'label naming the node on the node series (default node)')
    .option('--training-job-label <label>', 'label naming the training job (default training_job)')
    .action(async (options: SuspectsOptions) => {
      await runCommand(async () => {
        if (!URL.canParse(options.prometheus) || !/^https?:$/.test(new URL(options.prometheus).protocol))
          throw new InputError(`--prometheus: not an http(s) URL: ${options.prometheus}`, 'prometheus');
        if (!(PEER_MODES as readonly string[]).includes(options.peers))
          throw new InputError(`--peers: must be one of ${PEER_MODES.join(', ')}, got ${options.peers}`, 'peers');
        checkFlag('--scrape-job', scrapeJobSchema, options.scrapeJob);
        checkFlag('--node-label', prometheusLabelNameSchema, options.nodeLabel);
        checkFlag('--training-job-label', prometheusLabelNameSchema, options.trainingJobLabel);
        const end = parseTime(options.at);
        const steps = Math.floor((options.minutes * 60) / options.stepSeconds);
        if (steps < 1 || steps > 10_000) throw new InputError(`--minutes / --step-seconds: ${steps} evaluations; between 1 and 10000 are allowed`, 'minutes');
        const warmupSteps = Math.floor((options.baselineHours * 60) / options.baselineStepMinutes);
        if (warmupSteps > 2_000)
          throw new InputError(`--baseline-hours / --baseline-step-minutes: ${warmupSteps} readings; at most 2000 are allowed`, 'baseline-hours');
        const only =
          options.nodes === undefined
            ? undefined
            : new Set(
                options.nodes
                  .split(',')
                  .map((node) => node.trim())
                  .filter(Boolean),
              );
        const source = new PrometheusFeatureSource({
          url: options.prometheus,
          ...(options.scrapeJob === undefined ? {} : { agentJob: options.scrapeJob }),
          ...(options.nodeLabel === undefined ? {} : { nodeLabel: options.nodeLabel }),
          ...(options.trainingJobLabel === undefined ? {} : { trainingJobLabel: options.trainingJobLabel }),
        });
        const report = await suspectsOverWindow(source, {
          end,
          steps,
          stepMs: options.stepSeconds * 1000,
          only,
          peers: only ? 'all' : (options.peers as PeerMode),
          warmupSteps,
          warmupStepMs: options.baselineStepMinutes * 60_000,
        });
        for (const note of report.notes) process.stderr.write(`steadfast: ${printable(note)}\n`);
        process.stdout.write(`${printableJson(report, 2)}\n`);
      });
    });
}

function positiveNumber(value: string): number {
  const number = Number(value);
  if (!(number > 0) || !Number.isFinite(number)) throw new InvalidArgumentError('must be a positive number');
  return number;
}

function nonNegativeNumber(value: string): number {
  const number = Number(value);
  if (!(number >= 0) || !Number.isFinite(number)) throw new InvalidArgumentError('must be a number ≥ 0');
  return number;
}

/** A label flag's value, refused with the flag's name and the rule it breaks. */
function checkFlag(flag: string, schema: z.ZodType<string>, value: string | undefined): void {
  if (value === undefined) return;
  const result = schema.safeParse(value);
  if (!result.success)
    throw new InputError(`${flag}: ${result.error.issues.map((issue) => issue.message).join('; ')}, got ${JSON.stringify(value)}`, flag.slice(2));
}

function parseTime(value: string | undefined): number {
  if (value === undefined) return Date.now();
  const number = Number(value);
  const time = Number.isFinite(number) ? number * 1000 : Date.parse(value);
  if (!Number.isFinite(time)) throw new InputError(`--at: not a time: ${value} (ISO 8601 or unix seconds)`, 'at');
  return time;
}
