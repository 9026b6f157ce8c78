import { Command } from 'commander';
import { AuditLog } from '../core/audit.js';
import { loadConfig } from '../core/config.js';
import { errorMessage } from '../core/errors.js';
import { Locks } from '../core/locks.js';
import { nodeNameSchema } from '../core/names.js';
import { Keys, workerConnection } from '../core/redis.js';
import { retentionFromBudget } from '../core/retention.js';
import { parseOrThrow } from '../core/validate.js';
import { createBackend } from '../actuators/backend-from-config.js';
import { OwnDrains } from '../actuators/own-drains.js';
import { returnToService } from '../actuators/return-to-service.js';
import { AgentDirectory } from '../controller/agents.js';
import { closeFaultsOnResume } from '../controller/policy/node-resumes.js';
import { selfCheck } from '../agent/standby-reporter.js';
import { validationFailure, validatorFromConfig } from '../actuators/node-validation.js';
import { printable, runCommand } from './common.js';

/** How long the node's agent may take to answer the check's scrape. */
const CHECK_TIMEOUT_MS = 10_000;

/**
 * The node's own checks before it goes back: one scrape of its agent (at the configured agent
 * URL, for a node the backend knows), judged as a warm standby judges itself — every collector
 * working, every GPU present, no fatal Xid since the node booted. Says why not, or undefined.
 */
async function failedChecks(agents: AgentDirectory, node: string): Promise<string | undefined> {
  const url = (await agents.urls([node])).get(node);
  if (url === undefined) return `no agent URL for ${node}`;
  let text: string;
  try {
    const response = await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(CHECK_TIMEOUT_MS) });
    if (!response.ok) return `its agent at ${url} answered HTTP ${response.status}`;
    text = await response.text();
  } catch (error) {
    return `its agent at ${url} could not be reached (${errorMessage(error)})`;
  }
  const verdict = selfCheck(text);
  return verdict.ok ? undefined : verdict.detail;
}

/**
 * `steadfast resume NODE`: an operator returns a repaired node to service. The node must first
 * pass its own checks (failedChecks), and be out of service by steadfast alone: a drain or
 * cordon someone else made is theirs to lift (return-to-service.ts). `--force` skips both. Besides the scheduler's resume it
 * closes every fault reported on the node until now and clears steadfast's claim on it
 * (controller/policy/node-resumes.ts), so the next fault on it is a new decision rather than a
 * report joining the old one, and a late or repeated report of an old fault acts no more. It
 * works against Redis and the backend directly, with the controller's config, so it also serves
 * while the controller is down.
 */
export function resumeCommand(): Command {
  return new Command('resume')
    .description("Return a drained node to service through the configured backend, once its agent's checks pass, and forget steadfast's open decision for it.")
    .argument('<node>', 'node name as the scheduler knows it')
    .option('-c, --config <file>', 'YAML config file', process.env.STEADFAST_CONFIG)
    .option('-r, --reason <text>', 'why, recorded in the audit trail', 'repaired by operator')
    .option('--force', "resume without the node's checks, lifting someone else's drain too (recorded as forced in the audit)", false)
    .action(async (nodeArgument: string, options: { config?: string; reason: string; force: boolean }) => {
      await runCommand(async () => {
        const node = parseOrThrow(nodeNameSchema, nodeArgument, 'node');
        const config = loadConfig({ file: options.config });
        const redis = workerConnection(config.redis, { maxRetriesPerRequest: 1 });
        try {
          const keys = new Keys(config.redis.prefix);
          const backend = createBackend(config, redis, keys);
          const audit = new AuditLog(redis, keys, retentionFromBudget(config.redis.retentionBudgetMB, config.controller.auditMaxLength).auditEntries);
          const before = await backend.nodeState(node);
          if (!before.exists) throw new Error(`${backend.name} does not know node ${node}`);
          const claim = await new Locks(redis, keys).nodeClaim(node);
          const record = (state: 'done' | 'refused', summary: string, detail: string) =>
            audit.append(
              {
                type: 'action',
                ref: claim ?? `resume-${node}`,
                node,
                summary,
                data: { verb: 'resume', node, state, detail, backend: backend.name, previous: before.raw, decisionId: claim, forced: options.force },
                actor: { role: 'operator' },
              },
              `resume:${node}:${Date.now()}`,
            );
          if (!options.force && before.foreign !== undefined) {
            // Someone else's drain (an administrator, another tool, Slurm's health check): theirs to lift.
            await record('refused', `resume ${node}: refused (out of service by someone else: "${before.foreign}"; ${options.reason})`, before.foreign);
            throw new Error(
              `${node} is out of service by someone else ("${before.foreign}"), not only by steadfast; it stays as it is. Give --force to lift their drain too.`,
            );
          }
          const agents = new AgentDirectory(config.agents, async (name) => (await backend.nodeState(name)).exists);
          if (!options.force) {
            const failed = await failedChecks(agents, node);
            if (failed !== undefined) {
              await record('refused', `resume ${node}: refused (its checks failed: ${failed}; ${options.reason})`, failed);
              throw new Error(`${node} failed its checks and stays out of service: ${failed}. Repair it, or give --force to resume it anyway.`);
            }
          }
          // With validation on, the node also passes its burn (and DCGM) before it goes back; the gate is this one call.
          const validation =
            options.force || !config.validation.enabled ? undefined : await validatorFromConfig(config.validation, agents, redis, keys).validate(node);
          if (validation !== undefined && !validation.ok) {
            const why = validationFailure(validation);
            await record('refused', `resume ${node}: refused (${why}; ${options.reason})`, why);
            throw new Error(`${node} stays out of service: ${why}. Repair it, or give --force to resume it anyway.`);
          }
          const outcome = await returnToService({ backend, ownDrains: new OwnDrains(redis, keys) }, node, { force: options.force });
          if (!outcome.returned) throw new Error(outcome.why);
          const lifted = outcome.liftedForeign === undefined ? '' : `; lifted someone else's drain ("${outcome.liftedForeign}") with --force`;
          const closed = (await closeFaultsOnResume(redis, keys, node, Date.now())) ?? claim;
          // An operator returning a node vouches for it: it leaves quarantine too.
          await redis.srem(keys.quarantine, node);
          await record(
            'done',
            `resume ${node}: done (${options.reason}; was ${before.raw}${options.force ? '; without its checks (--force)' : ''}${lifted})`,
            options.reason,
          );
          process.stdout.write(
            `${printable(`${node}: resumed through ${backend.name} (was ${before.raw})${options.force ? ', without its checks' : ', its checks passed'}${validation === undefined ? '' : `; validated in ${validation.seconds.toFixed(1)} s (${validation.detail})`}${lifted}${closed ? `; decision ${closed} closed` : ''}`)}\n`,
          );
        } finally {
          redis.disconnect();
        }
      });
    });
}
