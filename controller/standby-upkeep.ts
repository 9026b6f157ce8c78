import type { SafetyGates } from '../actuators/safety.js';
import type { StandbyPool } from '../actuators/standby-pool.js';
import type { AuditLog } from '../core/audit.js';
import type { ClusterBackend } from '../actuators/backend.js';
import { DryRunNodeValidator, validatorFromConfig, type AgentEndpoints } from '../actuators/node-validation.js';
import { ValidationUpkeep } from '../actuators/validation-upkeep.js';
import type { Config } from '../core/config.js';
import { CONTROLLER_IDENTITY } from '../core/credentials.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';

/** A rebooted node not back and validated within this long stays out, audited: a person looks at it. */
const REBOOT_GIVE_UP_MS = 2 * 3600_000;

/** How far ahead a maintenance window counts when sizing the standby pool. */
const MAINTENANCE_LOOKAHEAD_MS = 3600_000;

export interface StandbyUpkeepDeps {
  readonly gates: SafetyGates;
  readonly pool: StandbyPool;
  readonly audit: AuditLog;
  /** The backend's name, for the audit. */
  readonly backend: string;
  /** With validation on: standbys validated against their peers, rebooted nodes validated once back. */
  readonly validation?: ValidationUpkeep | undefined;
}

/** The validations the tick drives (actuators/validation-upkeep.ts); none with `validation.enabled` off. */
export function validationUpkeep(
  config: Pick<Config, 'validation'>,
  redis: Redis,
  keys: Keys,
  backend: ClusterBackend,
  parts: { agents: AgentEndpoints; audit: AuditLog; logger: Logger; pool: StandbyPool },
): ValidationUpkeep | undefined {
  const { validation } = config;
  if (!validation.enabled) return undefined;
  // A dry-run controller asks no agent; its rebooted nodes pass at once.
  const validator = backend.name === 'dry-run' ? new DryRunNodeValidator() : validatorFromConfig(validation, parts.agents, redis, keys);
  return new ValidationUpkeep({ ...parts, redis, keys, backend, validator, giveUpMs: REBOOT_GIVE_UP_MS, timeoutMs: validation.timeoutSeconds * 1000 });
}

/**
 * Replenishes the warm standby pool up to the P99 of the machines now in use (ByteRobust §6.2).
 * A held node is never provisioned as a standby (it is left out like one in use), nor is a node
 * in a maintenance window: it could not stand in for a failed one while the window is open, nor
 * one someone else drained or cordoned, or node-problem-detector reports a problem on. A
 * node of a running job that a window takes now or within the hour counts as one more to cover.
 */
export async function replenishStandbys(deps: StandbyUpkeepDeps, inUse: ReadonlySet<string>, now: number): Promise<void> {
  const { gates, pool, audit } = deps;
  // Others' drains and node conditions first: a node they hold out is no standby (foreign-holds.ts).
  await pool.scanForeign(audit, inUse, now);
  deps.validation?.tick(now);
  await gates.refreshPartitions();
  const open = gates.inMaintenance(now);
  const unavailable = new Set([...inUse, ...(await gates.holds(now)).keys(), ...open.keys()]);
  const soon = gates.inMaintenance(now + MAINTENANCE_LOOKAHEAD_MS);
  const leaving = [...inUse].filter((node) => soon.has(node) || open.has(node)).length;
  const started = await pool.reconcile(inUse.size, unavailable, now, leaving);
  for (const node of started) {
    await audit.append(
      {
        type: 'action',
        ref: `standby-${node}-${now}`,
        node,
        summary: `standby ${node}: provisioning (held by ${deps.backend}; waiting for its agent's self-check)`,
        data: { verb: 'provision_standby', node, state: 'done' },
        actor: CONTROLLER_IDENTITY,
      },
      `standby:${node}:${now}`,
    );
  }
}
