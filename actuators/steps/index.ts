import type { StepVerb } from '../../core/steps.js';
import { handToAnalysis } from './analysis.js';
import type { StepActuator } from './context.js';
import { drain } from './drain.js';
import { evict } from './evict.js';
import { handOff } from './hand-off.js';
import { hotSwap } from './hot-swap.js';
import { pageHuman } from './page-human.js';
import { quarantine } from './quarantine.js';
import { reboot } from './reboot.js';
import { recordOnly } from './record.js';
import { resetGpu } from './reset-gpu.js';
import { restart } from './restart.js';
import { stop } from './stop.js';
import { setCodeVersion } from './update.js';

/**
 * The actuator of every verb of core/steps.ts, in one list: the step processor looks a step's
 * verb up here. A verb without an actuator does not compile.
 */
export const STEP_ACTUATORS: Readonly<Record<StepVerb, StepActuator>> = {
  stop,
  evict,
  hot_swap: hotSwap,
  drain,
  reset_gpu: resetGpu,
  reboot,
  hand_off: handOff,
  restart,
  reattempt: restart,
  rollback: setCodeVersion,
  apply_update: setCodeVersion,
  run_diagnostics: handToAnalysis('run_diagnostics'),
  run_replay: handToAnalysis('run_replay'),
  analyze_stacks: handToAnalysis('analyze_stacks'),
  quarantine,
  page_human: pageHuman,
  notify: recordOnly,
  tolerate: recordOnly,
};
