import { randomBytes } from 'node:crypto';
import type { RecordedExchange } from './kube-api.js';

/**
 * Kubernetes service-account tokens as agents present them, and the TokenReviews the controller
 * sends about them with the API server's answers, for the stand-in API server (kube-api.ts).
 */

export const AUDIENCE = 'steadfast-controller';
export const AGENT_USER = 'system:serviceaccount:steadfast:steadfast-agent';
/** The tests' clock starts now, whole seconds, as the tokens' own times are. */
export const START = Math.floor(Date.now() / 1000) * 1000;

export interface Bound {
  readonly node?: string;
  readonly pod?: string;
  readonly podUid?: string;
}

/**
 * A projected service-account token as the kubelet writes it: a JWT whose claims name the
 * audience, the service account and the pod (and, from Kubernetes 1.30, the node). Its signature
 * is random: only the stand-in API server judges it, as only the real one would.
 */
export function projectedToken(options: { audiences?: string[]; expiresInSeconds?: number; bound?: Bound } = {}): string {
  const now = Math.floor(START / 1000);
  const header = { alg: 'RS256', kid: 'test-key' };
  const payload = {
    aud: options.audiences ?? [AUDIENCE],
    exp: now + (options.expiresInSeconds ?? 3600),
    iat: now,
    nbf: now,
    iss: 'https://kubernetes.default.svc.cluster.local',
    sub: AGENT_USER,
    'kubernetes.io': {
      namespace: 'steadfast',
      serviceaccount: { name: 'steadfast-agent', uid: '5e1d2a3b-0000-4000-8000-000000000001' },
      pod: { name: options.bound?.pod ?? 'steadfast-agent-x7k2p', uid: options.bound?.podUid ?? 'a7c3e1f0-0000-4000-8000-000000000002' },
      ...(options.bound?.node ? { node: { name: options.bound.node, uid: 'c0ffee00-0000-4000-8000-000000000003' } } : {}),
    },
  };
  const part = (value: object): string => Buffer.from(JSON.stringify(value)).toString('base64url');
  return `${part(header)}.${part(payload)}.${randomBytes(256).toString('base64url')}`;
}

/** The TokenReview the controller sends for `token`, and the API server's answer (authentication.k8s.io/v1, as a 1.30+ server writes it). */
export function tokenReview(
  token: string,
  answer: { username?: string; bound?: Bound; audiences?: string[] } | { error: string } | { status: number; message: string },
): RecordedExchange {
  const request = {
    method: 'POST' as const,
    path: '/apis/authentication.k8s.io/v1/tokenreviews',
    body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, audiences: [AUDIENCE] } },
  };
  if ('status' in answer) {
    return {
      request,
      response: {
        status: answer.status,
        body: { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: answer.message, reason: 'Forbidden', code: answer.status },
      },
    };
  }
  const spec = { token, audiences: [AUDIENCE] };
  const head = { kind: 'TokenReview', apiVersion: 'authentication.k8s.io/v1', metadata: { creationTimestamp: null }, spec };
  if ('error' in answer) return { request, response: { status: 201, body: { ...head, status: { user: {}, error: answer.error } } } };
  const bound = answer.bound ?? { node: 'gpu-a01' };
  const extra: Record<string, string[]> = {
    'authentication.kubernetes.io/credential-id': [`JTI=${randomBytes(8).toString('hex')}`],
    ...(bound.node
      ? { 'authentication.kubernetes.io/node-name': [bound.node], 'authentication.kubernetes.io/node-uid': ['c0ffee00-0000-4000-8000-000000000003'] }
      : {}),
    'authentication.kubernetes.io/pod-name': [bound.pod ?? 'steadfast-agent-x7k2p'],
    'authentication.kubernetes.io/pod-uid': [bound.podUid ?? 'a7c3e1f0-0000-4000-8000-000000000002'],
  };
  return {
    request,
    response: {
      status: 201,
      body: {
        ...head,
        status: {
          authenticated: true,
          user: {
            username: answer.username ?? AGENT_USER,
            uid: '5e1d2a3b-0000-4000-8000-000000000001',
            groups: ['system:serviceaccounts', 'system:serviceaccounts:steadfast', 'system:authenticated'],
            extra,
          },
          audiences: answer.audiences ?? [AUDIENCE],
        },
      },
    },
  };
}

/** GET of the agent's pod, as the API server answers it (the fields the controller reads, and some around them). */
export function podRead(name: string, uid: string, nodeName: string): RecordedExchange {
  return {
    request: { method: 'GET', path: `/api/v1/namespaces/steadfast/pods/${name}` },
    response: {
      status: 200,
      body: {
        kind: 'Pod',
        apiVersion: 'v1',
        metadata: { name, namespace: 'steadfast', uid, labels: { 'app.kubernetes.io/name': 'steadfast', 'app.kubernetes.io/component': 'agent' } },
        spec: { nodeName, serviceAccountName: 'steadfast-agent', containers: [{ name: 'agent', image: 'steadfast-agent:0.1.0' }] },
        status: { phase: 'Running' },
      },
    },
  };
}
