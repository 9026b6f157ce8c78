import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Queue } from 'bullmq';
import express, { type NextFunction, type Request, type Response } from 'express';
import type { AuditLog } from '../../core/audit.js';
import { describeIdentity, type Credentials } from '../../core/credentials.js';
import { auditQuerySchema } from '../../core/audit.js';
import { StoreUnavailableError, errorMessage } from '../../core/errors.js';
import { ClientRateLimiter, rateLimitMessage, type RateLimitSettings } from '../../core/rate-limit.js';
import type { Logger } from '../../core/log.js';
import type { TrainingProgressEvent } from '../../core/fast-path-event.js';
import type { Signal } from '../../core/signal.js';
import { describeIssues } from '../../core/validate.js';
import { AccessAudit, ForbiddenError, authorize, identityOf, sendForbidden, type RejectReason, type RequestLine } from './auth.js';
import { failureAnswer } from './http-errors.js';
import { ReadLimit } from './read-limit.js';
import { answerInternalError, endpointLabel, intakeHandler, rejecter } from './intake-http.js';
import type { ControllerMetrics } from '../metrics.js';
import { mountQueueBoard } from './queue-board.js';
import { requestTargetProblem } from './request-target.js';
import { API_ROOT, apiRoute, provideBodyReader } from './routes.js';
import { summarizeQueue } from '../queue-summary.js';
import { BodyBudget, jsonBody } from './request-body.js';

export interface ServerDeps {
  /** Who may call what: controller/intake/scopes.ts. */
  readonly credentials: Credentials;
  readonly bodyLimitBytes: number;
  /** Request bodies held in memory at once, all requests together; past it, 503 before reading. */
  readonly inFlightBodyBytes: number;
  /** Per-client limit on every write (POST, PUT, PATCH, DELETE) under /api/v1; absent or 0 per second: none. */
  readonly rateLimit?: RateLimitSettings | undefined;
  readonly enqueue: (signals: readonly Signal[]) => Promise<void>;
  readonly recordProgress: (events: readonly TrainingProgressEvent[], receivedAt: number) => Promise<number>;
  readonly audit: AuditLog;
  readonly redisUp: () => Promise<boolean>;
  readonly metrics: ControllerMetrics;
  readonly logger: Logger;
  /** More authenticated API routes (jobs, standbys). */
  readonly routers?: readonly express.Router[];
  /** Queues shown read-only on bull-board at /queues (a read credential, as bearer or as the Basic password). */
  readonly queues?: Queue[];
}

/** Body-parser and router errors carry an HTTP status; anything else is ours. */
function httpStatusOf(error: unknown): number | undefined {
  const status = typeof error === 'object' && error !== null ? (error as { status?: unknown }).status : undefined;
  return typeof status === 'number' && status >= 400 && status < 600 ? status : undefined;
}

const READ_METHODS = new Set(['GET', 'HEAD', 'OPTIONS']);
/** How long GET /api/v1/queues waits for Redis before answering 503. */
const QUEUES_ANSWER_MS = 5000;

/**
 * The controller's HTTP surface: the intake endpoints (intake-http.ts) and, behind them, every
 * other route on Express. Writes answer 2xx only after the signals are in Redis; when Redis is
 * unreachable they answer 503 with Retry-After, so Alertmanager and agents retry.
 */
export function createApp(deps: ServerDeps): (req: IncomingMessage, res: ServerResponse) => void {
  const { metrics, logger } = deps;
  const app = express();
  app.disable('x-powered-by');
  // Answers are small JSON documents for machines, never cached: hashing each one for an ETag is waste.
  app.set('etag', false);
  const access = new AccessAudit(deps.audit, logger);
  const onReject = (req: RequestLine, reason: RejectReason): void => metrics.requestsRejected.inc({ endpoint: endpointLabel(req.url), reason });
  const auth = authorize({ credentials: deps.credentials, access, onReject });

  const reject = rejecter(metrics);

  // Each credential's bodies may take a quarter of the budget (at least one body of the largest size).
  const bodyLimits = {
    maxBytes: deps.bodyLimitBytes,
    budget: new BodyBudget(deps.inFlightBodyBytes, Math.max(deps.bodyLimitBytes, Math.floor(deps.inFlightBodyBytes / 4))),
  };
  const json = jsonBody(
    bodyLimits,
    (req, res, refusal) => reject(res, endpointLabel(req.originalUrl), refusal.status, refusal.reason, refusal.message),
    (res) => describeIdentity(identityOf(res)),
  );

  app.get('/healthz', async (_req, res) => {
    const redis = await deps.redisUp();
    res.status(redis ? 200 : 503).json({ status: redis ? 'ok' : 'degraded', redis: redis ? 'up' : 'down' });
  });

  // Before authentication, so that guessing tokens is throttled as well.
  const limiter = deps.rateLimit && deps.rateLimit.requestsPerSecond > 0 ? new ClientRateLimiter(deps.rateLimit) : undefined;
  if (limiter) {
    app.use('/api/v1', (req, res, next) => {
      if (READ_METHODS.has(req.method)) return next();
      const decision = limiter.take(req.socket.remoteAddress ?? 'unknown');
      if (decision.allowed) return next();
      reject(res, endpointLabel(req.originalUrl), 429, 'rate_limited', rateLimitMessage(limiter.settings, decision.retryAfterSeconds), {
        'Retry-After': String(decision.retryAfterSeconds),
      });
    });
  }

  app.use(API_ROOT, auth);

  // The API's own routes live on a router mounted at API_ROOT, as the other routers do.
  const api = express.Router();
  // Costly reads run a few at a time (read-limit.ts); past that, 429 at once.
  const reads = new ReadLimit();
  // A read may answer before its work ends (Redis did not answer in time): it hands that work to
  // `outlive`, and its slot is held until the work ends, so that a Redis that does not answer
  // collects a few such reads, not one per request.
  const limited =
    (endpoint: string, read: (req: Request, res: Response, outlive: (work: Promise<unknown>) => void) => Promise<void>) =>
    async (req: Request, res: Response): Promise<void> => {
      const release = reads.take(identityOf(res));
      if (!release) {
        reject(
          res,
          endpoint,
          429,
          'too_many_reads',
          `too many ${endpoint} reads at once for this credential (at most ${reads.perCredential}, ${reads.overall} in all); retry in a second`,
          { 'Retry-After': '1' },
        );
        return;
      }
      const outliving: Promise<unknown>[] = [];
      try {
        await read(req, res, (work) => outliving.push(work));
      } finally {
        void Promise.allSettled(outliving).then(release);
      }
    };

  apiRoute(
    api,
    'get',
    '/audit',
    limited('audit', async (req, res) => {
      const query = auditQuerySchema.safeParse(req.query);
      if (!query.success) {
        reject(res, 'audit', 400, 'invalid', `invalid audit query: ${describeIssues(query.error.issues)}`);
        return;
      }
      try {
        res.json({ entries: await deps.audit.read(query.data) });
      } catch (error) {
        if (error instanceof StoreUnavailableError) {
          reject(res, 'audit', 503, 'store_unavailable', error.message);
          return;
        }
        throw error;
      }
    }),
  );

  // What `steadfast queues` prints: counts by state and the newest failures of each queue.
  // The queues sit on the workers' connection, which waits for Redis rather than fail: the
  // answer is 503 while Redis is down or does not answer a health check (within its own
  // deadline), and when the counts do not come within QUEUES_ANSWER_MS.
  apiRoute(
    api,
    'get',
    '/queues',
    limited('queues', async (_req, res, outlive) => {
      const unavailable = (why: string): void => reject(res, 'queues', 503, 'store_unavailable', `queues cannot be read: ${why}; retry later`);
      if (!(await deps.redisUp())) return unavailable('Redis is unreachable or does not answer');
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((resolve) => (timer = setTimeout(() => resolve('late'), QUEUES_ANSWER_MS)));
      const summaries = Promise.all((deps.queues ?? []).map((queue) => summarizeQueue(queue)));
      outlive(summaries);
      const answer = await Promise.race([summaries, late]).finally(() => clearTimeout(timer));
      if (answer === 'late') return unavailable(`Redis did not answer within ${QUEUES_ANSWER_MS} ms`);
      res.json({ queues: answer });
    }),
  );

  app.use(API_ROOT, api);
  // Some routes' work runs on the workers' connection, which waits for Redis rather than fail (a
  // registration's dispatcher, code updates, the standby pool): every other route first passes the
  // health check, so a Redis that is down or answers nothing is a 503 within its deadline, not a hang.
  app.use(API_ROOT, (req, res, next) => {
    deps.redisUp().then((up) => {
      if (up) next();
      else reject(res, endpointLabel(req.originalUrl), 503, 'store_unavailable', 'the store (Redis) is unavailable or does not answer; retry later');
    }, next);
  });
  // Each route reads the body only once the caller's credential passed its scope check (routes.ts).
  app.use(API_ROOT, provideBodyReader(json));
  for (const router of deps.routers ?? []) app.use(API_ROOT, router);
  if (deps.queues) {
    mountQueueBoard(app, deps.queues, authorize({ credentials: deps.credentials, access, onReject, basic: true }), { storeUp: deps.redisUp });
  }

  app.use((_req, res) => {
    res.status(404).json({ error: 'no such endpoint' });
  });

  app.use(async (error: unknown, req: Request, res: Response, _next: NextFunction) => {
    const endpoint = endpointLabel(req.originalUrl);
    const status = httpStatusOf(error);
    if (res.headersSent) {
      // Too late for an answer: the client sees the connection end instead of a half response.
      logger.warn({ err: error, path: req.path }, 'request failed after its answer began');
      res.destroy();
    } else if (error instanceof ForbiddenError) {
      sendForbidden({ access, onReject }, req, res, error.identity, error.scope, error.message);
    } else if (status === 413) {
      reject(res, endpoint, 413, 'too_large', `request body larger than ${deps.bodyLimitBytes} bytes`);
    } else if (status !== undefined && status < 500) {
      reject(res, endpoint, status, 'unreadable', `unreadable request: ${errorMessage(error)}`);
    } else {
      // A typed error as http-errors.ts maps it; Redis down (or an answer to wait for): 503, the caller's retry will do.
      const failure = await failureAnswer(error, deps.redisUp);
      if (failure.status === 503) logger.warn({ err: error, path: req.path }, 'request failed while the store is unavailable; asking the caller to retry');
      else if (failure.status === 500) logger.error({ err: error, path: req.path }, 'request failed');
      reject(res, endpoint, failure.status, failure.reason, failure.message);
    }
  });

  const intake = intakeHandler({
    credentials: deps.credentials,
    access,
    onReject,
    limiter,
    body: bodyLimits,
    enqueue: deps.enqueue,
    recordProgress: deps.recordProgress,
    redisUp: deps.redisUp,
    metrics,
    logger,
  });
  return (req, res) => {
    try {
      // Before anything else: a target the router could read otherwise than it was sent is refused.
      const problem = requestTargetProblem(req.url ?? '');
      if (problem !== undefined) {
        reject(res, 'other', 400, 'bad_target', `${problem}; send a plain path`);
        return;
      }
      if (!intake(req, res)) app(req, res);
    } catch (error) {
      // This runs on the server's 'request' event: a throw here would end the process.
      answerInternalError(res, endpointLabel(req.url ?? ''), error, { reject, logger, path: req.url });
    }
  };
}
