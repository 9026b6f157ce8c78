import type { Keys, Redis } from '../../core/redis.js';
import { recordStep, type Halt, type StepAt, type StepRecording } from './context.js';

/** The quarantine step: the nodes leave every pool (never again a standby) until an operator returns them (504-GPU report). */
export async function quarantine(deps: StepRecording & { readonly redis: Redis; readonly keys: Keys; readonly dryRun: boolean }, at: StepAt): Promise<Halt> {
  const nodes = at.step.nodes ?? [];
  if (nodes.length > 0 && !deps.dryRun) await deps.redis.sadd(deps.keys.quarantine, ...nodes);
  await recordStep(deps, at, 'done', `quarantined ${nodes.join(',')}`);
  return undefined;
}
