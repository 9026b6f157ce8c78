import { readFileSync } from 'node:fs';
import { InputError, errorMessage } from './errors.js';

/** A bearer token (Grafana's, the agents'), from the config or the file it names (trailing newline removed). */
export function resolveToken(config: { token?: string | undefined; tokenFile?: string | undefined }, what: string): string {
  if (config.token) return config.token;
  if (config.tokenFile) {
    let token: string;
    try {
      token = readFileSync(config.tokenFile, 'utf8').trim();
    } catch (error) {
      throw new InputError(`${what}: cannot read token file ${config.tokenFile}: ${errorMessage(error)}`, 'tokenFile');
    }
    if (token.length < 16) throw new InputError(`${what}: token in ${config.tokenFile} must be at least 16 characters`, 'tokenFile');
    return token;
  }
  throw new InputError(`${what}: no token configured (set token or tokenFile); refusing to run unauthenticated`, 'token');
}
