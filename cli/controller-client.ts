import { readFileSync } from 'node:fs';
import { Command, Option } from 'commander';
import { InputError, errorMessage } from '../core/errors.js';
import { printable } from './common.js';

/**
 * The small HTTP client the operator commands (`jobs`, `audit`, `pause`, `hold`, …) use: they
 * talk to the controller's API, so an operator's machine needs the controller's URL and a token,
 * never Redis credentials.
 */

export const DEFAULT_CONTROLLER_URL = 'http://127.0.0.1:9400';

export interface ControllerConnection {
  readonly url: string;
  readonly token: string;
}

export interface ControllerOptions {
  readonly controllerUrl?: string;
  readonly tokenFile?: string;
}

/** Adds `--controller.url` and `--token-file` to an operator command. */
export function withControllerOptions(command: Command): Command {
  return command
    .addOption(new Option('--controller.url <url>', "the controller's base URL").env('STEADFAST_CONTROLLER_URL').default(DEFAULT_CONTROLLER_URL))
    .addOption(new Option('--token-file <file>', "file holding the controller's bearer token (or the token itself in STEADFAST_TOKEN)"));
}

/** The URL and token from the flags (commander names `--controller.url` `controller.url`) or the environment. */
export function controllerConnection(options: Record<string, unknown>, env: NodeJS.ProcessEnv = process.env): ControllerConnection {
  const url = String(options['controller.url'] ?? DEFAULT_CONTROLLER_URL);
  if (!/^https?:\/\//.test(url) || !URL.canParse(url)) throw new InputError(`--controller.url: ${JSON.stringify(url)} is not an http(s) URL`, 'controller.url');
  const tokenFile = options.tokenFile;
  let token: string | undefined;
  if (typeof tokenFile === 'string') {
    try {
      token = readFileSync(tokenFile, 'utf8').trim();
    } catch (error) {
      throw new InputError(`--token-file: cannot read ${tokenFile}: ${errorMessage(error)}`, 'token-file');
    }
  } else {
    token = env.STEADFAST_TOKEN?.trim();
  }
  if (!token) throw new InputError('no controller token: pass --token-file FILE or set STEADFAST_TOKEN', 'token-file');
  return { url: url.replace(/\/+$/, ''), token };
}

/** One API call: JSON in, JSON out; an error status becomes an error carrying the controller's message. */
export async function callController<T>(connection: ControllerConnection, method: 'GET' | 'POST' | 'PUT' | 'DELETE', path: string, body?: unknown): Promise<T> {
  let response: Response;
  try {
    response = await fetch(`${connection.url}${path}`, {
      method,
      headers: { authorization: `Bearer ${connection.token}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
  } catch (error) {
    const cause = error instanceof Error && error.cause !== undefined ? ` (${errorMessage(error.cause)})` : '';
    throw new Error(`the controller at ${connection.url} is not reachable: ${errorMessage(error)}${cause}`, { cause: error });
  }
  const text = await response.text();
  let parsed: unknown;
  try {
    parsed = text === '' ? {} : JSON.parse(text);
  } catch {
    parsed = { error: text.slice(0, 200) };
  }
  if (!response.ok) {
    const said =
      typeof parsed === 'object' && parsed !== null && typeof (parsed as { error?: unknown }).error === 'string'
        ? (parsed as { error: string }).error
        : text.slice(0, 200);
    const hint = response.status === 401 || response.status === 403 ? ' (check --token-file or STEADFAST_TOKEN)' : '';
    // The controller's words on one line, whatever they hold.
    const message = `${method} ${path}: ${response.status} ${printable(said)}${hint}`;
    // A refused request (4xx) is the operator's to fix, as a bad flag is (exit 2); the rest is the controller's (exit 1).
    throw response.status < 500 ? new InputError(message) : new Error(message);
  }
  return parsed as T;
}
