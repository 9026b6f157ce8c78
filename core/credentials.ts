import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { z } from 'zod';
import { RetryLaterError } from './errors.js';
import { NODE_NAME_PATTERN } from './names.js';

/**
 * Who a request comes from. Each role holds its own credential (docs/security.md, threat model):
 * an agent's is bound to its node, the others are not. The identity travels with what the
 * request causes (a signal's origin, an audit entry's actor), so the audit says who did it.
 */

export const ROLES = ['operator', 'read-only', 'alertmanager', 'agent'] as const;
export type Role = (typeof ROLES)[number];

export const identitySchema = z
  .object({
    role: z.enum([...ROLES, 'controller']),
    /** The node an agent credential is bound to. */
    node: z.string().regex(NODE_NAME_PATTERN).optional(),
  })
  .strict();

/** A credential's holder; `controller` is the controller itself (its own analyzers and timers). */
export type Identity = z.infer<typeof identitySchema>;

/** The controller acting on its own: timers, analyzers, the standby pool. */
export const CONTROLLER_IDENTITY: Identity = { role: 'controller' };

/** One line naming an identity: `agent node-1`, `operator`. */
export function describeIdentity(identity: Identity): string {
  return identity.node === undefined ? identity.role : `${identity.role} ${identity.node}`;
}

/** Shortest shared secret the agents' tokens are derived from. */
export const AGENT_SECRET_MIN_LENGTH = 32;

const AGENT_MAC_HEX_LENGTH = 64;

/**
 * A node's agent token: `<node>.<hex HMAC-SHA256(secret, node)>`. The controller holds only the
 * secret and recomputes the MAC, so it keeps no per-node list and a node's token proves that node.
 */
export function agentTokenFor(secret: string, node: string): string {
  if (!NODE_NAME_PATTERN.test(node)) throw new RangeError(`not a node name: ${JSON.stringify(node)}`);
  return `${node}.${agentMac(secret, node)}`;
}

function agentMac(secret: string, node: string): string {
  return createHmac('sha256', secret).update(`steadfast-agent:${node}`).digest('hex');
}

/**
 * Splits a presented token of the agent form into its node and MAC; undefined for anything else
 * (a static token, garbage). The MAC has no dot, so the node is everything before the last one.
 */
export function parseAgentToken(token: string): { node: string; mac: string } | undefined {
  const dot = token.lastIndexOf('.');
  if (dot <= 0) return undefined;
  const node = token.slice(0, dot);
  const mac = token.slice(dot + 1);
  if (!NODE_NAME_PATTERN.test(node) || mac.length !== AGENT_MAC_HEX_LENGTH || !/^[0-9a-f]+$/.test(mac)) return undefined;
  return { node, mac };
}

/**
 * The token in an Authorization header: a bearer token, or the password of Basic credentials
 * (what a browser sends to bull-board). Undefined when the header holds neither.
 */
export function presentedToken(header: string): { scheme: 'bearer' | 'basic'; token: string } | undefined {
  const bearer = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
  if (bearer?.[1]) return { scheme: 'bearer', token: bearer[1] };
  const basic = /^Basic[ \t]+([A-Za-z0-9+/=]+)[ \t]*$/i.exec(header);
  if (!basic?.[1]) return undefined;
  const decoded = Buffer.from(basic[1], 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  const password = colon === -1 ? '' : decoded.slice(colon + 1);
  return password === '' ? undefined : { scheme: 'basic', token: password };
}

function digest(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}

/** The credentials a controller accepts, by role; a role left out has no credential at all. */
export interface CredentialSecrets {
  readonly operator?: string | undefined;
  readonly readOnly?: string | undefined;
  readonly alertmanager?: string | undefined;
  readonly agentSecret?: string | undefined;
}

/**
 * A credential another party vouches for, asked per token: a Kubernetes service-account token,
 * reviewed by the API server (controller/kubernetes-agents.ts). Only tokens of its form go to it.
 */
export interface TokenReviewer {
  /** Whether the token has this reviewer's form (a JWT); others are not sent anywhere. */
  accepts(token: string): boolean;
  /**
   * The holder of a token sent by `client` (the sender's address: how many tokens never seen
   * before one sender may have reviewed is bounded). Throws TokenRefusedError when the token is
   * not good, ReviewUnavailableError when nobody could say, ReviewsRateLimitedError when this
   * client has sent too many unknown tokens lately. `gone` fires when the request's client has
   * gone away: a review nobody waits for any more may be abandoned.
   */
  review(token: string, client: string, gone?: AbortSignal): Promise<Identity>;
}

/** A reviewed token is not good for this controller; the message says why, for the log (the sender reads a bare 401). */
export class TokenRefusedError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'TokenRefusedError';
  }
}

/** A token could not be reviewed now (the API server unreachable); refused, and the sender should retry (503). The message is for the log. */
export class ReviewUnavailableError extends RetryLaterError {
  constructor(message: string, cause?: unknown) {
    super(message, cause);
    this.name = 'ReviewUnavailableError';
  }
}

/** A client sent more tokens for review than it may (answered 429); it may try again after retryAfterSeconds. */
export class ReviewsRateLimitedError extends RetryLaterError {
  constructor(
    readonly retryAfterSeconds: number,
    message: string,
  ) {
    super(message);
    this.name = 'ReviewsRateLimitedError';
  }
}

/**
 * Tells who holds a presented token, in constant time per comparison (digests compared, so
 * lengths leak nothing; every static token is compared, so the order leaks nothing either).
 */
export class Credentials {
  private readonly statics: { role: Role; digest: Buffer }[];
  private readonly agentSecret: string | undefined;

  constructor(
    secrets: CredentialSecrets,
    /** Agents' tokens checked elsewhere (Kubernetes service-account tokens), besides agentSecret's. */
    readonly reviewer?: TokenReviewer,
  ) {
    const statics: { role: Role; digest: Buffer }[] = [];
    if (secrets.operator) statics.push({ role: 'operator', digest: digest(secrets.operator) });
    if (secrets.readOnly) statics.push({ role: 'read-only', digest: digest(secrets.readOnly) });
    if (secrets.alertmanager) statics.push({ role: 'alertmanager', digest: digest(secrets.alertmanager) });
    const seen = new Set<string>();
    for (const entry of statics) {
      const hex = entry.digest.toString('hex');
      if (seen.has(hex)) throw new RangeError('two roles share one token; give each role its own');
      seen.add(hex);
    }
    this.statics = statics;
    this.agentSecret = secrets.agentSecret || undefined;
    if (this.statics.length === 0 && this.agentSecret === undefined && reviewer === undefined) throw new RangeError('no credential configured');
  }

  /** The roles that have a credential. */
  get roles(): Role[] {
    return [...this.statics.map((entry) => entry.role), ...(this.agentSecret || this.reviewer ? (['agent'] as const) : [])];
  }

  identify(token: string): Identity | undefined {
    const given = digest(token);
    let found: Role | undefined;
    for (const entry of this.statics) {
      if (timingSafeEqual(given, entry.digest)) found = entry.role;
    }
    if (found) return { role: found };
    const agent = this.agentSecret === undefined ? undefined : parseAgentToken(token);
    if (agent && this.agentSecret !== undefined) {
      const expected = Buffer.from(agentMac(this.agentSecret, agent.node), 'hex');
      if (timingSafeEqual(Buffer.from(agent.mac, 'hex'), expected)) return { role: 'agent', node: agent.node };
    }
    return undefined;
  }
}
