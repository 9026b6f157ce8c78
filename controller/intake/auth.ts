import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';
import type { AuditLog } from '../../core/audit.js';
import {
  ReviewUnavailableError,
  ReviewsRateLimitedError,
  TokenRefusedError,
  describeIdentity,
  presentedToken,
  type Credentials,
  type Identity,
} from '../../core/credentials.js';
import { errorMessage } from '../../core/errors.js';
import type { Logger } from '../../core/log.js';
import { ClientRateLimiter, type RateLimitSettings } from '../../core/rate-limit.js';
import { roleHasScope, type RouteScope, type Scope } from './scopes.js';

/**
 * Who may call what: every request past the open endpoints (/healthz, /metrics) is identified by
 * its credential (401 when it has none that the controller knows); the route that serves it then
 * checks that credential against its own scope (routes.ts, scopes.ts; 403 naming the role and
 * the scope needed). Refusals of a known credential are audited, at a bounded rate.
 */

/** A request refused for acting outside its credential, found after the route table (a body naming another node). */
export class ForbiddenError extends Error {
  constructor(
    readonly identity: Identity,
    readonly scope: Scope,
    message: string,
  ) {
    super(message);
    this.name = 'ForbiddenError';
  }
}

const IDENTITY = 'steadfastIdentity';

/** The identity the auth middleware found for this request. */
export function identityOf(res: Response): Identity {
  const identity = res.locals[IDENTITY] as Identity | undefined;
  if (!identity) throw new Error('identityOf called on a route the auth middleware does not guard');
  return identity;
}

/** Throws ForbiddenError when a node-bound identity speaks about another node. */
export function requireOwnNode(identity: Identity, node: string | undefined, scope: Scope, what: string): void {
  if (identity.node === undefined) return;
  if (node !== identity.node) {
    throw new ForbiddenError(
      identity,
      scope,
      `${describeIdentity(identity)} may not ${what} about ${node === undefined ? 'no node' : `node ${node}`}: its credential is bound to ${identity.node}`,
    );
  }
}

/** Refusals audited per identity: a burst, then one a second; the rest are counted in the next entry. */
const AUDIT_RATE: RateLimitSettings = { requestsPerSecond: 1, burst: 10 };
/** Across all identities, so that many nodes at once cannot fill the audit either. */
const AUDIT_RATE_ALL: RateLimitSettings = { requestsPerSecond: 5, burst: 50 };
const AUDITED_PATH_MAX = 256;
/** Tokens another party refused or could not check, logged: a burst, then one a second; the rest are counted in the next line. */
const UNCHECKED_LOG_RATE: RateLimitSettings = { requestsPerSecond: 1, burst: 20 };

export class AccessAudit {
  private readonly perIdentity = new ClientRateLimiter(AUDIT_RATE, { maxClients: 1000 });
  private readonly overall = new ClientRateLimiter(AUDIT_RATE_ALL);
  private suppressed = 0;
  private readonly uncheckedLog = new ClientRateLimiter(UNCHECKED_LOG_RATE);
  private uncheckedSuppressed = 0;

  constructor(
    private readonly audit: AuditLog,
    private readonly logger: Logger,
  ) {}

  /** Writes an audit entry for the refusal unless the rate is exceeded; never throws. */
  refused(identity: Identity, req: RequestLine, scope: Scope, reason: string): void {
    const who = describeIdentity(identity);
    if (!this.perIdentity.take(who).allowed || !this.overall.take('all').allowed) {
      this.suppressed += 1;
      return;
    }
    const suppressedBefore = this.suppressed;
    this.suppressed = 0;
    const path = (req.url.split('?')[0] ?? '').slice(0, AUDITED_PATH_MAX);
    const entry = {
      type: 'access' as const,
      ref: `denied-${randomUUID()}`,
      node: identity.node,
      summary: `refused ${who}: ${req.method} ${path} (${reason})`,
      actor: identity,
      data: { method: req.method, path, scope, reason, ...(suppressedBefore > 0 ? { suppressedBefore } : {}) },
    };
    this.audit.append(entry, entry.ref).catch((error: unknown) => {
      this.logger.warn({ err: errorMessage(error), identity: who, path }, 'could not audit a refused request');
    });
  }

  /**
   * Logs why a token sent for review was refused or could not be checked (what the API server
   * said), which the sender is not told: it has shown no credential yet. At a bounded rate, as
   * anyone can send such tokens.
   */
  unverified(req: RequestLine, outcome: 'refused' | 'unchecked', reason: string): void {
    if (!this.uncheckedLog.take('all').allowed) {
      this.uncheckedSuppressed += 1;
      return;
    }
    const suppressedBefore = this.uncheckedSuppressed;
    this.uncheckedSuppressed = 0;
    const fields = {
      client: req.client,
      method: req.method,
      path: (req.url.split('?')[0] ?? '').slice(0, AUDITED_PATH_MAX),
      reason,
      ...(suppressedBefore > 0 ? { suppressedBefore } : {}),
    };
    if (outcome === 'unchecked') this.logger.warn(fields, 'a token could not be checked; answered 503');
    else this.logger.info(fields, 'a token was refused; answered 401');
  }
}

export interface AuthorizeDeps {
  readonly credentials: Credentials;
  readonly access: AccessAudit;
  /** Counts a refusal (401, 403, or 429 for too many unknown tokens) in the rejected-requests metric. */
  readonly onReject: (req: RequestLine, reason: RejectReason) => void;
  /** Take the token as an HTTP Basic password too, and challenge with Basic (pages a browser opens). */
  readonly basic?: boolean;
}

/** Why a request was refused before its route ran, as counted in the rejected-requests metric. */
export type RejectReason = 'unauthorized' | 'forbidden' | 'rate_limited';

/** What a refusal is told about the request: its method, the URL as sent (path and query), and the client's address. */
export interface RequestLine {
  readonly method: string;
  readonly url: string;
  /** The remote address: tokens sent for review are rate-limited per client. */
  readonly client: string;
}

/**
 * The answer to a request refused by authentication or authorization: status, headers and JSON
 * body. 503: the credential could not be checked now (the Kubernetes API server did not answer a
 * token review); refused all the same, with Retry-After so that the sender tries again. 429: the
 * client sent too many tokens for review lately.
 */
export interface Refusal {
  readonly status: 401 | 403 | 429 | 503;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: Readonly<Record<string, unknown>>;
}

/** Counts and audits a 403 for a credential used outside its scope, and says what to answer. */
export function forbidden(deps: Pick<AuthorizeDeps, 'access' | 'onReject'>, req: RequestLine, identity: Identity, scope: Scope, message: string): Refusal {
  deps.onReject(req, 'forbidden');
  deps.access.refused(identity, req, scope, message);
  return { status: 403, headers: {}, body: { error: message, role: identity.role, ...(identity.node ? { node: identity.node } : {}), scope } };
}

/** Sends the 403 for a credential used outside its scope, counted and audited. */
export function sendForbidden(
  deps: Pick<AuthorizeDeps, 'access' | 'onReject'>,
  req: Request,
  res: Response,
  identity: Identity,
  scope: Scope,
  message: string,
): void {
  const refusal = forbidden(deps, { method: req.method, url: req.originalUrl, client: req.socket.remoteAddress ?? 'unknown' }, identity, scope, message);
  res.status(refusal.status).json(refusal.body);
}

/** Seconds a sender waits before retrying a request whose token could not be reviewed. */
const REVIEW_RETRY_AFTER_SECONDS = 5;

/**
 * Who sent the request (its Authorization header): the identity, or the refusal to answer
 * (already counted). A token the controller does not know itself goes to the credentials'
 * reviewer when it has that reviewer's form; an error there refuses the request, never lets it
 * pass. Why a review refused or failed is logged, never told to the sender: it has not shown a
 * credential, and the API server's words are not for strangers. Shared by the Express middleware
 * below and the intake's own request handler.
 */
export async function identify(
  deps: AuthorizeDeps,
  req: RequestLine,
  authorization: string | undefined,
  gone?: AbortSignal,
): Promise<{ identity: Identity } | Refusal> {
  const presented = presentedToken(authorization ?? '');
  const usable = presented && (presented.scheme === 'bearer' || deps.basic) ? presented.token : undefined;
  const known = usable === undefined ? undefined : deps.credentials.identify(usable);
  if (known) return { identity: known };
  const reviewer = deps.credentials.reviewer;
  if (usable !== undefined && reviewer?.accepts(usable)) {
    try {
      return { identity: await reviewer.review(usable, req.client, gone) };
    } catch (error) {
      if (error instanceof ReviewsRateLimitedError) {
        deps.onReject(req, 'rate_limited');
        return { status: 429, headers: { 'Retry-After': String(error.retryAfterSeconds) }, body: { error: error.message } };
      }
      deps.onReject(req, 'unauthorized');
      if (error instanceof ReviewUnavailableError) {
        deps.access.unverified(req, 'unchecked', error.message);
        return {
          status: 503,
          headers: { 'Retry-After': String(REVIEW_RETRY_AFTER_SECONDS) },
          body: { error: 'credentials could not be checked now; retry later' },
        };
      }
      if (!(error instanceof TokenRefusedError)) throw error;
      deps.access.unverified(req, 'refused', error.message);
    }
  } else {
    deps.onReject(req, 'unauthorized');
  }
  const hint = deps.basic ? 'send "Authorization: Bearer <token>" or the token as the Basic-auth password' : 'send "Authorization: Bearer <token>"';
  return {
    status: 401,
    headers: { 'WWW-Authenticate': deps.basic ? 'Basic realm="steadfast"' : 'Bearer realm="steadfast"' },
    body: { error: usable === undefined ? `missing credentials: ${hint}` : 'invalid bearer token' },
  };
}

/**
 * The caller's identity, when it holds the scope of `route` (a route without a node parameter):
 * else the refusal to answer, counted, and audited when it is a 403. For the intake's own
 * request handler, which serves exactly the routes it is given.
 */
export async function authenticate(
  deps: AuthorizeDeps,
  req: RequestLine,
  authorization: string | undefined,
  route: RouteScope,
  gone?: AbortSignal,
): Promise<{ identity: Identity } | Refusal> {
  const verdict = await identify(deps, req, authorization, gone);
  if ('status' in verdict) return verdict;
  const { identity } = verdict;
  const refusal = scopeRefusal(identity, route.scope, `${req.method} ${req.url.split('?')[0] ?? ''}`);
  return refusal === undefined ? { identity } : forbidden(deps, req, identity, route.scope, refusal);
}

/** Why `identity` may not do `what` (method and path) that needs `scope`; undefined when it may. */
export function scopeRefusal(identity: Identity, scope: Scope, what: string): string | undefined {
  if (identity.role !== 'controller' && roleHasScope(identity.role, scope)) return undefined;
  return `role ${identity.role} may not ${what}: it needs scope "${scope}"`;
}

/** Fires when the client of `res` goes away before its answer is sent: what it waits for (a token review) may be abandoned. */
export function clientGone(res: ServerResponse): AbortSignal {
  const gone = new AbortController();
  res.once('close', () => {
    if (!res.writableFinished) gone.abort();
  });
  return gone.signal;
}

/** Express middleware: identifies the caller (401 otherwise); each route then checks its own scope (routes.ts). */
export function authorize(deps: AuthorizeDeps): (req: Request, res: Response, next: NextFunction) => void {
  return (req, res, next) => {
    identify(deps, { method: req.method, url: req.originalUrl, client: req.socket.remoteAddress ?? 'unknown' }, req.get('authorization'), clientGone(res)).then(
      (verdict) => {
        if ('status' in verdict) {
          res.status(verdict.status).set(verdict.headers).json(verdict.body);
          return;
        }
        res.locals[IDENTITY] = verdict.identity;
        next();
      },
      next,
    );
  };
}
