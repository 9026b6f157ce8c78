import type { IRouter, NextFunction, Request, RequestHandler, Response } from 'express';
import { ForbiddenError, identityOf, requireOwnNode, scopeRefusal } from './auth.js';
import { routeScope, type RouteScope } from './scopes.js';

/**
 * Registers the API's routes with their scope (scopes.ts) as part of the route itself: the
 * route's first handler checks the caller's credential against the scope of this route, and a
 * node-bound credential against the node parameter the router matched. Whatever request target
 * reached the handler, the scope checked is the one of the handler that runs. Every route of the
 * API is registered here; one that scopes.ts does not list fails at start.
 */

export const API_ROOT = '/api/v1';

type Method = 'get' | 'post' | 'put' | 'delete';

/**
 * `router.<method>(path, …handlers)` behind the scope check of `API_ROOT + path`, and the body
 * read only past it: a credential without the scope gets its 403 before a byte of the body is
 * read or parsed.
 */
export function apiRoute(router: IRouter, method: Method, path: string, ...handlers: RequestHandler[]): void {
  const route = routeScope(method, `${API_ROOT}${path}`);
  router[method](path, requireScope(route), readBody, ...handlers);
}

const BODY_READER = 'steadfastBodyReader';

/** Reads a request's body into `req.body`, then calls next, or answers a refusal itself (request-body.ts's jsonBody). */
type BodyReader = (req: Request, res: Response, next: NextFunction) => void;

/** The app's middleware (server.ts) that gives the API's routes `reader` to read a request's body with. */
export function provideBodyReader(reader: BodyReader): RequestHandler {
  return (_req: Request, res: Response, next: NextFunction) => {
    res.locals[BODY_READER] = reader;
    next();
  };
}

/** Reads the body with the reader the app provided; without one (a router mounted on its own) the body is left unread. */
function readBody(req: Request, res: Response, next: NextFunction): void {
  const reader = res.locals[BODY_READER] as BodyReader | undefined;
  if (reader === undefined) {
    next();
    return;
  }
  reader(req, res, next);
}

/** The middleware that holds a request to `route`'s scope; refusals go to the app's ForbiddenError handler (403, audited). */
export function requireScope(route: Pick<RouteScope, 'path' | 'scope' | 'nodeParam'> & { readonly method: string }): RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    const identity = identityOf(res);
    // The path as sent: a plain path by now (request-target.ts), so the one the router matched.
    const refusal = scopeRefusal(identity, route.scope, `${req.method} ${req.originalUrl.split('?')[0] ?? ''}`);
    if (refusal !== undefined) {
      next(new ForbiddenError(identity, route.scope, refusal));
      return;
    }
    const node = route.nodeParam === undefined ? undefined : req.params[route.nodeParam];
    try {
      if (node !== undefined) requireOwnNode(identity, String(node), route.scope, req.method);
    } catch (error) {
      next(error);
      return;
    }
    next();
  };
}
