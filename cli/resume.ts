import { Command } from 'commander';
import { AuditLog } from '../core/audit.js';
import { loadConfig } from '../core/config.js';
import { nodeNameSchema } from '../core/names.js';
import { Keys, workerConnection } from '../core/redis.js';
import { retentionFromBudget } from '../core/retention.js';
import { parseOrThrow } from '../core/validate.js';
import { createBackend } from '../actuators/backend-from-config.js';
import { runCommand } from './common.js';

/**
 * `steadfast resume NODE`: an operator returns a repaired node to service. Besides the
 * scheduler's resume it clears steadfast's claim on the node, so the next fault on it is a new
 * decision rather than a report joining the old one.
 */
export function resumeCommand(): Command {
  return new Command('resume')
    .description('Return a drained node to service through the configured backend and forget steadfast\'s open decision for it.')
    .argument('<node>', 'node name as the scheduler knows it')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('-r, --reason <text>', 'why, recorded in the audit trail', 'repaired by operator')
    .action(async (nodeArgument: string, options: { config?: string; reason: string }) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, nodeArgument, 'node');
        const config = loadConfig({ file: options.config });
        const redis = workerConnection(config.redis, { maxRetriesPerRequest: 1 });
        try {
          const keys = new Keys(config.redis.prefix);
          const backend = createBackend(config, redis, keys);
          const before = await backend.nodeState(node);
          if (!before.exists) throw new Error(`${backend.name} does not know node ${node}`);
          await backend.resume(node);
          const claim = await redis.get(keys.nodeDrainClaim(node));
          await redis.del(keys.nodeDrainClaim(node));
          // An operator returning a node vouches for it: it leaves quarantine too.
          await redis.srem(keys.quarantine, node);
          await new AuditLog(redis, keys, retentionFromBudget(config.redis.retentionBudgetMB, config.controller.auditMaxLength).auditEntries).append(
            {
              type: 'action',
              ref: claim ?? `resume-${node}`,
              node,
              summary: `resume ${node}: done (${options.reason}; was ${before.raw})`,
              data: { verb: 'resume', node, state: 'done', detail: options.reason, backend: backend.name, previous: before.raw, decisionId: claim },
            },
            `resume:${node}:${Date.now()}`,
          );
          process.stdout.write(`${node}: resumed through ${backend.name} (was ${before.raw})${claim ? `; decision ${claim} closed` : ''}\n`);
        } finally {
          redis.disconnect();
        }
      });
    });
}
