import express from 'express';
import { z } from 'zod';
import { jobNameSchema } from '../../core/job.js';
import { nodeNameSchema } from '../../core/names.js';
import { EVIDENCE_TEXT_MAX, faultFingerprint, stableHash, type Signal } from '../../core/signal.js';
import { parseOrThrow } from '../../core/validate.js';
import { trainingNodes, type JobStore } from '../job-store.js';
import { ForbiddenError, identityOf } from './auth.js';
import { answerTypedErrors } from './http-errors.js';
import { apiRoute } from './routes.js';
import { mayTrainFor } from './training-access.js';

/**
 * A job's preflight report (clients/python/steadfast_preflight.py): before the job's first
 * iteration its nodes all-reduced among themselves and pairwise tests named the nodes whose link
 * is bad. Each named node becomes one `preflight_failed` signal, classified as a machine fault
 * (fault-class.ts), so it takes the path every machine fault takes: the job's ladder evicts the
 * node onto a warm standby and relaunches (or, for a node outside any job, the node ladder drains
 * it), through the safety gates — pause, holds, the eviction budget, dry-run — and audited with
 * the reporting node's identity (ByteRobust §6.2).
 *
 * Scope `training`: an agent's node-bound credential may report only for a job its node belongs
 * to, and may name only that job's nodes and spares (docs/security.md).
 */

/** Most nodes one report names: a preflight naming more has found a fabric problem, not nodes. */
const MAX_NAMED = 64;

export const preflightReportSchema = z
  .object({
    nodes: z.array(nodeNameSchema).min(1).max(MAX_NAMED),
    detail: z.string().max(EVIDENCE_TEXT_MAX).default(''),
    /** How long the preflight took, all-reduce and bisection. */
    seconds: z.number().min(0).max(86_400),
    /** The run that reported (a Slurm job id): a retried report of one run is one signal per node. */
    run: z.string().min(1).max(128).optional(),
  })
  .strict();

export interface PreflightRouterDeps {
  readonly jobs: JobStore;
  /** Stores signals on the signals queue (the intake's batcher): the policy worker takes them from there. */
  readonly enqueue: (signals: readonly Signal[]) => Promise<void>;
}

export function preflightRouter(deps: PreflightRouterDeps): express.Router {
  const router = express.Router();
  apiRoute(
    router,
    'post',
    '/jobs/:id/preflight',
    answerTypedErrors(async (req, res) => {
      const record = await mayTrainFor(deps.jobs, parseOrThrow(jobNameSchema, req.params.id, 'job name'), req, res);
      const report = parseOrThrow(preflightReportSchema, req.body, 'preflight report');
      const origin = identityOf(res);
      const allocation = trainingNodes(record);
      const outside = report.nodes.filter((node) => !allocation.includes(node));
      if (outside.length > 0) {
        throw new ForbiddenError(
          origin,
          'training',
          `a preflight of job ${record.spec.name} may name only its nodes (${allocation.join(', ')}), not ${outside.join(', ')}`,
        );
      }
      const receivedAt = new Date();
      const signals = [...new Set(report.nodes)].map((node) => preflightSignal(record.spec.name, node, report, origin, receivedAt));
      await deps.enqueue(signals);
      res.status(202).json({ accepted: signals.length, ids: signals.map((signal) => signal.id) });
    }),
  );
  return router;
}

/** One named node's signal. Its id comes from the run (or the arrival), so a retried report is stored once. */
export function preflightSignal(
  job: string,
  node: string,
  report: z.infer<typeof preflightReportSchema>,
  origin: NonNullable<Signal['origin']>,
  receivedAt: Date,
): Signal {
  const reporter = origin.node ?? origin.role;
  return {
    id: 's-' + stableHash(['preflight', job, node, report.run ?? receivedAt.toISOString()].join('|')),
    kind: 'preflight_failed',
    node,
    job,
    severity: 'critical',
    time: receivedAt.toISOString(),
    receivedAt: receivedAt.toISOString(),
    fingerprint: faultFingerprint({ kind: 'preflight_failed', node, detail: job }),
    source: 'agent',
    evidence: {
      message: report.detail,
      seconds: report.seconds,
      named: report.nodes.join(','),
      reporter,
      ...(report.run === undefined ? {} : { run: report.run }),
    },
    origin,
  };
}
