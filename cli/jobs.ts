import { Command, InvalidArgumentError } from 'commander';
import type { JobPolicy } from '../core/job.js';
import { jobNameSchema } from '../core/job.js';
import { parseOrThrow } from '../core/validate.js';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { printable, printableJson, runCommand } from './common.js';

interface JobView {
  readonly spec: {
    readonly name: string;
    readonly codeVersion: string;
    readonly nodes: readonly string[];
    readonly hotSwap?: { readonly spares: readonly string[] };
  };
  /** A hot-swap job's world: the epoch its ranks meet in, and whether a swap is under way. */
  readonly world?: { readonly epoch: number; readonly state: string };
  readonly state: string;
  readonly stateSince: string;
  readonly policy?: JobPolicy;
  readonly ettr: { readonly cumulative: number; readonly window1h: number };
}

function onOff(flag: string): (value: string) => boolean {
  return (value) => {
    if (value === 'on') return true;
    if (value === 'off') return false;
    throw new InvalidArgumentError(`${flag} takes on or off`);
  };
}

/** `2 spares, epoch 3` (`swapping` while a swap is under way), or `off`. */
export function describeHotSwap(job: Pick<JobView, 'spec' | 'world'>): string {
  const spares = job.spec.hotSwap?.spares;
  if (spares === undefined) return 'off';
  const count = `${spares.length} spare${spares.length === 1 ? '' : 's'}`;
  if (job.world === undefined) return count;
  return `${count}, epoch ${job.world.epoch}${job.world.state === 'swapping' ? ' swapping' : ''}`;
}

function describePolicy(policy: JobPolicy | undefined): string {
  if (!policy) return '';
  return [policy.recovery ? '' : 'recovery off', policy.dryRun ? 'dry-run' : ''].filter(Boolean).join(', ');
}

/**
 * `steadfast jobs`: the registered training jobs with their state and ETTR, over the controller's
 * API; `jobs delete` unregisters one, `jobs policy` sets its automatic recovery and dry-run.
 */
export function jobsCommand(): Command {
  const jobs = withControllerOptions(
    new Command('jobs').description(
      "List registered training jobs with their state, code version, nodes, ETTR, hot swap and policy (over the controller's HTTP API).",
    ),
  )
    // `jobs delete … --token-file F`: the flags after a subcommand are the subcommand's own.
    .enablePositionalOptions()
    .option('--json', 'print {"jobs": [...]} as JSON')
    .action(async (options: Record<string, unknown>) => {
      await runCommand(async () => {
        const answer = await callController<{ jobs: JobView[] }>(controllerConnection(options), 'GET', '/api/v1/jobs');
        if (options.json) {
          process.stdout.write(`${printableJson(answer, 2)}\n`);
          return;
        }
        const percent = (value: number): string => `${(value * 100).toFixed(1)}%`;
        process.stdout.write(
          `${'JOB'.padEnd(24)} ${'STATE'.padEnd(18)} ${'VERSION'.padEnd(12)} ${'NODES'.padStart(5)} ${'ETTR'.padStart(7)} ${'ETTR 1h'.padStart(7)}  ${'HOT SWAP'.padEnd(26)} SINCE                     POLICY\n`,
        );
        for (const job of answer.jobs) {
          const line = `${job.spec.name.padEnd(24)} ${job.state.padEnd(18)} ${job.spec.codeVersion.padEnd(12)} ${String(job.spec.nodes.length).padStart(5)} ${percent(job.ettr.cumulative).padStart(7)} ${percent(job.ettr.window1h).padStart(7)}  ${describeHotSwap(job).padEnd(26)} ${job.stateSince.padEnd(25)} ${describePolicy(job.policy)}`;
          process.stdout.write(`${printable(line.replace(/ +$/, ''))}\n`);
        }
      });
    });

  jobs.addCommand(
    withControllerOptions(
      new Command('delete').description('Unregister a job: steadfast stops watching and recovering it (its workload keeps running); audited.'),
    )
      .argument('<job>', "the registered job's name")
      .action(async (name: string, options: Record<string, unknown>) => {
        await runCommand(async () => {
          const job = parseOrThrow(jobNameSchema, name, 'job');
          const answer = await callController<{ deleted: string; was: string }>(controllerConnection(options), 'DELETE', `/api/v1/jobs/${job}`);
          process.stdout.write(`${printable(`${answer.deleted}: unregistered (was ${answer.was})`)}\n`);
        });
      }),
  );

  jobs.addCommand(
    withControllerOptions(
      new Command('policy').description("Turn a job's automatic recovery and dry-run on or off; a refused step is audited with the reason."),
    )
      .argument('<job>', "the registered job's name")
      .option('--recovery <on|off>', "automatic recovery (the ladder's acting steps)", onOff('--recovery'))
      .option('--dry-run <on|off>', 'act through a recording backend, describe launches instead of running them', onOff('--dry-run'))
      .action(async (name: string, options: Record<string, unknown>) => {
        await runCommand(async () => {
          const job = parseOrThrow(jobNameSchema, name, 'job');
          const change = { recovery: options.recovery, dryRun: options.dryRun };
          if (change.recovery === undefined && change.dryRun === undefined) throw new InvalidArgumentError('give --recovery, --dry-run or both');
          const answer = await callController<{ job: string; policy: JobPolicy }>(controllerConnection(options), 'PUT', `/api/v1/jobs/${job}/policy`, change);
          process.stdout.write(`${printable(answer.job)}: recovery ${answer.policy.recovery ? 'on' : 'off'}, dry-run ${answer.policy.dryRun ? 'on' : 'off'}\n`);
        });
      }),
  );
  return jobs;
}
