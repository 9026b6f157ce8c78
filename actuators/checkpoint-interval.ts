import { InputError } from '../core/errors.js';

/**
 * Checkpoint interval that minimises expected lost work, as the 504-GPU report (002) cites:
 * Young's first-order optimum τ = √(2·C·M) and Daly's higher-order refinement, for a checkpoint
 * that takes C seconds and a mean time between failures of M seconds.
 */

export interface CheckpointInterval {
  readonly youngSeconds: number;
  readonly dalySeconds: number;
  readonly mtbfSeconds: number;
  readonly checkpointSeconds: number;
  /** Expected share of wall time spent checkpointing or redoing lost work at Daly's interval (first order). */
  readonly overheadFraction: number;
}

export function optimalCheckpointInterval(mtbfHours: number, checkpointSeconds: number): CheckpointInterval {
  if (!(mtbfHours > 0)) throw new InputError('MTBF must be a positive number of hours', 'mtbfHours');
  if (!(checkpointSeconds > 0)) throw new InputError('checkpoint time must be a positive number of seconds', 'checkpointSeconds');
  const mtbfSeconds = mtbfHours * 3600;
  const c = checkpointSeconds;
  const youngSeconds = Math.sqrt(2 * c * mtbfSeconds);
  // Daly (2006): valid while C < 2M; beyond it the best one can do is checkpoint every M.
  const ratio = c / (2 * mtbfSeconds);
  const dalySeconds = c < 2 * mtbfSeconds ? Math.sqrt(2 * c * mtbfSeconds) * (1 + Math.sqrt(ratio) / 3 + ratio / 9) - c : mtbfSeconds;
  const overheadFraction = c / dalySeconds + (dalySeconds + c) / (2 * mtbfSeconds);
  return { youngSeconds, dalySeconds, mtbfSeconds, checkpointSeconds: c, overheadFraction };
}
