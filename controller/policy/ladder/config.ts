import { DEFAULT_RECOVERY, type RecoveryConfig } from '../../../core/config.js';

/**
 * The ladder's thresholds, in milliseconds, from the controller config's `recovery:` section
 * (core/config.ts, where each default cites its source), and the paper sections the steps cite.
 */

export interface LadderConfig {
  /** Network alerts on one node, within `networkAlertWindowMs`, that get it evicted. */
  readonly networkAlertsBeforeEviction: number;
  readonly networkAlertWindowMs: number;
  /**
   * A crash this soon after an eviction that repeats the evicted failure, or strikes a standby
   * that replaced an evicted node, counts as "the job crashed again after the eviction".
   */
  readonly crashAfterEvictionWindowMs: number;
  /** Restarts one incident may use before a human is paged. */
  readonly retryLimit: number;
  /** Wait before an incident's second restart; doubles for each further one, up to the cap. */
  readonly retryInitialBackoffMs: number;
  readonly retryMaxBackoffMs: number;
  /** How long a non-urgent code update may wait for a failure to ride on. */
  readonly lazyUpdateWindowMs: number;
  /** Evictions of one node, within `exclusionWindowMs`, that quarantine it. */
  readonly quarantineAfterEvictions: number;
  readonly exclusionWindowMs: number;
  /** How many signal ids the state remembers to ignore a fault reported twice. */
  readonly rememberedSignals: number;
}

const SECOND = 1000;

/** How many signal ids the state remembers: a bound on state size, not a policy. */
const REMEMBERED_SIGNALS = 256;

export function ladderConfig(recovery: RecoveryConfig): LadderConfig {
  return {
    networkAlertsBeforeEviction: recovery.networkAlertsBeforeEviction,
    networkAlertWindowMs: recovery.networkAlertWindowSeconds * SECOND,
    crashAfterEvictionWindowMs: recovery.crashAfterEvictionWindowSeconds * SECOND,
    retryLimit: recovery.retryLimit,
    retryInitialBackoffMs: recovery.retryInitialBackoffSeconds * SECOND,
    retryMaxBackoffMs: recovery.retryMaxBackoffSeconds * SECOND,
    lazyUpdateWindowMs: recovery.lazyUpdateWindowSeconds * SECOND,
    quarantineAfterEvictions: recovery.quarantineAfterEvictions,
    exclusionWindowMs: recovery.quarantineWindowSeconds * SECOND,
    rememberedSignals: REMEMBERED_SIGNALS,
  };
}

export const DEFAULT_LADDER_CONFIG: LadderConfig = ladderConfig(DEFAULT_RECOVERY);

/** The paper sections the ladder's steps cite, written once. */
export const CITE = {
  machine: 'ByteRobust §4.1 (high-confidence machine events: stop, evict, skip stop-time checks); DeadPool Table II (node replacement)',
  network: 'ByteRobust §4.1 (network alerts tolerated, e.g. twice within 5 minutes, before eviction)',
  userCode: 'ByteRobust §4.1 step ② (user-space errors traceable to code trigger a rollback)',
  diagnose: 'ByteRobust §4.1 step ③ and §4.2 Diagnose (crash or abnormal metrics without a clear culprit)',
  diagnosedEvict: 'ByteRobust §4.2 step ④ (suspects found by diagnosis are evicted)',
  reattempt: 'ByteRobust §4.2 step ⑤ (all tests pass: assume a transient fault, restart in place)',
  rollbackAfterReattempt: 'ByteRobust §4.2 step ⑥ (restarting did not resolve it: roll the code back)',
  rollbackAfterEviction: 'ByteRobust §4.2 step ⑦ (training crashed again after eviction: roll the code back)',
  unrelatedAfterEviction:
    'ByteRobust §4.1 step ③ and §4.2 Diagnose (a crash after an eviction that neither repeats its failure nor strikes a replacement is a new incident; step ⑦ is for crashing again)',
  rollbackAfterUpdate: 'ByteRobust §6.1 and §8.1.2 (hot updates are applied and rolled back automatically)',
  diagnoseAfterEviction: 'ByteRobust §4.1 (restarted training fails again after eviction: enter the stop-time checks)',
  replay: 'ByteRobust §4.2 step ⑧ (restarts fail: dual-phase replay, Algorithm 1)',
  replayEvict: 'ByteRobust §4.2 step ⑨ (the machine replay isolates is evicted)',
  rollbackOwners: 'ByteRobust §4.2 Rollback (relevant teams examine their code while training progresses)',
  human: 'DeadPool Table II and §V-C (software bugs and unknown failures go to an external fallback)',
  stacks: 'ByteRobust §4.1 and §5.1 (performance anomalies trigger aggregation analysis)',
  transient: 'DeadPool Table II and §VI-B (transient faults: local recovery first, no topology change)',
  standby: 'ByteRobust §6.2 (warm standbys replace evicted machines)',
  hotSwap:
    "DeadPool §V-C, §VI (hot swap of a spare into the running job, state rebuilt from per-step in-memory replicas); ByteRobust §6.3 (every-step in-memory checkpoints with backups outside the rank's parallel groups)",
  hotSwapFallback:
    'DeadPool §V-C, §VI (a hot swap that cannot finish falls back to the restart); ByteRobust §4.1 and §6.2 (stop, evict, relaunch on warm standbys)',
  hotSwapEpoch:
    'DeadPool Table II and §VI-B (transient faults: recover in place, no topology change); ByteRobust §6.3 (state from every-step in-memory checkpoints)',
  gpuReset: "NVIDIA's Xid catalogue (the remedy is a GPU reset); ByteRobust §4.1 (stop the job before acting on a machine)",
  hotUpdate: 'ByteRobust §6.1 (urgent updates now; others at the next failure or when 24 h expire)',
  retry: '504-GPU report (auto-retry chains)',
  refused: "the operator's safety gates (pause, the job's recovery policy, the eviction budget) have the last word over the ladder",
  exclusion: '504-GPU report (node exclusion history; the top three nodes caused over half of all exclusions)',
} as const;
