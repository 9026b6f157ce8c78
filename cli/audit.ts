import { Command } from 'commander';
import { auditQuerySchema, type AuditEntry } from '../core/audit.js';
import { describeIdentity } from '../core/credentials.js';
import { parseOrThrow } from '../core/validate.js';
import { callController, controllerConnection, withControllerOptions } from './controller-client.js';
import { printable, printableJson, runCommand } from './common.js';

export function formatAuditEntry(entry: AuditEntry): string {
  return printable(
    `${entry.time}  ${entry.type.padEnd(8)} ${(entry.node ?? '-').padEnd(12)} ${entry.summary}${entry.actor ? `  [by ${describeIdentity(entry.actor)}]` : ''}`,
  );
}

/** `steadfast audit`: the audit trail, read over the controller's API (GET /api/v1/audit). */
export function auditCommand(): Command {
  return withControllerOptions(new Command('audit').description('Print the audit trail: every signal, decision and action with its reason, oldest first.'))
    .option('-n, --limit <count>', 'newest entries to show', '50')
    .option('--type <type>', 'only signal, decision, action or access (refused requests) entries')
    .option('--node <node>', 'only entries about this node')
    .option('--json', 'one JSON object per line')
    .action(async (options: Record<string, unknown>) => {
      await runCommand(async () => {
        // Checked here too, so a typo is named before any request leaves.
        const query = parseOrThrow(auditQuerySchema, { limit: options.limit, type: options.type, node: options.node }, 'audit options');
        const params = new URLSearchParams(Object.entries(query).flatMap(([key, value]) => (value === undefined ? [] : [[key, String(value)]])));
        const answer = await callController<{ entries: AuditEntry[] }>(controllerConnection(options), 'GET', `/api/v1/audit?${params.toString()}`);
        for (const entry of answer.entries) process.stdout.write(`${options.json ? printableJson(entry) : formatAuditEntry(entry)}\n`);
      });
    });
}
