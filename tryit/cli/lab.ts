import { Command, InvalidArgumentError } from 'commander';
import { assertClean, formatLabStatus, labDown, labStatus, labUp, type LabOptionsInput } from '../lab/index.js';
import { runCommand } from '../../cli/common.js';

/**
 * `steadfast lab up|down|status`: a real Slurm cluster on this machine (docs/lab.md), to try
 * steadfast on a laptop before a cluster, and for the end-to-end fault scenarios.
 */

function parseCount(value: string): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number < 0) throw new InvalidArgumentError('must be a whole number');
  return number;
}

interface CommonFlags {
  dir: string;
  prefix?: string;
}

/** Flags every subcommand shares: where the state is, and the names to clean up by. */
function withCommonFlags(command: Command): Command {
  return command
    .option('--dir <dir>', 'state directory: slurm.conf, logs, spool, lab.json', '.run/lab')
    .option('--prefix <prefix>', 'prefix of the namespaces and links the lab makes (default sflab)');
}

function common(flags: CommonFlags): LabOptionsInput {
  return { dir: flags.dir, ...(flags.prefix !== undefined ? { prefix: flags.prefix } : {}) };
}

function upCommand(): Command {
  return withCommonFlags(new Command('up'))
    .description('Start N slurmd nodes and K warm standbys, each in its own network namespace, and slurmctld on a private bridge.')
    .option('--nodes <count>', 'compute nodes (node-1 … node-N)', parseCount, 4)
    .option('--standbys <count>', 'warm standbys after them, held in the standby reservation', parseCount, 2)
    .option('--subnet <a.b.c>', 'private /24 for the bridge (.1) and the nodes (.11 onwards)', '10.201.0')
    .option('--reservation <name>', "Slurm reservation holding the standbys (the controller's backend.slurm.standbyReservation)", 'steadfast-standby')
    .action(async (flags: CommonFlags & { nodes: number; standbys: number; subnet: string; reservation: string }) => {
      // Interrupted half-way: undo what was made, then exit.
      const interrupted = (signal: NodeJS.Signals): void => {
        process.stderr.write(`\n${signal}: removing what lab up made so far …\n`);
        void labDown(common(flags)).finally(() => process.exit(130));
      };
      process.once('SIGINT', interrupted);
      process.once('SIGTERM', interrupted);
      await runCommand(async () => {
        const state = await labUp(
          { ...common(flags), nodes: flags.nodes, standbys: flags.standbys, subnet: flags.subnet, reservation: flags.reservation },
          (step, seconds) => process.stdout.write(`  ✓ ${step} (${seconds.toFixed(1)} s)\n`),
        );
        process.stdout.write(
          `lab up in ${state.dir}\n` +
            `  export SLURM_CONF=${state.conf}\n` +
            `  sinfo; sbatch examples/pytorch/train.sbatch; steadfast lab status; steadfast lab down${flags.dir === '.run/lab' ? '' : ` --dir ${flags.dir}`}\n`,
        );
      });
      process.removeListener('SIGINT', interrupted);
      process.removeListener('SIGTERM', interrupted);
    });
}

function downCommand(): Command {
  return withCommonFlags(new Command('down'))
    .description('Cancel the jobs, stop every lab daemon and process, delete the namespaces, veths and bridge. Safe to repeat.')
    .option('--json', 'print the report as JSON')
    .action(async (flags: CommonFlags & { json?: boolean }) => {
      await runCommand(async () => {
        const report = await labDown(common(flags));
        if (flags.json) process.stdout.write(`${JSON.stringify(report, null, 2)}\n`);
        else {
          if (report.jobsNotCancelled.length > 0)
            process.stdout.write(`jobs still listed after scancel (their processes were killed): ${report.jobsNotCancelled.join(', ')}\n`);
          process.stdout.write(`lab down: stopped ${report.stopped.length} process(es); logs kept in ${report.dir}/log\n`);
        }
        assertClean(report);
      });
    });
}

function statusCommand(): Command {
  return withCommonFlags(new Command('status'))
    .description('Show the lab: nodes as sinfo sees them, the standby reservation, jobs, processes, namespaces.')
    .option('--json', 'print the status as JSON')
    .action(async (flags: CommonFlags & { json?: boolean }) => {
      await runCommand(async () => {
        const status = await labStatus(common(flags));
        process.stdout.write(flags.json ? `${JSON.stringify(status, null, 2)}\n` : formatLabStatus(status));
      });
    });
}

export function labCommand(): Command {
  return new Command('lab')
    .description('A real Slurm cluster on this machine: one network namespace and slurmd per node (needs root).')
    .addCommand(upCommand())
    .addCommand(downCommand())
    .addCommand(statusCommand());
}
