import { z } from 'zod';
import { nodeNameSchema } from './names.js';

/**
 * The stop-time diagnosis contract between the controller and the node agents (ByteRobust
 * §4.2 Diagnose, §4.3): `POST /api/v1/diagnose` on an agent runs the node's configured checks
 * (EUD, NCCL tests, the bit-wise alignment reference step) and answers with one report.
 * Both sides validate against these schemas, so they cannot drift apart.
 */

export const DIAGNOSE_PATH = '/api/v1/diagnose';

/** Check names become metric label values and flow into logs: short and plain. */
export const checkNameSchema = z
  .string()
  .regex(/^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/, 'must be 1-63 characters of letters, digits, ".", "_" or "-", starting with a letter or digit');

/** Longest time limit a check or a diagnosis may have: EUD's longest run levels take hours. */
export const MAX_DIAGNOSE_SECONDS = 24 * 3600;

/**
 * How one check ended. `failed` and `timed_out` (the check overran its own limit) count against
 * the machine; `incomplete` (not started, or stopped early because the request's time limit ran
 * out or the agent shut down) says nothing about it.
 */
export const CHECK_RESULTS = ['passed', 'failed', 'timed_out', 'incomplete'] as const;
export type CheckResult = (typeof CHECK_RESULTS)[number];

export const diagnoseRequestSchema = z
  .object({
    /** Checks to run, by name, in the configured order; all of them (the reference last) when absent. */
    checks: z.array(checkNameSchema).min(1).max(64).optional(),
    /** Time the whole diagnosis may take; the agent answers within it (plus a short kill grace). */
    timeoutSeconds: z.number().positive().max(MAX_DIAGNOSE_SECONDS).optional(),
    /** Neighbouring nodes for the inter-machine all-gather, passed to checks as STEADFAST_DIAGNOSE_PEERS. */
    peers: z.array(nodeNameSchema).max(64).optional(),
    /** A warm standby's self-check: only the checks configured for standbys (no reference step). */
    standby: z.boolean().optional(),
  })
  .strict();
export type DiagnoseRequest = z.infer<typeof diagnoseRequestSchema>;

export const checkReportSchema = z.object({
  name: checkNameSchema,
  result: z.enum(CHECK_RESULTS),
  ok: z.boolean(),
  /** Exit status, or null when the check was killed by a signal or never ran. */
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  seconds: z.number().min(0),
  /** Killed at a time limit: its own (result timed_out) or the request's (result incomplete). */
  timedOut: z.boolean(),
  /** The last few KiB of stdout and stderr together. */
  outputTail: z.string(),
  /** Why it did not pass, in a sentence; absent when it passed. */
  reason: z.string().optional(),
  /** nccl-tests' "# Avg bus bandwidth" in GB/s, when the check sets a minimum for it. */
  avgBusBandwidthGBps: z.number().optional(),
});
export type CheckReport = z.infer<typeof checkReportSchema>;

export const diagnoseReportSchema = z.object({
  node: nodeNameSchema,
  startedAt: z.iso.datetime({ offset: true }),
  seconds: z.number().min(0),
  checks: z.array(checkReportSchema),
  /** sha256 (hex) of the reference step's stdout; present only when the reference step passed. */
  referenceHash: z
    .string()
    .regex(/^[0-9a-f]{64}$/, 'must be a hex sha256')
    .optional(),
});
export type DiagnoseReport = z.infer<typeof diagnoseReportSchema>;
