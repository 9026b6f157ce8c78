import { z } from 'zod';
import { AGENT_SCRAPE_JOB, CONTROLLER_SCRAPE_JOB } from '../core/scrape.js';
import { parseOrThrow } from '../core/validate.js';

/**
 * Every threshold and selector the rules use, in one place, each with where it comes from.
 * Domain modules read them from here; nothing is pasted into an expression twice. A value left
 * out of an override is an error naming it, never a silent default.
 */

const duration = z.string().regex(/^(\d+(ms|s|m|h|d|w|y))+$/, 'must be a Prometheus duration like 30s or 5m');
const positive = z.number().positive();
const ratio = z.number().min(0).max(10);

export const thresholdsSchema = z
  .object({
    selectors: z
      .object({
        /** The agents' scrape job(s). */
        agentJob: z.string().min(1),
        /** The controller's scrape job. */
        controllerJob: z.string().min(1),
      })
      .strict(),
    runbookBaseUrl: z.url(),
    gpu: z
      .object({
        /** ByteRobust (000, §4.1) reports detecting a lost GPU within 10 s. */
        lostFor: duration,
        /** NVIDIA's slowdown thresholds sit near 85-90 °C on datacenter parts; warn before. */
        temperatureCelsius: positive,
        temperatureFor: duration,
        /** Hardware slowdown for this long costs a synchronous job real throughput. */
        throttleFor: duration,
        /** A pending row remap needs a GPU reset; give the driver time to apply it at idle. */
        remapPendingFor: duration,
        /** An uncorrectable ECC error stays "new" (and its alert firing) for this long after the count rises. */
        eccWindow: duration,
        /** Corrected ECC errors within correctableWindow past which a GPU is worth watching (DCGM's health watch flags a rising SBE rate). */
        correctableErrors: positive,
        correctableWindow: duration,
        /** NVLink replay + recovery + CRC errors on one link within nvlinkWindow that mean the link is failing. */
        nvlinkErrorIncrease: positive,
        nvlinkWindow: duration,
        /** A GPU not registered with its NVSwitch fabric this long after start is not coming up by itself. */
        fabricNotReadyFor: duration,
        /** A kernel-log event (fatal SXid, NVIDIA hung task, fatal AER) counts as new for this long. */
        kernelWindow: duration,
        /** A GPU query that hung counts as new for this long. */
        queryStuckWindow: duration,
      })
      .strict(),
    xid: z
      .object({
        /** Window in which a new fatal Xid counts as new (also the first sample of a new series). */
        window: duration,
        /**
         * Application-class Xids (remedy restart_app in core/xid.ts) are normally the job's own
         * fault; the same GPU logging this many within repeatWindow, across restarts, points at the GPU.
         */
        repeatCount: positive,
        repeatWindow: duration,
      })
      .strict(),
    network: z
      .object({
        portDownFor: duration,
        /** ByteRobust (000, §4.1): evict a machine only after two network alerts within 5 minutes; flaps often heal. */
        flapCount: positive,
        flapWindow: duration,
        /** Symbol / link-integrity errors per second that mean a degrading cable or transceiver. */
        errorRatePerSecond: positive,
        /** The rate() window for those error counters. */
        errorRateWindow: duration,
        errorFor: duration,
        /** ByteRobust (000, §4.1): zero RDMA traffic for 10 minutes while a job runs means a hang. */
        zeroTrafficFor: duration,
      })
      .strict(),
    storage: z
      .object({
        /** 504-GPU report (002): checkpoint stalls traced to a saturated 128-slot NFS RPC table. */
        rpcSlotUtilization: ratio,
        rpcSlotFor: duration,
        /** Requests waiting for a slot, on average per send. */
        rpcBacklog: positive,
        rpcBacklogFor: duration,
        /** A major timeout (the server did not answer within the mount's timeo × retrans) counts as new for this long. */
        majorTimeoutWindow: duration,
      })
      .strict(),
    training: z
      .object({
        /** ByteRobust (000, §4.1): loss or grad norm 5× its recent level, or NaN, is a numerical fault. */
        spikeFactor: positive,
        /** How far back "recent level" looks, and how much of the present it leaves out. */
        baselineWindow: duration,
        baselineOffset: duration,
        /** Greyhound (004, §4): a ≥ 10 % slow-down, verified against the job's own recent baseline. */
        slowdownRatio: positive,
        slowdownFor: duration,
        /**
         * How far back the slow-down baseline ends. Keep it at least slowdownFor: a shorter one
         * lets the slow period leak into the baseline before `for:` elapses, raising the bar.
         */
        slowdownBaselineOffset: duration,
        /** A NaN / skipped iteration or a worker failure counts as new for this long. */
        counterWindow: duration,
        /** fp16 loss scaling skips an iteration now and then; skipping for this long means it cannot recover. */
        skippedFor: duration,
        /** No new iteration for this long is a stopped job. */
        noProgressSeconds: positive,
      })
      .strict(),
    steadfast: z
      .object({
        agentDownFor: duration,
        controllerDownFor: duration,
        queueBacklogJobs: positive,
        queueBacklogFor: duration,
        /** A signal waiting this long unprocessed means decisions (and the audit) lag behind. */
        auditLagSeconds: positive,
        /** Refused and failed actions are counted over this window. */
        actionWindow: duration,
        /** Failed attempts within actionWindow that mean retrying will not fix it (a drain is retried on its own first). */
        actionFailureCount: positive,
      })
      .strict(),
  })
  .strict();

export type Thresholds = z.output<typeof thresholdsSchema>;

export const DEFAULT_THRESHOLDS: Thresholds = {
  selectors: { agentJob: AGENT_SCRAPE_JOB, controllerJob: CONTROLLER_SCRAPE_JOB },
  runbookBaseUrl: 'https://github.com/steadfast-dev/steadfast/blob/main/docs/runbooks/',
  gpu: {
    lostFor: '10s',
    temperatureCelsius: 85,
    temperatureFor: '5m',
    throttleFor: '5m',
    remapPendingFor: '10m',
    eccWindow: '5m',
    correctableErrors: 1000,
    correctableWindow: '1h',
    nvlinkErrorIncrease: 100,
    nvlinkWindow: '10m',
    fabricNotReadyFor: '5m',
    kernelWindow: '5m',
    queryStuckWindow: '10m',
  },
  xid: { window: '5m', repeatCount: 3, repeatWindow: '1h' },
  network: { portDownFor: '1m', flapCount: 2, flapWindow: '5m', errorRatePerSecond: 1, errorRateWindow: '5m', errorFor: '5m', zeroTrafficFor: '10m' },
  storage: { rpcSlotUtilization: 0.9, rpcSlotFor: '5m', rpcBacklog: 1, rpcBacklogFor: '5m', majorTimeoutWindow: '5m' },
  training: {
    spikeFactor: 5,
    baselineWindow: '30m',
    baselineOffset: '5m',
    slowdownRatio: 1.1,
    slowdownFor: '10m',
    slowdownBaselineOffset: '10m',
    counterWindow: '5m',
    skippedFor: '10m',
    noProgressSeconds: 600,
  },
  steadfast: {
    agentDownFor: '2m',
    controllerDownFor: '1m',
    queueBacklogJobs: 100,
    queueBacklogFor: '5m',
    auditLagSeconds: 60,
    actionWindow: '15m',
    actionFailureCount: 3,
  },
};

/** Validates a full thresholds object (for example DEFAULT_THRESHOLDS with overrides merged in). */
export function thresholds(value: unknown = DEFAULT_THRESHOLDS): Thresholds {
  return parseOrThrow(thresholdsSchema, value, 'rule thresholds');
}
