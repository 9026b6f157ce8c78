import type { SafetyGates } from '../actuators/safety.js';
import type { StandbyPool } from '../actuators/standby-pool.js';
import type { AuditLog } from '../core/audit.js';
import { CONTROLLER_IDENTITY } from '../core/credentials.js';

/** How far ahead a maintenance window counts when sizing the standby pool. */
const MAINTENANCE_LOOKAHEAD_MS = 3600_000;

export interface StandbyUpkeepDeps {
  readonly gates: SafetyGates;
  readonly pool: StandbyPool;
  readonly audit: AuditLog;
  /** The backend's name, for the audit. */
  readonly backend: string;
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
