import { Command } from 'commander';
import { nodeNameSchema } from '../core/names.js';
import { parseOrThrow } from '../core/validate.js';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { parsePositiveInt, printable, printableJson, runCommand } from './common.js';

interface HoldView {
  readonly node: string;
  readonly reason: string;
  readonly since: string;
  readonly until: string;
}

/**
 * `steadfast hold NODE`, `steadfast release NODE` and `steadfast holds`: a node under maintenance.
 * Signals about a held node are still recorded; no actuator drains it, evicts it or takes it as
 * a standby until it is released or the hold expires.
 */
export function holdCommands(): Command[] {
  const hold = withControllerOptions(
    new Command('hold').description('Hold a node for maintenance: steadfast records its signals but never acts on it until released or expired.'),
  )
    .argument('<node>', 'node name as the scheduler knows it')
    .requiredOption('-r, --reason <text>', 'why, shown in every refusal and in the audit')
    .option('--for <seconds>', "how long the hold lasts (default: the controller's safety.holdDefaultSeconds)", parsePositiveInt)
    .option('--until <time>', 'when the hold ends, ISO 8601 (e.g. 2026-11-21T18:00:00Z)')
    .action(async (nodeArgument: string, options: Record<string, unknown>) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, nodeArgument, 'node');
        const body = {
          reason: options.reason,
          ...(options.for === undefined ? {} : { durationSeconds: options.for }),
          ...(options.until === undefined ? {} : { until: options.until }),
        };
        const answer = await callController<HoldView>(controllerConnection(options), 'PUT', `/api/v1/holds/${node}`, body);
        process.stdout.write(`${printable(`${answer.node}: held until ${answer.until} (${answer.reason})`)}\n`);
      });
    });
  const release = withControllerOptions(new Command('release').description("Release a node's hold: steadfast may act on it again."))
    .argument('<node>', 'node name as the scheduler knows it')
    .action(async (nodeArgument: string, options: Record<string, unknown>) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, nodeArgument, 'node');
        await callController(controllerConnection(options), 'DELETE', `/api/v1/holds/${node}`);
        process.stdout.write(`${node}: released\n`);
      });
    });
  const list = withControllerOptions(new Command('holds').description('List the nodes held for maintenance, with reason and end.'))
    .option('--json', 'print {"holds": [...]} as JSON')
    .action(async (options: Record<string, unknown>) => {
      await runCommand(async () => {
        const answer = await callController<{ holds: HoldView[] }>(controllerConnection(options), 'GET', '/api/v1/holds');
        if (options.json) {
          process.stdout.write(`${printableJson(answer)}\n`);
          return;
        }
        for (const held of answer.holds) process.stdout.write(`${printable(`${held.node.padEnd(24)} until ${held.until}  ${held.reason}`)}\n`);
      });
    });
  return [hold, release, list];
}
