import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { AGENT_SECRET_MIN_LENGTH, type CredentialSecrets } from './credentials.js';
import { InputError, errorMessage } from './errors.js';

/**
 * The controller's credentials, one per role (docs/configuration.md, `controller.auth`). Each is
 * given inline (tests, env overrides) or, better, in a file of its own readable by the
 * controller alone. A role left out has no credential: nobody can act in it.
 */

const TOKEN_MIN = 16;
const token = () => z.string().min(TOKEN_MIN, `must be at least ${TOKEN_MIN} characters`).optional();
const file = () => z.string().min(1).optional();

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
  if (Object.values(secrets).every((secret) => secret === undefined)) {
    throw new InputError(
      'controller.auth: no credential configured (operatorTokenFile, readOnlyTokenFile, alertmanagerTokenFile, agentSecretFile); refusing to run unauthenticated',
      'controller.auth',
    );
  }
  const statics = [secrets.operator, secrets.readOnly, secrets.alertmanager].filter((secret) => secret !== undefined);
  if (new Set(statics).size !== statics.length) throw new InputError('controller.auth: two roles share one token; give each role its own', 'controller.auth');
  return secrets;
}
