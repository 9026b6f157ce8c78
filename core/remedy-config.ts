import { z } from 'zod';
import { nodeNameSchema } from './names.js';

// Numbers are coerced so that environment overrides, which are always strings, validate too.
const int = () => z.coerce.number<unknown>().int();

/**
 * The `remedies:` section: the rungs short of a drain for nodes outside a registered job's
 * ladder, how they escalate, where a node that needs hands is handed off, and maintenance
 * windows. Every rung is off by default: a fatal Xid then drains the node, as before.
 */
/** A Slurm partition name as steadfast passes one to sinfo: never an option, never a list. */
export const SLURM_PARTITION_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export const maintenanceWindowSchema = z
  .object({
    name: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'letters, digits, ".", "_" or "-", up to 63'),
    /** The nodes it covers, by name. */
    nodes: z.array(nodeNameSchema).min(1).max(100_000).optional(),
    /** The Slurm partitions it covers: their nodes as the scheduler lists them, re-read every minute. */
    partitions: z
      .array(z.string().regex(SLURM_PARTITION_PATTERN, 'a Slurm partition name: letters, digits, ".", "_" or "-", up to 64'))
      .min(1)
      .max(1000)
      .optional(),
    start: z.iso.datetime({ offset: true }),
    end: z.iso.datetime({ offset: true }),
  })
  .strict()
  .refine((window) => window.nodes !== undefined || window.partitions !== undefined, { message: 'must name nodes, partitions or both', path: ['nodes'] })
  .refine((window) => Date.parse(window.end) > Date.parse(window.start), { message: 'must be after start', path: ['end'] });
export type MaintenanceWindow = z.infer<typeof maintenanceWindowSchema>;

export const remediesSchema = z
  .object({
    gpuReset: z
      .object({
        /** Reset one GPU (through its node's agent) where the Xid catalogue says `reset_gpu`, instead of draining the node. */
        enabled: z.boolean().default(false),
        /** Longest one reset may take on the agent. */
        timeoutSeconds: int().min(1).max(600).default(120),
        /** A reset refused because processes still hold the GPU is asked again this often, this far apart, before the node is drained. */
        busyRetries: int().min(0).max(20).default(3),
        busyRetryDelaySeconds: z.coerce.number<unknown>().min(0).max(600).default(10),
        /**
         * After a reset that worked, later reports of a fault on the node join its decision only
         * this long (the Prometheus alert for the same Xid trails the agent's fast path); a fault
         * after that is a new decision, and counts towards escalation.
         */
        rejoinSeconds: int().min(1).max(86_400).default(120),
      })
      .strict()
      .prefault({}),
    reboot: z
      .object({
        /** Reboot the node (Slurm `scontrol reboot ASAP`) where the catalogue says `reboot_node`, and when resets escalate. */
        enabled: z.boolean().default(false),
        /** The Slurm state after the reboot: `resume` (back to service once slurmd registers) or `down` (an operator resumes it). */
        nextState: z.enum(['resume', 'down']).default('resume'),
      })
      .strict()
      .prefault({}),
    escalation: z
      .object({
        /** GPU resets on one node within windowSeconds after which the next fault reboots it instead. */
        resetsBeforeReboot: int().min(1).max(100).default(3),
        /** Reboots on one node within windowSeconds after which the next fault hands it off. */
        rebootsBeforeHandOff: int().min(1).max(100).default(2),
        windowSeconds: int()
          .min(60)
          .max(90 * 86_400)
          .default(7 * 86_400),
      })
      .strict()
      .prefault({}),
    handOff: z
      .object({
        /** POSTed the hand-off payload (docs/remedies.md); the operator's own URL, never one from a request. */
        webhookUrl: z.url({ protocol: /^https?$/ }).optional(),
        timeoutMs: int().min(100).max(60_000).default(5000),
        attempts: int().min(1).max(20).default(5),
        /** How long steadfast leaves a handed-off node alone unless released (`steadfast release NODE`). */
        holdSeconds: int()
          .min(60)
          .max(365 * 86_400)
          .default(30 * 86_400),
      })
      .strict()
      .prefault({}),
    /** Entries kept per node in its remediation history. */
    historyLength: int().min(1).max(1000).default(50),
    /** Scheduled windows in which steadfast records but does not act on the nodes they cover. */
    maintenanceWindows: z.array(maintenanceWindowSchema).max(1000).default([]),
  })
  .strict();
export type RemediesConfig = z.output<typeof remediesSchema>;
