import { z } from 'zod';
import { identitySchema } from './credentials.js';
import { nodeNameSchema, PCI_BUS_ID_PATTERN } from './names.js';

/**
 * Remedies short of a drain, and what is remembered of them (docs/remedies.md). The Xid
 * catalogue (core/xid.ts) names the remedy NVIDIA points to; the controller climbs from it:
 * a GPU reset, then a node reboot, then a hand-off to people, each rung taken when the one below
 * has been spent on the node within a window.
 */

/** The agent endpoint that resets one GPU (`nvidia-smi --gpu-reset -i <index>`). */
export const GPU_RESET_PATH = '/api/v1/gpu-reset';

/** Longest the agent lets one reset take. */
export const MAX_GPU_RESET_SECONDS = 600;

export const pciBusIdSchema = z.string().regex(PCI_BUS_ID_PATTERN, 'must be a PCI bus id like 0000:3b:00');

export const gpuResetRequestSchema = z
  .object({
    /** The GPU by PCI bus id, as Xid lines and signals name it; the agent finds its index itself. */
    gpu: pciBusIdSchema,
    timeoutSeconds: z.number().int().min(1).max(MAX_GPU_RESET_SECONDS).optional(),
  })
  .strict();
export type GpuResetRequest = z.infer<typeof gpuResetRequestSchema>;

/**
 * How a reset ended: `reset` (done, and the GPU was listed again afterwards), `refused` (not
 * tried: processes hold the GPU, persistence mode blocks it, or the GPU is not listed), `failed`
 * (tried, and nvidia-smi failed or the GPU did not come back).
 */
export const GPU_RESET_OUTCOMES = ['reset', 'refused', 'failed'] as const;
export type GpuResetOutcome = (typeof GPU_RESET_OUTCOMES)[number];

export const gpuResetReportSchema = z.object({
  node: nodeNameSchema,
  gpu: pciBusIdSchema,
  /** The index nvidia-smi gave the GPU; null when it does not list it. */
  index: z.number().int().min(0).max(63).nullable(),
  outcome: z.enum(GPU_RESET_OUTCOMES),
  /** Processes that held the GPU (a refusal's cause). */
  processes: z.array(z.number().int().min(0)).max(1024).default([]),
  /** Processes the agent stopped on that GPU before resetting it (--gpu-reset.stop-grace-seconds). */
  stopped: z.array(z.number().int().min(0)).max(1024).default([]),
  reason: z.string().max(2048),
  seconds: z.number().min(0),
});
export type GpuResetReport = z.infer<typeof gpuResetReportSchema>;

/** The rungs, lowest first. `drain` is today's remedy for anything the others do not fit. */
export const REMEDY_ACTIONS = ['reset_gpu', 'drain', 'reboot', 'hand_off'] as const;
export type RemedyAction = (typeof REMEDY_ACTIONS)[number];

/** How a remediation ended, as its history and the metric count it. */
export const REMEDY_OUTCOMES = ['done', 'refused', 'failed', 'fell_back'] as const;
export type RemedyOutcome = (typeof REMEDY_OUTCOMES)[number];

/** One line of a node's remediation history (newest first in Redis, bounded). */
export const remediationEntrySchema = z.object({
  time: z.iso.datetime({ offset: true }),
  action: z.enum(REMEDY_ACTIONS),
  outcome: z.enum(REMEDY_OUTCOMES),
  /** The GPU, for a reset. */
  gpu: pciBusIdSchema.optional(),
  /** Why it was chosen and what happened, in a sentence. */
  detail: z.string().max(1024),
  /** The decision it carried out. */
  decisionId: z.string().max(128),
  /** Who sent the signal the decision followed from, or the operator who asked. */
  actor: identitySchema.optional(),
});
export type RemediationEntry = z.infer<typeof remediationEntrySchema>;

/**
 * The JSON body of the hand-off webhook: a node that needs hands (an inspection, an RMA).
 * Stable: version 1.
 */
export const handOffPayloadSchema = z.object({
  version: z.literal(1),
  kind: z.literal('steadfast.node.handoff'),
  node: nodeNameSchema,
  reason: z.string().max(1024),
  decisionId: z.string().max(128),
  time: z.iso.datetime({ offset: true }),
  /** Until when steadfast leaves the node alone unless released earlier (`steadfast release NODE`). */
  heldUntil: z.iso.datetime({ offset: true }),
  /** The node's recent remediations, newest first. */
  history: z.array(remediationEntrySchema).max(100),
});
export type HandOffPayload = z.infer<typeof handOffPayloadSchema>;

/** The hold reason prefix that marks a node handed off to people. */
export const HANDED_OFF_REASON = 'handed off';
