import { createHash } from 'node:crypto';
import { ApiException, AuthenticationV1Api, CoreV1Api, type Configuration, type ConfigurationOptions, type HttpLibrary } from '@kubernetes/client-node';
import { z } from 'zod';
import type { KubernetesAgentsConfig } from '../core/auth-config.js';
import type { Config } from '../core/config.js';
import { ReviewUnavailableError, ReviewsRateLimitedError, TokenRefusedError, type Identity, type TokenReviewer } from '../core/credentials.js';
import { errorMessage } from '../core/errors.js';
import { NODE_NAME_PATTERN } from '../core/names.js';
import { ClientRateLimiter } from '../core/rate-limit.js';
import { describeIssues } from '../core/validate.js';
import { kubernetesConnection } from '../actuators/backend-from-config.js';
import { kubernetesApiConfiguration } from '../actuators/kubernetes.js';
import { serverMessage } from '../actuators/kubernetes-errors.js';

/**
 * Agents on Kubernetes prove who they are with their pod's projected service-account token
 * (deploy/kubernetes/agent.yaml: a `serviceAccountToken` volume with the controller's audience),
 * which the kubelet rotates and binds to the pod. The controller asks the API server about each
 * token it has not seen lately (a TokenReview, authentication.k8s.io/v1) and accepts it when
 *   - the API server authenticated it for the controller's audience,
 *   - it is the agents' service account's (`system:serviceaccount:<namespace>:<name>`), and
 *   - it is bound to a pod, whose node is the node the identity speaks for: the review's
 *     `authentication.kubernetes.io/node-name` (Kubernetes 1.30 and later put it there), else the
 *     `spec.nodeName` of the pod the review names, read and matched by its uid.
 * The identity is bound to that node like an agentSecret token (intake/auth.ts, requireOwnNode), so each
 * pod's credential speaks for its own node only, and no Secret holds every node's token.
 *
 * A token found good is remembered until the sooner of cacheSeconds and its own expiry, a token
 * the API server refused for refusedCacheSeconds; failures are never remembered, and a review
 * that cannot be made refuses the request (503, retried by the sender), never lets it through.
 *
 * Anyone can present a token of the right form, so what a stranger can make the controller ask
 * is bounded: per client address, tokens never found good go to review at reviewRateLimit (429
 * past it); they may hold UNKNOWN_REVIEWS_IN_FLIGHT of the MAX_REVIEWS_IN_FLIGHT reviews at once,
 * and the rest stay free for tokens found good before (an agent renewing after cacheSeconds),
 * which no rate limit holds back; and SUCCESSOR_REVIEWS_IN_FLIGHT more for the kubelet's next
 * token of a pod whose token was found good (it names that pod: a claim read unverified, so one
 * such review per pod at a time).
 */

const EXTRA_NODE_NAME = 'authentication.kubernetes.io/node-name';
const EXTRA_POD_NAME = 'authentication.kubernetes.io/pod-name';
const EXTRA_POD_UID = 'authentication.kubernetes.io/pod-uid';
/** A projected service-account token is about a kilobyte; a longer one is not sent anywhere. */
const MAX_TOKEN_LENGTH = 16 * 1024;
const JWT_FORM = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$/;
/** Reviews in flight at once (a burst of agents after a controller restart); past it, 503. */
const MAX_REVIEWS_IN_FLIGHT = 256;
/** Of those, what tokens never found good may hold; the rest are kept for renewals of tokens found good. */
const UNKNOWN_REVIEWS_IN_FLIGHT = 192;
/**
 * Beyond those, what the kubelet's next tokens of pods whose token was found good may hold, one
 * per pod (its claim is read unverified: a stranger naming a known pod holds one of these at
 * most); the last MAX - UNKNOWN - SUCCESSOR slots are for renewals alone.
 */
const SUCCESSOR_REVIEWS_IN_FLIGHT = 32;
/** A token found good without an expiry of its own counts as known this long. */
const KNOWN_WITHOUT_EXPIRY_MS = 3600_000;

export interface KubernetesAgentTokensOptions extends KubernetesAgentsConfig {
  /** The milliseconds clock; tests pass their own. */
  readonly now?: () => number;
}

interface Remembered {
  readonly identity: Identity;
  /** Served from memory until then. */
  readonly trustedUntil: number;
  /** Until then (the token's own expiry) a renewal is reviewed before unknown tokens, whatever the rate limit. */
  readonly knownUntil: number;
}

/** The claims read from a token before its review, only to skip hopeless reviews and to bound the cache; never to accept it. */
interface UnverifiedClaims {
  readonly audiences: readonly string[];
  readonly expiresAt: number | undefined;
  /** The pod the token says it is bound to (`kubernetes.io.pod.uid`). */
  readonly podUid: string | undefined;
}

function unverifiedClaims(token: string): UnverifiedClaims | undefined {
  try {
    const payload: unknown = JSON.parse(Buffer.from(token.split('.')[1] ?? '', 'base64url').toString('utf8'));
    if (typeof payload !== 'object' || payload === null) return undefined;
    const { aud, exp, 'kubernetes.io': bound } = payload as { aud?: unknown; exp?: unknown; 'kubernetes.io'?: { pod?: { uid?: unknown } } };
    const audiences = typeof aud === 'string' ? [aud] : Array.isArray(aud) ? aud.filter((entry): entry is string => typeof entry === 'string') : [];
    const podUid = bound?.pod?.uid;
    return { audiences, expiresAt: typeof exp === 'number' ? exp * 1000 : undefined, podUid: typeof podUid === 'string' ? podUid : undefined };
  } catch {
    return undefined;
  }
}

/**
 * The fields of a TokenReview's status the controller reads, checked as the API server should
 * send them (authentication.k8s.io/v1): the client library passes through whatever types came.
 */
const reviewStatusSchema = z.object({
  authenticated: z.boolean().optional(),
  error: z.string().optional(),
  audiences: z.array(z.string()).optional(),
  user: z
    .object({
      username: z.string().optional(),
      extra: z.record(z.string(), z.array(z.string())).optional(),
    })
    .optional(),
});

type ReviewStatus = z.infer<typeof reviewStatusSchema>;

/** What a review found: the holder, and the pod its token is bound to (as the API server says). */
interface Reviewed {
  readonly identity: Identity;
  readonly podUid: string | undefined;
}

/** A review under way, and the requests waiting for it: when the last of them goes away, so does the review. */
interface PendingReview {
  readonly result: Promise<Reviewed>;
  readonly abandon: AbortController;
  waiters: number;
}

/** The configuration's HTTP library, whose requests are also cut when `abandoned` fires. */
function abandonable(http: HttpLibrary, abandoned: AbortSignal): ConfigurationOptions {
  return {
    httpApi: {
      send(request) {
        const own = request.getSignal();
        request.setSignal(own ? AbortSignal.any([own, abandoned]) : abandoned);
        return http.send(request);
      },
    },
  };
}

/** A TokenReview answer of the wrong shape: refused, but not remembered, as the next answer may be sound. */
class MalformedReviewError extends TokenRefusedError {}

function firstExtra(status: ReviewStatus, key: string): string | undefined {
  return status.user?.extra?.[key]?.[0];
}

function tokenKey(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/** Deletes entries of `map` whose time has passed, then the oldest, until there is room for one more. */
function makeRoom<T>(map: Map<string, T>, limit: number, until: (entry: T) => number, now: number): void {
  if (map.size < limit) return;
  for (const [key, entry] of map) if (until(entry) <= now) map.delete(key);
  // Oldest first: a Map iterates in insertion order.
  while (map.size >= limit) {
    const oldest = map.keys().next().value;
    if (oldest === undefined) break;
    map.delete(oldest);
  }
}

export class KubernetesAgentTokens implements TokenReviewer {
  private readonly remembered = new Map<string, Remembered>();
  /** Tokens the API server refused, until when they are refused without asking. */
  private readonly refused = new Map<string, number>();
  /** Pods (by uid) a token found good was bound to, until that token's expiry: their next token is reviewed in the kept slots. */
  private readonly knownPods = new Map<string, number>();
  private readonly inFlight = new Map<string, PendingReview>();
  private unknownInFlight = 0;
  /** Pods whose next token is under review in the successors' slots. */
  private readonly successorsInFlight = new Set<string>();
  private readonly perClient: ClientRateLimiter;
  private readonly username: string;
  private readonly now: () => number;

  constructor(
    private readonly authentication: AuthenticationV1Api,
    private readonly core: CoreV1Api,
    /** The API clients' HTTP library: a review's requests go through it, cut when the review is abandoned. */
    private readonly http: HttpLibrary,
    private readonly options: KubernetesAgentTokensOptions,
  ) {
    this.username = `system:serviceaccount:${options.namespace}:${options.serviceAccount}`;
    this.now = options.now ?? Date.now;
    this.perClient = new ClientRateLimiter(options.reviewRateLimit, { now: this.now });
  }

  /** Tokens remembered as good now; never more than cacheEntries. */
  get cached(): number {
    return this.remembered.size;
  }

  /** Tokens remembered as refused now; never more than cacheEntries. */
  get cachedRefusals(): number {
    return this.refused.size;
  }

  accepts(token: string): boolean {
    return token.length <= MAX_TOKEN_LENGTH && JWT_FORM.test(token);
  }

  async review(token: string, client: string, gone?: AbortSignal): Promise<Identity> {
    const key = tokenKey(token);
    const now = this.now();
    const known = this.remembered.get(key);
    if (known && known.trustedUntil > now) return known.identity;
    const renewal = known !== undefined && known.knownUntil > now;
    if (known && !renewal) this.remembered.delete(key);
    const refusedUntil = this.refused.get(key);
    if (refusedUntil !== undefined && refusedUntil > now) {
      throw new TokenRefusedError(`the Kubernetes API server refused this token in the last ${this.options.refusedCacheSeconds} s; not asked again`);
    }
    if (refusedUntil !== undefined) this.refused.delete(key);
    const pending = this.inFlight.get(key);
    if (pending) return (await this.waitFor(pending, gone)).identity;
    const claims = unverifiedClaims(token);
    if (!claims) throw new TokenRefusedError('not a Kubernetes service-account token (its payload is not a JSON object)');
    if (!claims.audiences.includes(this.options.audience)) {
      throw new TokenRefusedError(
        `the Kubernetes service-account token is for audience ${JSON.stringify(claims.audiences.join(','))}, not this controller's "${this.options.audience}" (the projected volume's audience)`,
      );
    }
    // The kubelet's next token of a known pod still counts against its client's rate, but not in the strangers' slots.
    const pod = claims.podUid;
    const successor =
      !renewal &&
      pod !== undefined &&
      (this.knownPods.get(pod) ?? 0) > now &&
      !this.successorsInFlight.has(pod) &&
      this.successorsInFlight.size < SUCCESSOR_REVIEWS_IN_FLIGHT;
    const stranger = !renewal && !successor;
    if (!renewal) {
      const decision = this.perClient.take(client);
      if (!decision.allowed) {
        const { requestsPerSecond, burst } = this.perClient.settings;
        throw new ReviewsRateLimitedError(
          decision.retryAfterSeconds,
          `too many unknown tokens from this client: at most ${requestsPerSecond} per second (bursts of ${burst}) are checked; retry after ${decision.retryAfterSeconds} s`,
        );
      }
    }
    if (stranger && this.unknownInFlight >= UNKNOWN_REVIEWS_IN_FLIGHT)
      throw new ReviewUnavailableError(`${UNKNOWN_REVIEWS_IN_FLIGHT} reviews of tokens not seen before are already in progress`);
    if (this.inFlight.size >= MAX_REVIEWS_IN_FLIGHT)
      throw new ReviewUnavailableError(`${MAX_REVIEWS_IN_FLIGHT} Kubernetes token reviews are already in progress`);
    if (stranger) this.unknownInFlight += 1;
    if (successor) this.successorsInFlight.add(pod);
    const abandon = new AbortController();
    const result = this.check(token, abandon.signal).finally(() => {
      this.inFlight.delete(key);
      if (stranger) this.unknownInFlight -= 1;
      if (successor) this.successorsInFlight.delete(pod);
    });
    const review: PendingReview = { result, abandon, waiters: 0 };
    this.inFlight.set(key, review);
    let reviewed: Reviewed;
    try {
      reviewed = await this.waitFor(review, gone);
    } catch (error) {
      if (error instanceof TokenRefusedError && !(error instanceof MalformedReviewError)) {
        // A token found good before and refused now (its pod gone) is no longer a renewal.
        this.remembered.delete(key);
        this.rememberRefusal(key);
      }
      throw error;
    }
    this.remember(key, reviewed, claims.expiresAt);
    return reviewed.identity;
  }

  /** Waits for a review on behalf of one request; once every request waiting for it has gone, the review is abandoned. */
  private async waitFor(review: PendingReview, gone: AbortSignal | undefined): Promise<Reviewed> {
    review.waiters += 1;
    let left = false;
    const leave = (): void => {
      if (left) return;
      left = true;
      review.waiters -= 1;
      if (review.waiters === 0) review.abandon.abort();
    };
    if (gone?.aborted) leave();
    else gone?.addEventListener('abort', leave, { once: true });
    try {
      return await review.result;
    } finally {
      gone?.removeEventListener('abort', leave);
    }
  }

  private remember(key: string, { identity, podUid }: Reviewed, expiresAt: number | undefined): void {
    const now = this.now();
    const knownUntil = expiresAt ?? now + KNOWN_WITHOUT_EXPIRY_MS;
    if (knownUntil <= now) return;
    const trustedUntil = Math.min(now + this.options.cacheSeconds * 1000, knownUntil);
    this.remembered.delete(key);
    makeRoom(this.remembered, this.options.cacheEntries, (entry) => entry.knownUntil, now);
    this.remembered.set(key, { identity, trustedUntil, knownUntil });
    if (podUid === undefined) return;
    this.knownPods.delete(podUid);
    makeRoom(this.knownPods, this.options.cacheEntries, (until) => until, now);
    this.knownPods.set(podUid, knownUntil);
  }

  private rememberRefusal(key: string): void {
    if (this.options.refusedCacheSeconds <= 0) return;
    const now = this.now();
    this.refused.delete(key);
    makeRoom(this.refused, this.options.cacheEntries, (until) => until, now);
    this.refused.set(key, now + this.options.refusedCacheSeconds * 1000);
  }

  private async check(token: string, abandoned: AbortSignal): Promise<Reviewed> {
    let answer: unknown;
    try {
      const review = await this.authentication.createTokenReview(
        { body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token, audiences: [this.options.audience] } } },
        abandonable(this.http, abandoned),
      );
      answer = review.status ?? {};
    } catch (error) {
      if (abandoned.aborted) throw new ReviewUnavailableError('the token review was abandoned: every request waiting for it went away', error);
      throw unavailable(error, 'review the token', 'create tokenreviews.authentication.k8s.io');
    }
    const parsed = reviewStatusSchema.safeParse(answer);
    if (!parsed.success)
      throw new MalformedReviewError(
        `the Kubernetes API server's TokenReview answer is malformed (${describeIssues(parsed.error.issues, 'status')}); the token is refused`,
      );
    const status = parsed.data;
    if (status.authenticated !== true) {
      throw new TokenRefusedError(`the Kubernetes API server did not authenticate the service-account token${status.error ? `: ${status.error}` : ''}`);
    }
    // An API server that ignores spec.audiences answers without them; its "yes" is for itself, not for us.
    if (!(status.audiences ?? []).includes(this.options.audience)) {
      throw new TokenRefusedError(`the Kubernetes API server authenticated the token but not for audience "${this.options.audience}"`);
    }
    const username = status.user?.username ?? '';
    if (username !== this.username) {
      throw new TokenRefusedError(`the token is ${JSON.stringify(username)}'s; agents present the service account ${this.username}'s`);
    }
    const node = firstExtra(status, EXTRA_NODE_NAME) ?? (await this.podNode(status, abandoned));
    if (!NODE_NAME_PATTERN.test(node))
      throw new TokenRefusedError(
        `the agent's node name ${JSON.stringify(node.slice(0, 80))} is not one steadfast can act on (letters, digits, ".", "_", "-", at most 63)`,
      );
    return { identity: { role: 'agent', node }, podUid: firstExtra(status, EXTRA_POD_UID) };
  }

  /** Before Kubernetes 1.30 a review names the token's pod, not its node: the pod says where it runs. */
  private async podNode(status: ReviewStatus, abandoned: AbortSignal): Promise<string> {
    const name = firstExtra(status, EXTRA_POD_NAME);
    const uid = firstExtra(status, EXTRA_POD_UID);
    if (name === undefined || uid === undefined) {
      throw new TokenRefusedError(
        'the service-account token is not bound to a pod: mount it as a projected serviceAccountToken volume (deploy/kubernetes/agent.yaml)',
      );
    }
    let pod;
    try {
      pod = await this.core.readNamespacedPod({ name, namespace: this.options.namespace }, abandonable(this.http, abandoned));
    } catch (error) {
      if (abandoned.aborted) throw new ReviewUnavailableError('the token review was abandoned: every request waiting for it went away', error);
      if (error instanceof ApiException && error.code === 404)
        throw new TokenRefusedError(`the token's pod ${this.options.namespace}/${name} no longer exists`);
      throw unavailable(error, `read pod ${this.options.namespace}/${name}`, 'get pods');
    }
    if (pod.metadata?.uid !== uid) throw new TokenRefusedError(`the token's pod ${this.options.namespace}/${name} was replaced (uid ${uid} is gone)`);
    const node = pod.spec?.nodeName;
    if (!node) throw new TokenRefusedError(`the token's pod ${this.options.namespace}/${name} is not on a node`);
    return node;
  }
}

/** A failed call to the API server: nobody could say whether the token is good. */
function unavailable(error: unknown, action: string, permission: string): ReviewUnavailableError {
  if (!(error instanceof ApiException))
    return new ReviewUnavailableError(`the Kubernetes API server is unreachable, cannot ${action}: ${errorMessage(error)}`, error);
  const detail = `HTTP ${error.code}: ${serverMessage(error)}`;
  if (error.code === 403)
    return new ReviewUnavailableError(
      `the controller may not ${action}: it lacks the RBAC permission "${permission}" (deploy/kubernetes/rbac.yaml); ${detail}`,
      error,
    );
  if (error.code === 401)
    return new ReviewUnavailableError(`the Kubernetes API server rejected the controller's own credentials trying to ${action}; ${detail}`, error);
  return new ReviewUnavailableError(`the Kubernetes API server failed to ${action}; ${detail}`, error);
}

/** The reviewer for controller.auth.kubernetesAgents, on the API server the configuration reaches. */
export function kubernetesAgentTokens(configuration: Configuration, options: KubernetesAgentTokensOptions): KubernetesAgentTokens {
  return new KubernetesAgentTokens(new AuthenticationV1Api(configuration), new CoreV1Api(configuration), configuration.httpApi, options);
}

/** The config's reviewer of agents' service-account tokens, asking the API server `backend.kubernetes` names; none without controller.auth.kubernetesAgents. */
export function configuredAgentTokens(config: Config): KubernetesAgentTokens | undefined {
  const agents = config.controller.auth.kubernetesAgents;
  if (!agents) return undefined;
  const k8s = config.backend.kubernetes;
  return kubernetesAgentTokens(kubernetesApiConfiguration({ connection: kubernetesConnection(k8s), timeoutMs: k8s.timeoutMs }), agents);
}
