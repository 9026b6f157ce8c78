import express from 'express';
import { jobNameSchema } from '../../core/job.js';
import { parseOrThrow } from '../../core/validate.js';
import type { JobStore } from '../job-store.js';
import type { RecoveryDispatcher } from '../policy/recovery-dispatcher.js';
import { swapEndEvent } from '../world-store.js';
import { identityOf } from './auth.js';
import { answerTypedErrors } from './http-errors.js';
import { apiRoute } from './routes.js';
import { mayTrainFor } from './training-access.js';

/**
 * A hot-swap job's world (controller/world-store.ts), for its ranks: GET reads the shards, spares,
 * replicas and the epoch they meet in; POST is one rank's report in an epoch. Scope `training`:
 * an agent's node-bound credential reaches them for a job whose member or spare its node is, and
 * reports only as its own node. A report that ends a swap tells the job's ladder.
 */
export interface WorldRouterDeps {
  readonly jobs: JobStore;
  readonly dispatcher?: RecoveryDispatcher | undefined;
}

export function worldRouter(deps: WorldRouterDeps): express.Router {
  const { jobs } = deps;
  const router = express.Router();

  apiRoute(
    router,
    'get',
    '/jobs/:id/world',
    answerTypedErrors(async (req, res) => {
      const record = await mayTrainFor(jobs, parseOrThrow(jobNameSchema, req.params.id, 'job name'), req, res);
      res.json(await jobs.world.view(record));
    }),
  );

  apiRoute(
    router,
    'post',
    '/jobs/:id/world',
    answerTypedErrors(async (req, res) => {
      const record = await mayTrainFor(jobs, parseOrThrow(jobNameSchema, req.params.id, 'job name'), req, res, reportedNode(req.body));
      const outcome = await jobs.world.report(record, req.body);
      const name = record.spec.name;
      if (outcome.done) await deps.dispatcher?.apply({ ...swapEndEvent(name, 'done', outcome.done), origin: identityOf(res) });
      if (outcome.failed) await deps.dispatcher?.apply({ ...swapEndEvent(name, 'failed', outcome.failed), origin: identityOf(res) });
      res.status(202).json({ accepted: true });
    }),
  );

  return router;
}

/** The node a report says it comes from, for the credential check (the report's own validation names a bad one). */
function reportedNode(body: unknown): string | undefined {
  const node = typeof body === 'object' && body !== null ? (body as { node?: unknown }).node : undefined;
  return typeof node === 'string' ? node : undefined;
}
