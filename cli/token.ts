import { Command, InvalidArgumentError } from 'commander';
import { readSecret } from '../core/auth-config.js';
import { AGENT_SECRET_MIN_LENGTH, agentTokenFor } from '../core/credentials.js';
import { InputError } from '../core/errors.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import { runCommand } from './common.js';

function parseNode(value: string): string {
  if (!NODE_NAME_PATTERN.test(value))
    throw new InvalidArgumentError('must be a node name: 1-63 letters, digits, ".", "_" or "-", starting with a letter or digit');
  return value;
}

/**
 * `steadfast token agent`: prints each node's agent token for provisioning. The token is derived
 * from the controller's agent secret and the node name (core/credentials.ts), so the controller
 * keeps no list of tokens and a token works for its own node only.
 */
export function tokenCommand(): Command {
  const command = new Command('token').description('Print credentials for provisioning (see docs/security.md).');
  command
    .command('agent')
    .description("Print a node's agent token (NODE.HEX): the file its agent's --controller.token-file names.")
    .requiredOption('--node <name...>', 'the node(s) to print a token for, one line each', (value: string, previous: string[] | undefined) => [
      ...(previous ?? []),
      parseNode(value),
    ])
    .requiredOption('--secret-file <file>', "the controller's agent secret (controller.auth.agentSecretFile)")
    .action(async (options: { node: string[]; secretFile: string }) => {
      await runCommand(async () => {
        const secret = readSecret(undefined, options.secretFile, '--secret-file', AGENT_SECRET_MIN_LENGTH);
        if (secret === undefined) throw new InputError('--secret-file: no secret read', '--secret-file');
        process.stdout.write(options.node.map((node) => `${agentTokenFor(secret, node)}\n`).join(''));
      });
    });
  return command;
}
