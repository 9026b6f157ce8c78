import type { IncomingMessage, ServerResponse } from 'node:http';
import { describeIdentity, type Credentials } from '../../core/credentials.js';
import { StoreUnavailableError } from '../../core/errors.js';
import {
  fastPathBodySchema,
  isFastPathFault,
  isTrainingProgress,
  staleFaultTime,
  type FastPathFault,
  type TrainingProgressEvent,
} from '../../core/fast-path-event.js';
import type { Logger } from '../../core/log.js';
import { rateLimitMessage, type ClientRateLimiter } from '../../core/rate-limit.js';
import type { Signal } from '../../core/signal.js';
import { describeIssues } from '../../core/validate.js';
import { signalsFromWebhookAlerts, webhookEnvelopeSchema, type RefusedAlert } from './alertmanager.js';
import { ForbiddenError, authenticate, clientGone, forbidden, requireOwnNode, type AccessAudit, type RejectReason, type RequestLine } from './auth.js';
import { routeScope, type RouteScope } from './scopes.js';
import { signalFromFastPath } from './fast-path-signal.js';
import { RETRY_AFTER_SECONDS, failureAnswer } from './http-errors.js';
import type { ControllerMetrics } from '../metrics.js';
import { readJsonBody, type BodyLimits } from './request-body.js';

/**
 * The two write endpoints every sender hits, served on Node's own request handler in front of
 * Express: `POST /api/v1/alerts` (Alertmanager) and `POST /api/v1/signals` (agents' fast path).
 * They run the same checks in the same order as every other route — the per-client rate limit,
 * the credential and its scope (auth.ts), the body's bounds (request-body.ts) — and answer 202
 * only once the signals are stored. Express costs several times what these two need per request
 * (routing, request and response decoration), and they are where the load is.
 */

export interface IntakeHttpDeps {
  readonly credentials: Credentials;
  readonly access: AccessAudit;
  readonly onReject: (req: RequestLine, reason: RejectReason) => void;
  readonly limiter: ClientRateLimiter | undefined;
  readonly body: BodyLimits;
  readonly enqueue: (signals: readonly Signal[]) => Promise<void>;
  /** Keeps agents' training_progress reports (controller/progress.ts); returns how many were for registered jobs. */
  readonly recordProgress: (events: readonly TrainingProgressEvent[], receivedAt: number) => Promise<number>;
  readonly redisUp: () => Promise<boolean>;
  readonly metrics: ControllerMetrics;
  readonly logger: Logger;
}

/** The API's endpoints by the last fixed word of their path; a metric label must not echo what a client typed. */
const ENDPOINT_LABELS = new Set([
  'alerts',
  'signals',
  'audit',
  'jobs',
  'checkpoints',
  'restore-plan',
  'microbatches',
  'code-updates',
  'standby',
  'self-check',
  'queues',
  'policy',
  'pause',
  'holds',
]);

/** The endpoint label of a request URL (path and query). */
export function endpointLabel(url: string): string {
  const words = url.split('?')[0]?.split('/') ?? [];
  for (let index = words.length - 1; index >= 0; index -= 1) {
    const word = words[index] as string;
    if (ENDPOINT_LABELS.has(word)) return word;
  }
  return 'other';
}

/** Writes a JSON answer as Express's res.json would, without Express. */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Readonly<Record<string, string>> = {}): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { ...headers, 'Content-Type': 'application/json; charset=utf-8', 'Content-Length': Buffer.byteLength(text) });
  res.end(text);
}

/** Counts a refused request and answers it with its reason; a 503 tells the sender when to retry. */
export function rejecter(
  metrics: Pick<ControllerMetrics, 'requestsRejected'>,
): (res: ServerResponse, endpoint: string, status: number, reason: string, message: string, headers?: Record<string, string>) => void {
  return (res, endpoint, status, reason, message, headers = {}) => {
    metrics.requestsRejected.inc({ endpoint, reason });
    sendJson(res, status, { error: message }, status === 503 ? { ...headers, 'Retry-After': RETRY_AFTER_SECONDS } : headers);
  };
}

type Endpoint = 'alerts' | 'signals';

/** The two routes served here, with their scopes from the one table (scopes.ts). */
const INTAKE_ROUTES: Readonly<Record<Endpoint, RouteScope>> = { alerts: routeScope('POST', '/api/v1/alerts'), signals: routeScope('POST', '/api/v1/signals') };

/** The endpoint a request is for, when it is one of the two: exact path, optional trailing slash, any query. */
function intakeEndpoint(req: IncomingMessage): Endpoint | undefined {
  if (req.method !== 'POST' || req.url === undefined) return undefined;
  const query = req.url.indexOf('?');
  const path = query === -1 ? req.url : req.url.slice(0, query);
  if (path === '/api/v1/alerts' || path === '/api/v1/alerts/') return 'alerts';
  if (path === '/api/v1/signals' || path === '/api/v1/signals/') return 'signals';
  return undefined;
}

/**
 * A request handler for the intake endpoints: takes the request and returns true when it is one
 * of them, false to leave it to the next handler.
 */
export function intakeHandler(deps: IntakeHttpDeps): (req: IncomingMessage, res: ServerResponse) => boolean {
  const { metrics, logger } = deps;

  const reject = rejecter(metrics);

  async function store(
    res: ServerResponse,
    endpoint: Endpoint,
    signals: Signal[],
    refused: readonly RefusedAlert[] = [],
    progress?: () => Promise<number>,
  ): Promise<void> {
    let progressReports = 0;
    try {
      if (signals.length > 0) await deps.enqueue(signals);
      if (progress) progressReports = await progress();
    } catch (error) {
      if (error instanceof StoreUnavailableError) {
        logger.warn({ endpoint, err: error }, 'Redis unavailable; asking the sender to retry');
        reject(res, endpoint, 503, 'store_unavailable', `signals not stored, retry later: ${error.message}`);
        return;
      }
      throw error;
    }
    for (const signal of signals) metrics.signalsAccepted.inc({ source: signal.source, kind: signal.kind });
    sendJson(res, 202, {
      accepted: signals.length + progressReports,
      ids: signals.map((signal) => signal.id),
      ...(refused.length > 0 ? { refused } : {}),
      ...(progress ? { progress: progressReports } : {}),
    });
  }

  async function alerts(res: ServerResponse, body: unknown, origin: Signal['origin']): Promise<void> {
    const parsed = webhookEnvelopeSchema.safeParse(body);
    if (!parsed.success) {
      reject(res, 'alerts', 400, 'invalid', `invalid Alertmanager webhook payload: ${describeIssues(parsed.error.issues)}`);
      return;
    }
    if (parsed.data.truncatedAlerts) {
      metrics.alertsTruncated.inc(parsed.data.truncatedAlerts);
      logger.warn(
        { truncatedAlerts: parsed.data.truncatedAlerts, groupKey: parsed.data.groupKey?.slice(0, 200) },
        'Alertmanager left alerts out of a webhook (max_alerts); raise it on the steadfast receiver',
      );
    }
    const { signals, refused } = await signalsFromWebhookAlerts(parsed.data, new Date());
    if (refused.length > 0) metrics.alertsRefused.inc(refused.length);
    if (signals.length === 0) {
      const shown = refused
        .slice(0, 20)
        .map((alert) => alert.reason)
        .join('; ');
      reject(
        res,
        'alerts',
        400,
        'invalid',
        `invalid Alertmanager webhook payload: all ${refused.length} alerts refused: ${shown}${refused.length > 20 ? '; …' : ''}`,
      );
      return;
    }
    await store(
      res,
      'alerts',
      signals.map((signal) => ({ ...signal, origin })),
      refused,
    );
  }

  async function fastPath(res: ServerResponse, body: unknown, origin: NonNullable<Signal['origin']>): Promise<void> {
    const parsed = fastPathBodySchema.safeParse(body);
    if (!parsed.success) {
      reject(res, 'signals', 400, 'invalid', `invalid fast-path event: ${describeIssues(parsed.error.issues)}`);
      return;
    }
    const events = Array.isArray(parsed.data) ? parsed.data : [parsed.data];
    // An agent speaks for its own node only; none of a batch is stored if one event is not.
    for (const event of events) requireOwnNode(origin, event.node, 'signals', isTrainingProgress(event) ? 'report training progress' : 'report a fault');
    const now = new Date();
    // Progress is no fault: it is kept beside the job for the progress watch, not queued as a signal.
    const progress = events.filter(isTrainingProgress);
    // A fault dated long before its arrival is refused on its own (an Xid of 2001 is no news to
    // drain a node for); the rest of its batch is taken, as one bad alert does not cost a webhook.
    const faults: FastPathFault[] = [];
    const refused: RefusedAlert[] = [];
    events.forEach((event, index) => {
      if (!isFastPathFault(event)) return;
      const stale = staleFaultTime(event, now.getTime());
      if (stale === undefined) faults.push(event);
      else refused.push({ index, reason: `${Array.isArray(parsed.data) ? `${index}.` : ''}time: ${stale}` });
    });
    if (refused.length > 0) {
      const shown = `${refused
        .slice(0, 20)
        .map((event) => event.reason)
        .join('; ')}${refused.length > 20 ? '; …' : ''}`;
      if (faults.length === 0 && progress.length === 0) {
        reject(res, 'signals', 400, 'invalid', `invalid fast-path event: ${shown}`);
        return;
      }
      logger.warn({ node: events[0]?.node, refused: refused.length, first: refused[0]?.reason }, 'fast-path faults refused: dated long before their arrival');
    }
    const recordProgress = progress.length > 0 ? () => deps.recordProgress(progress, now.getTime()) : undefined;
    await store(
      res,
      'signals',
      faults.map((event) => ({ ...signalFromFastPath(event, now), origin })),
      refused,
      recordProgress,
    );
  }

  async function serve(req: IncomingMessage, res: ServerResponse, endpoint: Endpoint): Promise<void> {
    const line: RequestLine = { method: 'POST', url: req.url ?? '', client: req.socket.remoteAddress ?? 'unknown' };
    // Before authentication, so that guessing tokens is throttled as well.
    if (deps.limiter) {
      const decision = deps.limiter.take(req.socket.remoteAddress ?? 'unknown');
      if (!decision.allowed) {
        reject(res, endpoint, 429, 'rate_limited', rateLimitMessage(deps.limiter.settings, decision.retryAfterSeconds), {
          'Retry-After': String(decision.retryAfterSeconds),
        });
        return;
      }
    }
    const verdict = await authenticate(deps, line, req.headers.authorization, INTAKE_ROUTES[endpoint], clientGone(res));
    if ('status' in verdict) {
      sendJson(res, verdict.status, verdict.body, verdict.headers);
      return;
    }
    const read = await readJsonBody(req, res, deps.body, describeIdentity(verdict.identity));
    if (read !== undefined && !('value' in read)) {
      reject(res, endpoint, read.status, read.reason, read.message);
      return;
    }
    try {
      if (endpoint === 'alerts') await alerts(res, read?.value, verdict.identity);
      else await fastPath(res, read?.value, verdict.identity);
    } catch (error) {
      if (error instanceof ForbiddenError) {
        const refusal = forbidden(deps, line, error.identity, error.scope, error.message);
        sendJson(res, refusal.status, refusal.body);
      } else {
        const failure = await failureAnswer(error, deps.redisUp);
        if (failure.status === 503) logger.warn({ err: error, path: req.url }, 'request failed while the store is unavailable; asking the caller to retry');
        else if (failure.status === 500) logger.error({ err: error, path: req.url }, 'request failed');
        reject(res, endpoint, failure.status, failure.reason, failure.message);
      }
    }
  }

  return (req, res) => {
    const endpoint = intakeEndpoint(req);
    if (endpoint === undefined) return false;
    serve(req, res, endpoint).catch((error: unknown) => answerInternalError(res, endpoint, error, { reject, logger, path: req.url }));
    return true;
  };
}

/**
 * Answers a request whose handling failed in a way no check foresaw (a bug): 500 while nothing
 * of the answer was sent, the connection cut after that; logged either way. Never throws: it is
 * the last catch of a request, which must not let the failure reach the process.
 */
export function answerInternalError(
  res: ServerResponse,
  endpoint: string,
  error: unknown,
  how: { readonly reject: ReturnType<typeof rejecter>; readonly logger: Logger; readonly path: string | undefined },
): void {
  try {
    if (res.headersSent) {
      how.logger.error({ err: error, path: how.path }, 'request failed after its answer began');
      res.destroy();
      return;
    }
    how.logger.error({ err: error, path: how.path }, 'request failed');
    how.reject(res, endpoint, 500, 'internal', 'internal error; see the controller log');
  } catch (failure) {
    how.logger.error({ err: failure, path: how.path }, 'could not answer a failed request');
    res.destroy();
  }
}
