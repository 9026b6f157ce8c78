import { z } from 'zod';
import { nodeNameSchema } from './names.js';

/**
 * One saved copy of one rank's checkpoint shard, as the training side reports it
 * (POST /api/v1/jobs/:id/checkpoints) and the restore planner reads it after evictions
 * (ByteRobust §6.3: copies on the rank's own GPU, host or disk, on a peer, or remote).
 */

export const CHECKPOINT_TIERS = ['gpu', 'host', 'disk', 'peer', 'remote'] as const;
export type CheckpointTier = (typeof CHECKPOINT_TIERS)[number];

export const checkpointShardSchema = z
  .object({
    step: z.number().int().min(0),
    /** The rank whose state this is (its shard). */
    rank: z.number().int().min(0),
    tier: z.enum(CHECKPOINT_TIERS),
    /** The node that holds this copy; not needed for remote copies. */
    holder: nodeNameSchema.optional(),
  })
  .strict()
  .refine((shard) => shard.tier === 'remote' || shard.holder !== undefined, { message: 'holder is required unless tier is "remote"', path: ['holder'] });

export type CheckpointShard = z.infer<typeof checkpointShardSchema>;
