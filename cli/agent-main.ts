import { Command } from 'commander';
import { errorMessage } from '../core/errors.js';
import { agentCommand } from './agent.js';
import type { AgentEntry } from './agent-entry.js';
import { checkCommand } from './check.js';
import { steadfastProgram, withUsageErrors } from './program.js';

/**
 * The agent's own entry point. npm run build bundles it with what it imports into dist/agent.cjs
 * (scripts/build-agent.mjs): one file to read and compile instead of some hundred modules, and
 * none of the controller's code or dependencies. The loader (cli/agent-bundle.ts) compiles the
 * bundle after setting the agent's V8 flags and calls runAgentCli:
 *   - from the full CLI, `steadfast agent ...` (bin/steadfast.js);
 *   - standalone, as `steadfast-agent` (the agent-only package): the agent is the default
 *     command, so `steadfast-agent --once` is `steadfast agent --once`, and `steadfast-agent
 *     check` is the Slurm preflight, `steadfast check`, which GPU nodes run without the controller.
 */

function agentProgram(entry: AgentEntry): Command {
  const program = steadfastProgram(entry);
  const agent = withUsageErrors(agentCommand({ setV8Flags: true }));
  if (entry === 'steadfast') return program.addCommand(agent);
  return program.addCommand(agent, { isDefault: true }).addCommand(withUsageErrors(checkCommand()));
}

export function runAgentCli(argv: readonly string[], entry: AgentEntry): Promise<void> {
  return agentProgram(entry)
    .parseAsync([...argv])
    .then(
      () => undefined,
      (error: unknown) => {
        process.stderr.write(`${entry === 'steadfast' ? 'steadfast agent' : entry}: ${errorMessage(error)}\n`);
        process.exitCode = 1;
      },
    );
}
