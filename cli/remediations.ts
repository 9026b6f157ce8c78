import { Command } from 'commander';
import { nodeNameSchema } from '../core/names.js';
import type { RemediationEntry } from '../core/remedy.js';
import { parseOrThrow } from '../core/validate.js';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { parsePositiveInt, printable, printableJson, runCommand } from './common.js';

interface RemediationsView {
  readonly node: string;
  readonly held: { readonly reason: string; readonly until: string } | null;
  readonly remediations: RemediationEntry[];
}

/**
 * `steadfast remediations NODE`: what steadfast did to a node, newest first — GPU resets,
 * drains, reboots, hand-offs — with how each ended, its decision and who caused it.
 */
export function remediationsCommand(): Command {
  return withControllerOptions(
    new Command('remediations').description("Show a node's remediation history: GPU resets, drains, reboots and hand-offs, newest first."),
  )
    .argument('<node>', 'node name as the scheduler knows it')
    .option('-n, --limit <count>', 'entries to show', parsePositiveInt, 50)
    .option('--json', "print the controller's answer as JSON")
    .action(async (nodeArgument: string, options: Record<string, unknown>) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, nodeArgument, 'node');
        const answer = await callController<RemediationsView>(
          controllerConnection(options),
          'GET',
          `/api/v1/nodes/${node}/remediations?limit=${String(options.limit)}`,
        );
        if (options.json) {
          process.stdout.write(`${printableJson(answer)}\n`);
          return;
        }
        if (answer.held) process.stdout.write(`${printable(`${node}: held until ${answer.held.until} (${answer.held.reason})`)}\n`);
        if (answer.remediations.length === 0) process.stdout.write(`${node}: no remediations recorded\n`);
        for (const entry of answer.remediations) {
          const actor = entry.actor ? ` by ${entry.actor.role}${entry.actor.node ? ` ${entry.actor.node}` : ''}` : '';
          const gpu = entry.gpu ? ` GPU ${entry.gpu}` : '';
          process.stdout.write(
            `${printable(`${entry.time}  ${`${entry.action}${gpu}`.padEnd(26)} ${entry.outcome.padEnd(9)} ${entry.decisionId}${actor}: ${entry.detail}`)}\n`,
          );
        }
      });
    });
}
