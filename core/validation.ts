import { z } from 'zod';
import { nodeNameSchema } from './names.js';

/**
 * The contract of a node's validation before it is trusted again (ByteRobust §6.2: warm standbys
 * self-check before they stand in; the same holds for a node back from a GPU reset, a reboot, a
 * hand-off or an operator's repair): `POST /api/v1/validate` on the node's agent runs a short burn
 * under load (a seeded reference computation compared, and its throughput measured) and, where
 * DCGM is installed, `dcgmi diag -r 2`. The agent runs only what it ships and its operator
 * configured; a request chooses among those, never a command. Both sides validate these schemas.
 */

export const VALIDATE_PATH = '/api/v1/validate';

/** Whether `dcgmi diag -r 2` runs: where DCGM answers (auto), always (absent DCGM fails), or never. */
export const DCGM_MODES = ['auto', 'always', 'never'] as const;
export type DcgmMode = (typeof DCGM_MODES)[number];

/** The longest a whole validation may be asked to take: DCGM's level 2 takes minutes, not hours. */
export const MAX_VALIDATION_SECONDS = 3600;

export const validateRequestSchema = z
  .object({
    dcgm: z.enum(DCGM_MODES).optional(),
    /** How long the burn runs on every device at once; the agent's --validate.burn-seconds when absent. */
    burnSeconds: z.number().min(1).max(600).optional(),
    /** Time the whole validation may take; the agent answers within it (plus a short kill grace). */
    timeoutSeconds: z.number().positive().max(MAX_VALIDATION_SECONDS).optional(),
  })
  .strict();
export type ValidateRequest = z.infer<typeof validateRequestSchema>;

/** `skipped`: not run, and no verdict on the node (DCGM absent under auto, never asked for). */
export const VALIDATION_RESULTS = ['passed', 'failed', 'timed_out', 'skipped'] as const;
export type ValidationResult = (typeof VALIDATION_RESULTS)[number];

export const VALIDATION_CHECKS = ['burn', 'dcgm'] as const;
export type ValidationCheckName = (typeof VALIDATION_CHECKS)[number];

/** One device's burn, as steadfast_burn.py reports it. */
export const burnDeviceSchema = z.object({
  device: z.string().max(64),
  name: z.string().max(200),
  ok: z.boolean(),
  /** Largest relative checksum error seen; null when a result was not a number. */
  checksum_error: z.number().nullable(),
  tflops: z.number().min(0),
  seconds: z.number().min(0),
  rounds: z.number().int().min(0),
  reason: z.string().max(2000).optional(),
});
export type BurnDevice = z.infer<typeof burnDeviceSchema>;

/** steadfast_burn.py's one JSON line. */
export const burnOutputSchema = z.object({
  ok: z.boolean(),
  seconds: z.number().min(0),
  devices: z.array(burnDeviceSchema).max(64),
  error: z.string().optional(),
});

export const validationCheckSchema = z.object({
  name: z.enum(VALIDATION_CHECKS),
  result: z.enum(VALIDATION_RESULTS),
  ok: z.boolean(),
  seconds: z.number().min(0),
  /** Why it did not pass, or why it was skipped; absent when it passed. */
  reason: z.string().optional(),
  /** The last few KiB of its output. */
  outputTail: z.string(),
});
export type ValidationCheck = z.infer<typeof validationCheckSchema>;

export const validationReportSchema = z.object({
  node: nodeNameSchema,
  startedAt: z.iso.datetime({ offset: true }),
  seconds: z.number().min(0),
  /** Every check passed or was skipped. */
  ok: z.boolean(),
  checks: z.array(validationCheckSchema),
  /** The burn's devices, when it printed its report. */
  devices: z.array(burnDeviceSchema).optional(),
});
export type ValidationReport = z.infer<typeof validationReportSchema>;

/** A node's burn throughput: the slowest device's, since one slow GPU holds back every step of a job. */
export function nodeThroughput(devices: readonly BurnDevice[]): { tflops: number; model: string } | undefined {
  if (devices.length === 0 || devices.some((device) => !device.ok)) return undefined;
  const slowest = devices.reduce((low, device) => (device.tflops < low.tflops ? device : low));
  return { tflops: slowest.tflops, model: slowest.name };
}
