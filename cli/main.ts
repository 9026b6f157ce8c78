import { Command, type CommanderError } from 'commander';
import { COMMANDS, chosenCommand, loadCommand } from './commands.js';
import { EXIT_USAGE } from './common.js';

// commander exits 0 for --help and --version; every usage error (unknown option, bad value) exits 2.
const exitOnUsageError = (error: CommanderError): never => process.exit(error.exitCode === 0 ? 0 : EXIT_USAGE);

const program = new Command('steadfast')
  .description('Keeps large LLM training jobs running: GPU-node monitoring wired to training-level recovery.')
  .version('0.1.0')
  .showHelpAfterError()
  // A subcommand's flags stay its own (`jobs delete JOB --token-file F`), not taken by a command above it.
  .enablePositionalOptions()
  .exitOverride(exitOnUsageError);

/** Applies the usage-error handling to a command and every subcommand below it. */
function withUsageErrors(command: Command): Command {
  command.showHelpAfterError().exitOverride(exitOnUsageError);
  command.commands.forEach(withUsageErrors);
  return command;
}

// Only the command being run is loaded; the others are listed by name and summary for --help.
const chosen = chosenCommand(process.argv.slice(2));
for (const entry of COMMANDS) {
  if (entry.name === chosen) program.addCommand(withUsageErrors(await loadCommand(entry)));
  else program.command(entry.name).summary(entry.summary);
}

await program.parseAsync(process.argv);
