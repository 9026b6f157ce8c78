import { z } from 'zod';
import { nodeNameSchema, PCI_BUS_ID_PATTERN } from './names.js';

/**
 * The agent's fast path (DESIGN.md §1): a fatal event the agent saw itself, POSTed straight to
 * the controller's `/api/v1/signals` without waiting for a Prometheus scrape and rule
 * evaluation. The body is one event or an array of up to 100.
 */
export const fastPathEventSchema = z
  .object({
    kind: z.enum(['xid', 'gpu_lost']),
    node: nodeNameSchema,
    /** PCI bus id, `dddd:bb:dd`. */
    gpu: z.string().regex(PCI_BUS_ID_PATTERN, 'must be a PCI bus id like 0000:3b:00'),
    /** Xid code; required when kind is xid. */
    xid: z.number().int().min(0).max(100_000).optional(),
    message: z.string().max(2048).default(''),
    /** When the agent saw it, ISO 8601. */
    time: z.iso.datetime({ offset: true }),
  })
  .strict()
  .refine((event) => event.kind !== 'xid' || event.xid !== undefined, { message: 'xid is required when kind is "xid"', path: ['xid'] });

export type FastPathEvent = z.infer<typeof fastPathEventSchema>;

export const fastPathBodySchema = z.union([fastPathEventSchema, z.array(fastPathEventSchema).min(1).max(100)]);
