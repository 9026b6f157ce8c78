import { errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';
import { describeIssues } from '../core/validate.js';
import { xidPolicyAnswerSchema } from '../core/xid-policy.js';
import { currentToken, type TokenSource } from './fast-path-client.js';

/**
 * Which Xid and SXid codes the controller wants on the fast path beyond the Xids the catalogue
 * calls fatal (GET /api/v1/xid-policy, core/xid-policy.ts). The controller decides every signal
 * with its own table; this only makes a code it acts on arrive at once rather than with the next
 * Prometheus evaluation. Until the first answer, after a 404 (a controller older than the route)
 * and without a controller, the list is empty: the catalogue's fatal Xids alone, as before. A
 * failed refresh keeps the last list.
 */
export interface FastPathCodes {
  wantsXid(code: number): boolean;
  /** An SXid goes on the fast path only when the controller listed it: an older one refuses the kind. */
  wantsSxid(code: number): boolean;
}

export interface XidPolicyClientOptions {
  readonly controllerUrl: string;
  readonly token?: TokenSource | undefined;
  readonly logger: Logger;
  /** How often the list is asked for again; the controller's changes with its restarts. */
  readonly intervalMs?: number;
  readonly requestTimeoutMs?: number;
}

/** Every few minutes: a restarted controller with a new configuration is heard within that. */
export const XID_POLICY_REFRESH_MS = 5 * 60_000;

export class XidPolicyClient implements FastPathCodes {
  private xid: ReadonlySet<number> = new Set();
  private sxid: ReadonlySet<number> = new Set();
  private timer: NodeJS.Timeout | undefined;
  private readonly closing = new AbortController();
  private readonly endpoint: string;
  /** The first ask, settled (tests and `--once` wait on it). */
  private first: Promise<void> | undefined;

  constructor(private readonly options: XidPolicyClientOptions) {
    this.endpoint = new URL('/api/v1/xid-policy', options.controllerUrl).toString();
  }

  wantsXid(code: number): boolean {
    return this.xid.has(code);
  }

  wantsSxid(code: number): boolean {
    return this.sxid.has(code);
  }

  /** Asks now and every intervalMs; never throws. */
  start(): Promise<void> {
    if (this.first === undefined) {
      this.first = this.refresh();
      this.timer = setInterval(() => void this.refresh(), this.options.intervalMs ?? XID_POLICY_REFRESH_MS);
      this.timer.unref();
    }
    return this.first;
  }

  close(): void {
    clearInterval(this.timer);
    this.closing.abort();
  }

  /** One ask; a failure is logged and the last list kept. */
  async refresh(): Promise<void> {
    const headers: Record<string, string> = {};
    if (this.options.token !== undefined) headers.authorization = `Bearer ${currentToken(this.options.token)}`;
    try {
      const response = await fetch(this.endpoint, {
        headers,
        signal: AbortSignal.any([this.closing.signal, AbortSignal.timeout(this.options.requestTimeoutMs ?? 10_000)]),
      });
      const text = await response.text();
      if (response.status === 404) {
        this.set([], []);
        return;
      }
      if (!response.ok) {
        this.options.logger.warn({ status: response.status, body: text.slice(0, 300) }, 'controller did not answer the Xid policy; keeping the last list');
        return;
      }
      const parsed = xidPolicyAnswerSchema.safeParse(JSON.parse(text) as unknown);
      if (!parsed.success) {
        this.options.logger.warn({ err: describeIssues(parsed.error.issues) }, "controller's Xid policy answer is not understood; keeping the last list");
        return;
      }
      this.set(parsed.data.fastPath.xid, parsed.data.fastPath.sxid);
    } catch (error) {
      if (this.closing.signal.aborted) return;
      this.options.logger.warn({ err: errorMessage(error) }, 'cannot read the Xid policy from the controller; keeping the last list');
    }
  }

  private set(xid: readonly number[], sxid: readonly number[]): void {
    this.xid = new Set(xid);
    this.sxid = new Set(sxid);
    this.options.logger.info({ xid, sxid }, 'Xid and SXid codes the controller wants on the fast path');
  }
}
