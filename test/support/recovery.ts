import { createRecoveryProcessor, type RecoveryActuatorDeps } from '../../actuators/recovery/index.js';
import { SafetyGates } from '../../actuators/safety.js';
import type { ClusterBackend } from '../../actuators/backend.js';
import type { JobStore } from '../../controller/job-store.js';
import { AuditLog } from '../../core/audit.js';
import { DEFAULT_RECOVERY } from '../../core/config.js';
import { silentLogger } from '../../core/log.js';
import { TEST_LAUNCHERS } from './controller.js';
import type { testRedis } from './redis.js';

/**
 * The recovery actuator alone, on a test Redis: a generous drain budget, the test launchers, the
 * shipped quarantine policy, no ladder behind it (feedback goes nowhere) unless `extra` says.
 */
export function testRecoveryProcessor(
  store: ReturnType<typeof testRedis>,
  parts: { readonly backend: ClusterBackend; readonly jobs: JobStore; readonly audit?: AuditLog },
  extra: Partial<RecoveryActuatorDeps> = {},
): ReturnType<typeof createRecoveryProcessor> {
  return createRecoveryProcessor({
    redis: store.redis,
    keys: store.keys,
    audit: parts.audit ?? new AuditLog(store.redis, store.keys),
    backend: parts.backend,
    gates: new SafetyGates(store.redis, store.keys, { maxPerWindow: 10, windowSeconds: 600 }, 30),
    jobs: parts.jobs,
    launchers: TEST_LAUNCHERS,
    logger: silentLogger(),
    feedback: async () => undefined,
    quarantine: { afterEvictions: DEFAULT_RECOVERY.quarantineAfterEvictions, windowMs: DEFAULT_RECOVERY.quarantineWindowSeconds * 1000 },
    ...extra,
  });
}
