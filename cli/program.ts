import { Command, type CommanderError } from 'commander';
import { EXIT_USAGE } from './common.js';

/**
 * The top-level `steadfast` command, shared by the whole CLI (cli/main.ts) and the agent's own
 * entry point (cli/agent-main.ts), so that both answer --version, --help and usage errors alike.
 */

export const VERSION = '0.1.0';

// commander exits 0 for --help and --version; every usage error (unknown option, bad value) exits 2.
const exitOnUsageError = (error: CommanderError): never => process.exit(error.exitCode === 0 ? 0 : EXIT_USAGE);

export function steadfastProgram(name = 'steadfast'): Command {
  return (
    new Command(name)
      .description('Keeps large LLM training jobs running: GPU-node monitoring wired to training-level recovery.')
      .version(VERSION)
      .showHelpAfterError()
      // A subcommand's flags stay its own (`jobs delete JOB --token-file F`), not taken by a command above it.
      .enablePositionalOptions()
      .exitOverride(exitOnUsageError)
  );
}

/** Applies the usage-error handling to a command and every subcommand below it. */
export function withUsageErrors(command: Command): Command {
  command.showHelpAfterError().exitOverride(exitOnUsageError);
  command.commands.forEach(withUsageErrors);
  return command;
}
