import { Command, type CommanderError } from 'commander';
import { agentCommand } from './agent.js';
import { alertmanagerConfigCommand } from './alertmanager-config.js';
import { analyzeCommand } from './analyze.js';
import { auditCommand } from './audit.js';
import { checkCommand } from './check.js';
import { controllerCommand } from './controller.js';
import { dashboardsCommand } from './dashboards.js';
import { demoCommand } from './demo.js';
import { detectCommand } from './detect.js';
import { holdCommands } from './holds.js';
import { jobsCommand } from './jobs.js';
import { labCommand } from './lab.js';
import { pauseCommands } from './pause.js';
import { queuesCommand } from './queues.js';
import { planCommand } from './plan.js';
import { resumeCommand } from './resume.js';
import { rulesCommand } from './rules.js';
import { sdCommand } from './sd.js';
import { simulateCommand } from './simulate.js';
import { tokenCommand } from './token.js';
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

for (const command of [agentCommand(), controllerCommand(), auditCommand(), jobsCommand(), queuesCommand(), ...pauseCommands(), ...holdCommands(), resumeCommand(), planCommand(), analyzeCommand(), detectCommand(), simulateCommand(), dashboardsCommand(), rulesCommand(), alertmanagerConfigCommand(), sdCommand(), checkCommand(), demoCommand(), labCommand(), tokenCommand()]) {
  program.addCommand(withUsageErrors(command));
}

await program.parseAsync(process.argv);
