import { z } from 'zod';

// Numbers are coerced so that environment overrides, which are always strings, validate too.
const int = () => z.coerce.number<unknown>().int();

/**
 * The recovery ladder's thresholds (controller/policy/ladder/), and the cross-job quarantine the recovery
 * actuator keeps. Every default cites where it comes from.
 */
export const recoverySchema = z
  .object({
    // ByteRobust §4.1: network alerts are tolerated "twice within 5 minutes empirically" before
    // eviction, since NIC and switch flaps often heal by themselves. Evict on the second.
    /** Network alerts on one node, within networkAlertWindowSeconds, that get it evicted. */
    networkAlertsBeforeEviction: int().min(1).max(100).default(2),
    networkAlertWindowSeconds: int().min(1).max(86_400).default(300),
    // ByteRobust §4.2 step ⑦ gives no window. 30 min is our choice: a standby-backed restart is
    // back within minutes, and interruptions come every ~2.78 h at scale (§6.1, citing Llama 3.1).
    /** A crash this soon after an eviction counts as "the job crashed again after the eviction": roll back. */
    crashAfterEvictionWindowSeconds: int().min(0).max(86_400).default(1800),
    // 504-GPU report: 73 auto-retry attempts over 12 chains, about 6 per chain, with a 33.3 %
    // success rate against 12.5 % for manual restarts. Six restarts cover the full ladder
    // (evict, reattempt, rollback, evict after replay) with room for a second eviction.
    /** Restarts one incident may use before a person is paged. */
    retryLimit: int().min(1).max(100).default(6),
    // Our choice: the first restart is immediate; later ones wait 30 s, 60 s, ... up to 10 min
    // so a failure that repeats at once (storage down, a bad image) does not spin the chain.
    /** Wait before an incident's second restart; doubles for each further one, up to retryMaxBackoffSeconds. */
    retryInitialBackoffSeconds: int().min(0).max(86_400).default(30),
    retryMaxBackoffSeconds: int().min(0).max(86_400).default(600),
    // ByteRobust §6.1: a non-applied non-critical update is performed when its 24 h window expires.
    /** How long a non-urgent code update may wait for a failure to ride on. */
    lazyUpdateWindowSeconds: int()
      .min(0)
      .max(30 * 86_400)
      .default(86_400),
    // 504-GPU report: the top three nodes caused over half of all exclusions; a node excluded
    // three times in a week is a maintenance case, not a pool member.
    /** Evictions of one node, within quarantineWindowSeconds, that quarantine it (per job, and across jobs). */
    quarantineAfterEvictions: int().min(1).max(100).default(3),
    quarantineWindowSeconds: int()
      .min(60)
      .max(365 * 86_400)
      .default(7 * 86_400),
  })
  .strict()
  .refine((recovery) => recovery.retryMaxBackoffSeconds >= recovery.retryInitialBackoffSeconds, {
    message: 'must be at least retryInitialBackoffSeconds',
    path: ['retryMaxBackoffSeconds'],
  });

export type RecoveryConfig = z.output<typeof recoverySchema>;

/** The recovery section with every default, for code that runs without a config file (tests, the ETTR simulation). */
export const DEFAULT_RECOVERY: RecoveryConfig = recoverySchema.parse({});
