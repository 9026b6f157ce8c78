import express, { type Response } from 'express';
import { z } from 'zod';
import type { AuditLog } from '../../core/audit.js';
import { InputError } from '../../core/errors.js';
import { nodeNameSchema } from '../../core/names.js';
import { parseOrThrow } from '../../core/validate.js';
import type { RemediationHistory } from '../../actuators/remediation-history.js';
import type { SafetyGates } from '../../actuators/safety.js';
import { identityOf } from './auth.js';
import { answerTypedErrors } from './http-errors.js';
import { apiRoute } from './routes.js';

/**
 * The operator's cluster-wide controls over HTTP: pause and unpause every actuator, and hold
 * single nodes for maintenance. Both are safety gates (actuators/safety.ts) every actuator
 * passes; signals about a held node are still recorded, only actions on it are refused.
 */

const limitSchema = z.coerce.number<unknown>().int().min(1).max(1000);

const pauseSchema = z.object({ reason: z.string().trim().min(1).max(500).default('paused by operator') }).strict();

export interface OperatorRouterDeps {
  readonly gates: SafetyGates;
  readonly audit: AuditLog;
  /** Hold length when a request names none, and the longest allowed (config `safety.hold*Seconds`). */
  readonly holdDefaultSeconds: number;
  readonly holdMaxSeconds: number;
  /** The drain budget, for the pause answer. */
  readonly budget: { readonly maxPerWindow: number; readonly windowSeconds: number };
  /** Each node's remediation history (GET /nodes/:node/remediations). */
  readonly history: RemediationHistory;
}

export function operatorRouter(deps: OperatorRouterDeps): express.Router {
  const { gates, audit } = deps;
  const router = express.Router();
  const holdSchema = z
    .object({
      reason: z.string().trim().min(1, 'say why the node is held').max(500),
      /** When the hold ends, ISO 8601; or `durationSeconds`; neither: the default length. */
      until: z.iso.datetime({ offset: true }).optional(),
      durationSeconds: z.number().int().min(60).max(deps.holdMaxSeconds).optional(),
    })
    .strict()
    .refine((hold) => hold.until === undefined || hold.durationSeconds === undefined, 'give until or durationSeconds, not both');

  // Typed errors answered with their status (http-errors.ts); any other goes to the app's handler.
  const handle = answerTypedErrors;

  /** Audits an operator's change with the credential that made it. */
  const record = async (res: Response, ref: string, summary: string, data: Record<string, unknown>, node?: string): Promise<void> => {
    await audit.append({ type: 'action', ref, node, summary, data: { state: 'done', ...data }, actor: identityOf(res) }, `${ref}:${Date.now()}`);
  };

  const pauseState = async (): Promise<Record<string, unknown>> => {
    const reason = await gates.paused();
    return { paused: reason !== undefined, reason, drainsInWindow: await gates.budgetUsed(), ...deps.budget };
  };

  apiRoute(
    router,
    'get',
    '/pause',
    handle(async (_req, res) => void res.json(await pauseState())),
  );

  apiRoute(
    router,
    'post',
    '/pause',
    handle(async (req, res) => {
      const { reason } = parseOrThrow(pauseSchema, req.body ?? {}, 'pause');
      await gates.pause(reason);
      await record(res, 'pause', `pause: every actuator paused by an operator (${reason})`, { verb: 'pause', reason });
      res.json(await pauseState());
    }),
  );

  apiRoute(
    router,
    'delete',
    '/pause',
    handle(async (_req, res) => {
      await gates.unpause();
      await record(res, 'unpause', 'unpause: actuators may act again', { verb: 'unpause' });
      res.json(await pauseState());
    }),
  );

  apiRoute(
    router,
    'get',
    '/holds',
    handle(async (_req, res) => {
      res.json({ holds: [...(await gates.holds()).entries()].sort(([a], [b]) => a.localeCompare(b)).map(([node, hold]) => ({ node, ...hold })) });
    }),
  );

  apiRoute(
    router,
    'put',
    '/holds/:node',
    handle(async (req, res) => {
      const node = parseOrThrow(nodeNameSchema, req.params.node, 'node');
      const body = parseOrThrow(holdSchema, req.body, 'hold');
      const now = Date.now();
      const until = body.until !== undefined ? Date.parse(body.until) : now + (body.durationSeconds ?? deps.holdDefaultSeconds) * 1000;
      if (until <= now) throw new InputError('hold.until: must be in the future', 'until');
      if (until - now > deps.holdMaxSeconds * 1000) throw new InputError(`hold.until: at most ${deps.holdMaxSeconds} s ahead (safety.holdMaxSeconds)`, 'until');
      const hold = await gates.hold(node, body.reason, until, now);
      await record(res, `hold-${node}`, `hold ${node}: no action on it until ${hold.until} (${body.reason})`, { verb: 'hold', node, ...hold }, node);
      res.json({ node, ...hold });
    }),
  );

  apiRoute(
    router,
    'delete',
    '/holds/:node',
    handle(async (req, res) => {
      const node = parseOrThrow(nodeNameSchema, req.params.node, 'node');
      if (!(await gates.release(node))) {
        res.status(404).json({ error: `${node} is not held` });
        return;
      }
      await record(res, `hold-${node}`, `release ${node}: hold lifted by an operator`, { verb: 'release_hold', node }, node);
      res.json({ node, released: true });
    }),
  );

  apiRoute(
    router,
    'get',
    '/nodes/:node/remediations',
    handle(async (req, res) => {
      const node = parseOrThrow(nodeNameSchema, req.params.node, 'node');
      const limit = parseOrThrow(limitSchema, req.query.limit ?? '50', 'limit');
      const hold = (await gates.holds()).get(node);
      res.json({ node, held: hold === undefined ? null : { ...hold }, remediations: await deps.history.read(node, limit) });
    }),
  );

  return router;
}
