import { InputError } from '../core/errors.js';
import { EXIT_USAGE } from './common.js';
import { COMMANDS, chosenCommand, loadCommand } from './commands.js';
import { steadfastProgram, withUsageErrors } from './program.js';

const program = steadfastProgram();

// Only the command being run is loaded; the others are listed by name and summary for --help.
const chosen = chosenCommand(process.argv.slice(2));
let loaded = true;
for (const entry of COMMANDS) {
  if (entry.name !== chosen) {
    program.command(entry.name).summary(entry.summary);
    continue;
  }
  try {
    program.addCommand(withUsageErrors(await loadCommand(entry)));
  } catch (error) {
    // A command this installation does not carry (the try-it tools without their package).
    if (!(error instanceof InputError)) throw error;
    process.stderr.write(`steadfast: ${error.message}\n`);
    process.exitCode = EXIT_USAGE;
    loaded = false;
  }
}

if (loaded) await program.parseAsync(process.argv);
