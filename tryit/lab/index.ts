/**
 * The lab: a real Slurm cluster on one machine, one network namespace per node
 * (docs/lab.md). `up` makes it, `status` reads it back, `down` removes every trace.
 * ProtectedLab puts steadfast around it (controller, agents in the nodes, Prometheus,
 * Alertmanager) with the PyTorch example registered, and scenarios.ts breaks it.
 */
export { labUp, type LabUpProgress } from './up.js';
export { labDown, assertClean, type LabDownReport } from './down.js';
export { labStatus, formatLabStatus, type LabStatus } from './status.js';
export { labLayout, labOptionsSchema, type LabLayout, type LabOptions, type LabOptionsInput } from './layout.js';
export { LabError } from './command.js';
export { slurmEnv, sinfoNodes, jobIds } from './slurm.js';
export { ProtectedLab } from './protected.js';
export { LAB_AGENT_PORT, type ProtectedLabOptions } from './protected-options.js';
export { FAIL_SLOW_LAB, runFailSlow, type FailSlowReport, type IterationSeconds } from './scenario-fail-slow.js';
export {
  SCENARIO_NAMES,
  SCENARIOS,
  OWN_LAB,
  scenarioLabs,
  runScenarios,
  runMachineFault,
  runBadCode,
  runCrash,
  runHang,
  waitForTraining,
  type ScenarioName,
  type ScenarioReport,
  type TimelineStep,
} from './scenarios.js';
