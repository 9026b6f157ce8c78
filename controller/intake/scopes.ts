import type { Role } from '../../core/credentials.js';

/**
 * What each credential may do, in one place: every route of the controller's API has one scope,
 * and each role holds a set of scopes. docs/security.md explains the choices.
 */

export const SCOPES = ['read', 'operate', 'alerts', 'signals', 'node', 'training'] as const;
export type Scope = (typeof SCOPES)[number];

/**
 * read      the audit, jobs, queues (bull-board), restore plans: looking, changing nothing
 * operate   registering jobs, code updates, pause/resume/hold: an operator's changes
 * alerts    POST /api/v1/alerts (Alertmanager's webhook)
 * signals   POST /api/v1/signals (an agent's fast path; only about its own node), and
 *           GET /api/v1/xid-policy (which codes to send on it)
 * node      a standby's polling and self-check (only its own node)
 * training  a job's checkpoint reports, micro-batch plan, hot-swap world and preflight report (only
 *           a job whose member or spare the agent's node is)
 */
export const ROLE_SCOPES: Readonly<Record<Role, readonly Scope[]>> = {
  // The operator's credential is the administrator's: it may also inject an alert or a signal
  // by hand (a drill, a fault seen by eye); its identity is recorded as their origin.
  operator: ['read', 'operate', 'alerts', 'signals', 'node', 'training'],
  'read-only': ['read'],
  alertmanager: ['alerts'],
  agent: ['signals', 'node', 'training'],
};

export interface RouteScope {
  readonly method: 'GET' | 'POST' | 'PUT' | 'DELETE';
  /** The route's path from the controller's root, as the router matches it; `:name` is one path segment. */
  readonly path: string;
  readonly scope: Scope;
  /**
   * For node-bound credentials: the path parameter naming the node the request is about, which
   * must be the credential's own.
   */
  readonly nodeParam?: string;
}

/**
 * Every route of the API with its scope. A route is registered through `apiRoute` (routes.ts),
 * which takes its scope from here by the route's own pattern and checks it in the route's own
 * middleware, on the parameters the router matched: the scope enforced is always that of the
 * handler that runs. A route missing here cannot be registered (the controller does not start).
 */
export const ROUTE_SCOPES: readonly RouteScope[] = [
  { method: 'POST', path: '/api/v1/alerts', scope: 'alerts' },
  { method: 'POST', path: '/api/v1/signals', scope: 'signals' },
  // Which Xid and SXid codes to send on the fast path: agents ask, with the credential they send signals with.
  { method: 'GET', path: '/api/v1/xid-policy', scope: 'signals' },
  { method: 'GET', path: '/api/v1/standby/:node', scope: 'node', nodeParam: 'node' },
  { method: 'POST', path: '/api/v1/standby/:node/self-check', scope: 'node', nodeParam: 'node' },
  { method: 'POST', path: '/api/v1/jobs/:id/checkpoints', scope: 'training' },
  { method: 'GET', path: '/api/v1/jobs/:id/microbatches', scope: 'training' },
  { method: 'GET', path: '/api/v1/jobs/:id/restore-plan', scope: 'training' },
  { method: 'GET', path: '/api/v1/jobs/:id/world', scope: 'training' },
  { method: 'POST', path: '/api/v1/jobs/:id/world', scope: 'training' },
  { method: 'POST', path: '/api/v1/jobs/:id/preflight', scope: 'training' },
  { method: 'GET', path: '/api/v1/audit', scope: 'read' },
  { method: 'GET', path: '/api/v1/queues', scope: 'read' },
  { method: 'GET', path: '/api/v1/jobs', scope: 'read' },
  { method: 'GET', path: '/api/v1/jobs/:id', scope: 'read' },
  { method: 'POST', path: '/api/v1/jobs', scope: 'operate' },
  { method: 'DELETE', path: '/api/v1/jobs/:id', scope: 'operate' },
  { method: 'PUT', path: '/api/v1/jobs/:id/policy', scope: 'operate' },
  { method: 'POST', path: '/api/v1/jobs/:id/code-updates', scope: 'operate' },
  { method: 'GET', path: '/api/v1/pause', scope: 'read' },
  { method: 'POST', path: '/api/v1/pause', scope: 'operate' },
  { method: 'DELETE', path: '/api/v1/pause', scope: 'operate' },
  { method: 'GET', path: '/api/v1/holds', scope: 'read' },
  { method: 'PUT', path: '/api/v1/holds/:node', scope: 'operate' },
  { method: 'DELETE', path: '/api/v1/holds/:node', scope: 'operate' },
  { method: 'GET', path: '/api/v1/nodes/:node/remediations', scope: 'read' },
];

/** The board at /queues (bull-board, a sub-application): reads only, with a read credential. */
export const QUEUE_BOARD_SCOPE: Scope = 'read';

/** The table's entry for a route being registered. Throws when the route has none: every route needs its scope. */
export function routeScope(method: string, path: string): RouteScope {
  const upper = method.toUpperCase();
  const route = ROUTE_SCOPES.find((entry) => entry.method === upper && entry.path === path);
  if (!route) throw new Error(`route ${upper} ${path} has no scope: add it to ROUTE_SCOPES (controller/intake/scopes.ts)`);
  return route;
}

export function roleHasScope(role: Role, scope: Scope): boolean {
  return ROLE_SCOPES[role].includes(scope);
}
