/**
 * The recovery ladder of one training job: a pure state machine. Given the job's recovery state
 * and one event (a classified fault, the outcome of a restart, a test result, a code update, or
 * time passing) it returns the next state and the steps the actuators should carry out. No I/O
 * and no clock: every event carries its own time, in Unix epoch milliseconds. The controller keeps
 * the state per job (a plain JSON object, `ladderStateSchema` validates it when read back).
 *
 * The rungs are ByteRobust's (000, §4.1 real-time checks, §4.2 hierarchical stop-time checks):
 * evict on a high-confidence machine signal, otherwise stop and diagnose; reattempt in place when
 * diagnosis finds nothing; roll the code back when a restart fails; dual-phase replay when the
 * rollback fails; a human after that (DeadPool's "external fallback", 003 Table II). Code updates
 * are hot updates (§6.1), restarts form a bounded retry chain and evicted nodes an exclusion
 * history (504-GPU report, 002).
 *
 * Read it in this order: advance.ts (the entry points), transitions.ts (where each event leads),
 * rungs.ts (what each rung does), retry-chain.ts (restarts and versions), evidence.ts (whether
 * an eviction helped: failure signatures and replacements), context.ts (shared bookkeeping),
 * state.ts (the stored state), config.ts (thresholds and citations).
 */

export { advance, faultEventFromSignal } from './advance.js';
export { CITE, DEFAULT_LADDER_CONFIG, ladderConfig, type LadderConfig } from './config.js';
export { failureSignature } from './evidence.js';
export {
  LADDER_PHASES,
  LADDER_RUNGS,
  VERSION_VERDICTS,
  initialLadderState,
  ladderStateSchema,
  type CodeVersion,
  type EvictionRecord,
  type Incident,
  type LadderPhase,
  type LadderRung,
  type LadderState,
  type LadderTransition,
  type Replacement,
  type VersionVerdict,
} from './state.js';
