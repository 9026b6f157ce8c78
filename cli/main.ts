import { Command } from 'commander';
import { agentCommand } from './agent.js';
import { auditCommand } from './audit.js';
import { controllerCommand } from './controller.js';
import { demoCommand } from './demo.js';
import { EXIT_USAGE } from './common.js';

const program = new Command('steadfast')
  .description('Keeps large LLM training jobs running: GPU-node monitoring wired to training-level recovery.')
  .version('0.1.0')
  .showHelpAfterError()
  .exitOverride((error) => {
    // commander's own exit codes for --help and --version are 0; usage errors become 2.
    process.exit(error.exitCode === 0 ? 0 : EXIT_USAGE);
  });

program.addCommand(agentCommand());
program.addCommand(controllerCommand());
program.addCommand(auditCommand());
program.addCommand(demoCommand());

await program.parseAsync(process.argv);
