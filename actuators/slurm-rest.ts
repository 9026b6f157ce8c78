import { readFileSync } from 'node:fs';
import { z } from 'zod';
import { DoNotRetryError, RetryLaterError, errorMessage } from '../core/errors.js';
import { describeIssues } from '../core/validate.js';

/**
 * A small client for slurmrestd, the Slurm REST daemon, authenticated the way Slurm documents
 * it for services: a JWT minted by `scontrol token` (or signed with the cluster's jwt key) sent
 * as X-SLURM-USER-TOKEN with the user it names as X-SLURM-USER-NAME.
 *
 * The API version is discovered from the daemon's own OpenAPI document rather than configured:
 * the newest `/slurm/v0.0.N/` it serves is used, and node updates (drain, resume) are offered
 * only when that document lists `POST /slurm/v0.0.N/node/{node_name}` — Slurm 23.02 (v0.0.39)
 * and later do; 22.05 (v0.0.38) answers reads only, so the backend keeps scontrol for writes.
 */

export interface SlurmRestOptions {
  /** Base URL of slurmrestd, e.g. http://slurm-head:6820. */
  readonly url: string;
  /** The Slurm user the token belongs to (an operator or SlurmUser to update nodes). */
  readonly user: string;
  /** The JWT itself. */
  readonly token?: string | undefined;
  /** A file holding the JWT (or `scontrol token` output, `SLURM_JWT=…`), re-read on every call so a rotated token is picked up. */
  readonly tokenFile?: string | undefined;
  readonly timeoutMs: number;
}

export interface RestNodeState {
  readonly exists: boolean;
  /** Base state and flags, upper case: `IDLE`, `DRAIN`, `CLOUD`, … */
  readonly states: readonly string[];
  readonly reason?: string | undefined;
}

/** Slurm's error numbers for "no such node" and "no such reservation" (slurm_errno.h). */
const ESLURM_INVALID_NODE_NAME = 2018;
const ESLURM_RESERVATION_INVALID = 2053;

const errorsSchema = z.array(z.object({ error: z.string().optional(), errno: z.number().optional(), description: z.string().optional() }).loose()).default([]);

const openapiSchema = z.object({ paths: z.record(z.string(), z.record(z.string(), z.unknown())) }).loose();

const nodesSchema = z
  .object({
    errors: errorsSchema,
    nodes: z
      .array(
        z
          .object({
            name: z.string(),
            // v0.0.38: a base-state string plus state_flags; v0.0.39 and later: one array of both.
            state: z.union([z.string(), z.array(z.string())]),
            state_flags: z.array(z.string()).optional(),
            reason: z.string().optional(),
          })
          .loose(),
      )
      .default([]),
  })
  .loose();

const reservationsSchema = z
  .object({
    errors: errorsSchema,
    reservations: z.array(z.object({ name: z.string(), node_list: z.string().default('') }).loose()).default([]),
  })
  .loose();

interface Api {
  readonly version: string;
  readonly updatesNodes: boolean;
}

export class SlurmRestClient {
  private api: Promise<Api> | undefined;

  constructor(private readonly options: SlurmRestOptions) {
    if (!options.token && !options.tokenFile) throw new DoNotRetryError('slurmrestd needs a token or a tokenFile');
  }

  private token(): string {
    if (this.options.token) return this.options.token;
    const path = this.options.tokenFile as string;
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (error) {
      throw new RetryLaterError(`cannot read the slurmrestd token file ${path}: ${errorMessage(error)}`, error);
    }
    const token = text.trim().replace(/^SLURM_JWT=/, '');
    if (!/^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/.test(token)) throw new RetryLaterError(`the slurmrestd token file ${path} does not hold a JWT`);
    return token;
  }

  private async request(method: 'GET' | 'POST', path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
    const url = `${this.options.url.replace(/\/+$/, '')}${path}`;
    let response: Response;
    try {
      response = await fetch(url, {
        method,
        headers: {
          'X-SLURM-USER-NAME': this.options.user,
          'X-SLURM-USER-TOKEN': this.token(),
          ...(body === undefined ? {} : { 'Content-Type': 'application/json' }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.options.timeoutMs),
      });
    } catch (error) {
      if (error instanceof RetryLaterError) throw error;
      throw new RetryLaterError(`slurmrestd ${method} ${path} failed: ${errorMessage(error)}`, error);
    }
    // An expired token is the usual cause, and a rotated token file fixes it: retry later.
    if (response.status === 401 || response.status === 403) {
      throw new RetryLaterError(`slurmrestd refused ${method} ${path} (HTTP ${response.status}): is the token for ${this.options.user} expired or wrong?`);
    }
    const text = await response.text();
    try {
      return { status: response.status, json: JSON.parse(text) as unknown };
    } catch {
      throw new RetryLaterError(`slurmrestd ${method} ${path} answered HTTP ${response.status} with no JSON: ${text.slice(0, 200)}`);
    }
  }

  /** The newest Slurm API version the daemon serves and whether it can update nodes. */
  describe(): Promise<Api> {
    this.api ??= this.discover().catch((error: unknown) => {
      this.api = undefined;
      throw error;
    });
    return this.api;
  }

  private async discover(): Promise<Api> {
    const { status, json } = await this.request('GET', '/openapi/v3');
    const parsed = openapiSchema.safeParse(json);
    if (status !== 200 || !parsed.success) throw new RetryLaterError(`slurmrestd /openapi/v3 answered HTTP ${status} without an OpenAPI document`);
    const versions = Object.keys(parsed.data.paths)
      .map((path) => /^\/slurm\/(v0\.0\.(\d+))\//.exec(path))
      .filter((match): match is RegExpExecArray => match !== null)
      .sort((a, b) => Number(b[2]) - Number(a[2]));
    const version = versions[0]?.[1];
    if (!version) throw new DoNotRetryError('slurmrestd serves no /slurm/ API (was it started without an openapi/v0.0.* plugin?)');
    const nodePath = parsed.data.paths[`/slurm/${version}/node/{node_name}`];
    return { version, updatesNodes: nodePath !== undefined && 'post' in nodePath };
  }

  private static check(status: number, errors: z.infer<typeof errorsSchema>, what: string, tolerated: number): boolean {
    const other = errors.filter((error) => error.errno !== tolerated);
    if (other.length > 0 || (status >= 300 && errors.length === 0)) {
      const said = other.map((error) => error.description ?? error.error ?? `errno ${error.errno}`).join('; ');
      const message = `slurmrestd ${what}: HTTP ${status}${said ? `: ${said}` : ''}`;
      throw status >= 500 || status === 429 ? new RetryLaterError(message) : new DoNotRetryError(message);
    }
    return errors.some((error) => error.errno === tolerated);
  }

  async node(node: string): Promise<RestNodeState> {
    const { version } = await this.describe();
    const { status, json } = await this.request('GET', `/slurm/${version}/node/${encodeURIComponent(node)}`);
    const parsed = nodesSchema.safeParse(json);
    if (!parsed.success) throw new RetryLaterError(`slurmrestd node ${node}: unexpected answer (${describeIssues(parsed.error.issues)})`);
    if (SlurmRestClient.check(status, parsed.data.errors, `node ${node}`, ESLURM_INVALID_NODE_NAME)) return { exists: false, states: [] };
    const found = parsed.data.nodes.find((entry) => entry.name === node);
    if (!found) return { exists: false, states: [] };
    const states = [...(Array.isArray(found.state) ? found.state : [found.state]), ...(found.state_flags ?? [])].map((state) => state.toUpperCase());
    return { exists: true, states, reason: found.reason || undefined };
  }

  /** The reservation's node list as Slurm writes it (compressed), or undefined when there is none. */
  async reservationNodes(name: string): Promise<string | undefined> {
    const { version } = await this.describe();
    const { status, json } = await this.request('GET', `/slurm/${version}/reservation/${encodeURIComponent(name)}`);
    const parsed = reservationsSchema.safeParse(json);
    if (!parsed.success) throw new RetryLaterError(`slurmrestd reservation ${name}: unexpected answer (${describeIssues(parsed.error.issues)})`);
    if (SlurmRestClient.check(status, parsed.data.errors, `reservation ${name}`, ESLURM_RESERVATION_INVALID)) return undefined;
    return parsed.data.reservations.find((entry) => entry.name === name)?.node_list;
  }

  /** Sets node state flags (`DRAIN` with a reason, `RESUME`); only where describe() says updatesNodes. */
  async updateNode(node: string, state: 'DRAIN' | 'RESUME', reason?: string): Promise<void> {
    const { version, updatesNodes } = await this.describe();
    if (!updatesNodes) throw new DoNotRetryError(`slurmrestd ${version} cannot update nodes`);
    const body = reason === undefined ? { state: [state] } : { state: [state], reason };
    const { status, json } = await this.request('POST', `/slurm/${version}/node/${encodeURIComponent(node)}`, body);
    const parsed = z.object({ errors: errorsSchema }).loose().safeParse(json);
    const errors = parsed.success ? parsed.data.errors : [];
    if (SlurmRestClient.check(status, errors, `update node ${node}`, ESLURM_INVALID_NODE_NAME))
      throw new DoNotRetryError(`slurmrestd: node ${node} is unknown to Slurm`);
  }
}
