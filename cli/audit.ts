import { Command } from 'commander';
import { AuditLog, auditQuerySchema, type AuditEntry } from '../core/audit.js';
import { describeIdentity } from '../core/credentials.js';
import { loadConfig } from '../core/config.js';
import { Keys, workerConnection } from '../core/redis.js';
import { parseOrThrow } from '../core/validate.js';
import { runCommand } from './common.js';

export function formatAuditEntry(entry: AuditEntry): string {
  return `${entry.time}  ${entry.type.padEnd(8)} ${(entry.node ?? '-').padEnd(12)} ${entry.summary}${entry.actor ? `  [by ${describeIdentity(entry.actor)}]` : ''}`;
}

export function auditCommand(): Command {
  return new Command('audit')
    .description('Print the audit trail: every signal, decision and action with its reason, oldest first.')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('-n, --limit <count>', 'newest entries to show', '50')
    .option('--type <type>', 'only signal, decision, action or access (refused requests) entries')
    .option('--node <node>', 'only entries about this node')
    .option('--json', 'one JSON object per line')
    .action(async (options: { config?: string; limit: string; type?: string; node?: string; json?: boolean }) => {
      await runCommand(async () => {
        const config = loadConfig({ file: options.config });
        const query = parseOrThrow(auditQuerySchema, { limit: options.limit, type: options.type, node: options.node }, 'audit options');
        const redis = workerConnection(config.redis, { maxRetriesPerRequest: 1, enableOfflineQueue: true });
        try {
          const entries = await new AuditLog(redis, new Keys(config.redis.prefix)).read(query);
          for (const entry of entries) process.stdout.write(`${options.json ? JSON.stringify(entry) : formatAuditEntry(entry)}\n`);
        } finally {
          redis.disconnect();
        }
      });
    });
}
