import { errorMessage } from '../core/errors.js';
import { agentCommand } from './agent.js';
import { steadfastProgram, withUsageErrors } from './program.js';

/**
 * `steadfast agent`'s own entry point. npm run build bundles it with what it imports into
 * dist/agent.cjs (scripts/build-agent.mjs), which bin/steadfast.js runs for `steadfast agent`
 * through cli/agent-bundle.ts: one file to read and compile instead of some hundred modules, none
 * of the other commands' code, and V8's code cache for it. The agent's V8 flags are set before
 * the bundle is compiled (agent-bundle.ts), so its modules load under them too.
 */

steadfastProgram()
  .addCommand(withUsageErrors(agentCommand({ setV8Flags: true })))
  .parseAsync(process.argv)
  .catch((error: unknown) => {
    process.stderr.write(`steadfast agent: ${errorMessage(error)}\n`);
    process.exitCode = 1;
  });
