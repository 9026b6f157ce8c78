/**
 * The recovery actuator: carries out the steps of a job's ladder transitions (controller/ladder/)
 * as they arrive on the recovery queue. processor.ts runs a transition step by step; stop.ts,
 * evict.ts and restart.ts are the steps that touch the cluster; context.ts says what the actuator needs.
 */
export { createRecoveryProcessor } from './processor.js';
export type { QuarantinePolicy, RecoveryActuatorDeps, RecoveryJobs, RestartWatch } from './context.js';
