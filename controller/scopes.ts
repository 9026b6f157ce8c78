import type { Role } from '../core/credentials.js';

/**
 * What each credential may do, in one place: every route of the controller's API maps to one
 * scope by method and path pattern, and each role holds a set of scopes. A route added later
 * gets its scope here, or by default the safe one: `operate` for a write, `read` for a read.
 * docs/security.md explains the choices.
 */

export const SCOPES = ['read', 'operate', 'alerts', 'signals', 'node', 'training'] as const;
export type Scope = (typeof SCOPES)[number];

/**
 * read      the audit, jobs, queues (bull-board), restore plans: looking, changing nothing
 * operate   registering jobs, code updates, pause/resume/hold: an operator's changes
 * alerts    POST /api/v1/alerts (Alertmanager's webhook)
 * signals   POST /api/v1/signals (an agent's fast path; only about its own node)
 * node      a standby's polling and self-check (only its own node)
 * training  a job's checkpoint reports and micro-batch plan (only a job on the agent's node)
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
  readonly method: string;
  /** Path under the controller's root; `:name` matches one path segment, a trailing `*` the rest. */
  readonly path: string;
  readonly scope: Scope;
  /**
   * For node-bound credentials: the path parameter naming the node the request is about, which
   * must be the credential's own.
   */
  readonly nodeParam?: string;
}

/** Matched top to bottom; the first match wins. */
export const ROUTE_SCOPES: readonly RouteScope[] = [
  { method: 'POST', path: '/api/v1/alerts', scope: 'alerts' },
  { method: 'POST', path: '/api/v1/signals', scope: 'signals' },
  { method: 'GET', path: '/api/v1/standby/:node', scope: 'node', nodeParam: 'node' },
  { method: 'POST', path: '/api/v1/standby/:node/self-check', scope: 'node', nodeParam: 'node' },
  { method: 'POST', path: '/api/v1/jobs/:id/checkpoints', scope: 'training' },
  { method: 'GET', path: '/api/v1/jobs/:id/microbatches', scope: 'training' },
  { method: 'GET', path: '/api/v1/jobs/:id/restore-plan', scope: 'training' },
  { method: 'GET', path: '/api/v1/audit', scope: 'read' },
  { method: 'GET', path: '/api/v1/jobs', scope: 'read' },
  { method: 'GET', path: '/api/v1/jobs/:id', scope: 'read' },
  { method: 'GET', path: '/queues/*', scope: 'read' },
  { method: 'HEAD', path: '/queues/*', scope: 'read' },
];

const READS = new Set(['GET', 'HEAD', 'OPTIONS']);

export interface ScopeMatch {
  readonly scope: Scope;
  /** The node the request is about, by the route's nodeParam; undefined when the route names none. */
  readonly node?: string | undefined;
}

/** The scope a request needs: its route's, else `read` for a read and `operate` for anything else. */
export function scopeFor(method: string, path: string): ScopeMatch {
  const upper = method.toUpperCase();
  const segments = splitPath(path);
  for (const route of ROUTE_SCOPES) {
    if (route.method !== upper) continue;
    const params = matchPath(splitPath(route.path), segments);
    if (params) return { scope: route.scope, node: route.nodeParam === undefined ? undefined : params.get(route.nodeParam) };
  }
  return { scope: READS.has(upper) ? 'read' : 'operate' };
}

export function roleHasScope(role: Role, scope: Scope): boolean {
  return ROLE_SCOPES[role].includes(scope);
}

function splitPath(path: string): string[] {
  return path.split('/').filter((segment) => segment !== '');
}

function matchPath(pattern: readonly string[], segments: readonly string[]): Map<string, string> | undefined {
  const params = new Map<string, string>();
  for (const [index, part] of pattern.entries()) {
    if (part === '*') return params;
    const segment = segments[index];
    if (segment === undefined) return undefined;
    if (part.startsWith(':')) {
      let decoded: string;
      try {
        decoded = decodeURIComponent(segment);
      } catch {
        return undefined;
      }
      params.set(part.slice(1), decoded);
    } else if (part !== segment) {
      return undefined;
    }
  }
  return segments.length === pattern.length ? params : undefined;
}
