import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { AGENT_SECRET_MIN_LENGTH, type CredentialSecrets } from './credentials.js';
import { InputError, errorMessage } from './errors.js';
import { isNamespace } from './kubernetes-names.js';

/**
 * The controller's credentials, one per role (docs/configuration.md, `controller.auth`). Each is
 * given inline (tests, env overrides) or, better, in a file of its own readable by the
 * controller alone. A role left out has no credential: nobody can act in it.
 */

const TOKEN_MIN = 16;
const token = () => z.string().min(TOKEN_MIN, `must be at least ${TOKEN_MIN} characters`).optional();
const file = () => z.string().min(1).optional();

/** A service account's name: a DNS subdomain (apimachinery's IsDNS1123Subdomain). */
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

/**
 * Agents that present their pod's projected service-account token instead of a token derived
 * from agentSecret (controller/kubernetes-agents.ts): the controller asks the API server
 * (TokenReview) whose token it is and on which node its pod runs. The API server is the one
 * `backend.kubernetes` names, whatever backend.kind is.
 */
export const kubernetesAgentsSchema = z
  .object({
    /** The audience the agents' projected token is made for (the volume's `audience`). */
    audience: z.string().min(1).max(253).default('steadfast-controller'),
    /** Where the agents' pods run. */
    namespace: z.string().refine(isNamespace, 'must be a namespace name (lower-case letters, digits and "-", at most 63)').default('steadfast'),
    /** The agents' service account; tokens of any other are refused. */
    serviceAccount: z.string().max(253).regex(DNS_SUBDOMAIN, 'must be a service account name (lower-case DNS subdomain)').default('steadfast-agent'),
    /** How long a token found good is trusted without asking again (never past the token's own expiry). */
    cacheSeconds: z.coerce.number<unknown>().int().min(0).max(300).default(60),
    /** Most tokens remembered at once; the oldest go first (one per node in a steady state). */
    cacheEntries: z.coerce.number<unknown>().int().min(1).max(1_000_000).default(20_000),
    /** How long a token the API server refused is refused again without asking (0: ask every time). */
    refusedCacheSeconds: z.coerce.number<unknown>().int().min(0).max(3600).default(60),
    /**
     * Per client address, tokens never found good that may be sent for review: a client past it is
     * answered 429 with Retry-After, without a review. Tokens found good before (a renewal after
     * cacheSeconds) are not counted. requestsPerSecond 0 turns it off (behind a proxy every agent
     * is the proxy).
     */
    reviewRateLimit: z
      .object({
        requestsPerSecond: z.coerce.number<unknown>().min(0).max(10_000).default(1),
        burst: z.coerce.number<unknown>().int().min(1).max(100_000).default(10),
      })
      .strict()
      .prefault({}),
  })
  .strict();

export type KubernetesAgentsConfig = z.output<typeof kubernetesAgentsSchema>;

export const authSchema = z
  .object({
    /** Jobs, code updates, pause/resume/hold, and everything the read-only credential can do. */
    operatorToken: token(),
    operatorTokenFile: file(),
    /** The audit, jobs, queues (bull-board): reading only. */
    readOnlyToken: token(),
    readOnlyTokenFile: file(),
    /** POST /api/v1/alerts only: the webhook's credentials_file in Alertmanager's config. */
    alertmanagerToken: token(),
    alertmanagerTokenFile: file(),
    /** The secret every agent's node-bound token derives from (`steadfast token agent`). */
    agentSecret: z.string().min(AGENT_SECRET_MIN_LENGTH, `must be at least ${AGENT_SECRET_MIN_LENGTH} characters`).optional(),
    agentSecretFile: file(),
    /** Agents on Kubernetes: their pod's service-account token, checked by a TokenReview. */
    kubernetesAgents: kubernetesAgentsSchema.optional(),
  })
  .strict()
  .superRefine((auth, context) => {
    for (const role of ['operatorToken', 'readOnlyToken', 'alertmanagerToken', 'agentSecret'] as const) {
      if (auth[role] !== undefined && auth[`${role}File`] !== undefined) {
        context.addIssue({ code: 'custom', message: `give ${role} or ${role}File, not both`, path: [`${role}File`] });
      }
    }
  });

export type AuthConfig = z.output<typeof authSchema>;

/** Reads a secret from the config or the file it names (trailing newline removed). */
export function readSecret(value: string | undefined, path: string | undefined, what: string, minLength: number): string | undefined {
  if (value !== undefined) return value;
  if (path === undefined) return undefined;
  let secret: string;
  try {
    secret = readFileSync(path, 'utf8').trim();
  } catch (error) {
    throw new InputError(`${what}: cannot read ${path}: ${errorMessage(error)}`, what);
  }
  if (secret.length < minLength) throw new InputError(`${what}: the secret in ${path} must be at least ${minLength} characters`, what);
  return secret;
}

/** Every configured credential, files read now; refuses when there is none at all. */
export function resolveCredentials(auth: AuthConfig): CredentialSecrets {
  const secrets: CredentialSecrets = {
    operator: readSecret(auth.operatorToken, auth.operatorTokenFile, 'controller.auth.operatorTokenFile', TOKEN_MIN),
    readOnly: readSecret(auth.readOnlyToken, auth.readOnlyTokenFile, 'controller.auth.readOnlyTokenFile', TOKEN_MIN),
    alertmanager: readSecret(auth.alertmanagerToken, auth.alertmanagerTokenFile, 'controller.auth.alertmanagerTokenFile', TOKEN_MIN),
    agentSecret: readSecret(auth.agentSecret, auth.agentSecretFile, 'controller.auth.agentSecretFile', AGENT_SECRET_MIN_LENGTH),
  };
  if (Object.values(secrets).every((secret) => secret === undefined) && auth.kubernetesAgents === undefined) {
    throw new InputError(
      'controller.auth: no credential configured (operatorTokenFile, readOnlyTokenFile, alertmanagerTokenFile, agentSecretFile, kubernetesAgents); refusing to run unauthenticated',
      'controller.auth',
    );
  }
  const statics = [secrets.operator, secrets.readOnly, secrets.alertmanager].filter((secret) => secret !== undefined);
  if (new Set(statics).size !== statics.length) throw new InputError('controller.auth: two roles share one token; give each role its own', 'controller.auth');
  return secrets;
}
