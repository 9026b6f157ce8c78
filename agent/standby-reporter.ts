import { jitteredInterval } from '../core/backoff.js';
import { diagnoseReportSchema } from '../core/diagnostics.js';
import { validationReportSchema } from '../core/validation.js';
import type { Logger } from '../core/log.js';
import { currentToken, type TokenSource } from './fast-path-client.js';

/**
 * The agent's side of the warm standby pool (ByteRobust §6.2, §7 "each agent queries the
 * controller to determine its state"): it polls `GET /api/v1/standby/:node`, and while its node
 * waits for a self-check it judges its own health from one scrape of its collectors — every
 * collector working, every GPU present, no fatal Xid — then, when the node has diagnostics
 * configured, runs those marked for standbys (EUD, NCCL inside the machine), and posts the verdict.
 */

export interface StandbyReporterOptions {
  readonly controllerUrl: string;
  readonly token: TokenSource;
  readonly node: string;
  /** The mean pause between polls; each is jittered (half to one and a half times it). */
  readonly intervalMs: number;
  /** A number in [0, 1) for the jitter; tests pass a seeded one. */
  readonly random?: () => number;
  /** One scrape of the agent's own collectors. */
  readonly scrape: () => Promise<string>;
  /**
   * The node's configured diagnostics, run as a standby self-check (burn-in such as EUD, NCCL
   * inside the machine), when the diagnose collector is enabled: POST /api/v1/diagnose with
   * `{standby: true}`, answered in-process.
   */
  readonly diagnose?: (() => Promise<{ status: number; body: unknown }>) | undefined;
  /**
   * The node's validation under load (the burn, DCGM where installed), when the validate collector
   * is enabled: POST /api/v1/validate, answered in-process. A standby is ready only once it passed,
   * as a node returning to service must (actuators/node-validation.ts).
   */
  readonly validate?: (() => Promise<{ status: number; body: unknown }>) | undefined;
  readonly logger: Logger;
}

/** A node is healthy when no collector fails, no GPU is missing and no fatal Xid was counted. */
export function selfCheck(exposition: string): { ok: boolean; detail: string } {
  const problems: string[] = [];
  // A serving agent answers before its first GPU poll is done: not yet read is not yet ready.
  if (/^steadfast_collector_success\{collector="gpu"\} 1$/m.test(exposition) && !/^steadfast_gpu_last_poll_timestamp_seconds /m.test(exposition))
    problems.push('GPUs not read yet');
  for (const line of exposition.split('\n')) {
    const failing = /^steadfast_collector_success\{collector="([^"]+)"\} 0$/.exec(line);
    if (failing) problems.push(`collector ${failing[1]} failing`);
    const missing = /^steadfast_gpu_present\{([^}]*)\} 0$/.exec(line)?.[1];
    // A GPU known by UUID alone (a dcgm-exporter without pci_bus_id) is named by it.
    if (missing !== undefined) problems.push(`GPU ${/pci_bus_id="([^"]+)"/.exec(missing)?.[1] ?? /UUID="([^"]+)"/.exec(missing)?.[1] ?? '(unnamed)'} missing`);
    const xid = /^steadfast_xid_errors_total\{[^}]*xid="(\d+)"[^}]*severity="fatal"[^}]*\} (\d+)/.exec(line);
    if (xid && Number(xid[2]) > 0) problems.push(`fatal Xid ${xid[1]} seen`);
  }
  return problems.length === 0 ? { ok: true, detail: 'all collectors working, every GPU present, no fatal Xid' } : { ok: false, detail: problems.join('; ') };
}

export class StandbyReporter {
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(private readonly options: StandbyReporterOptions) {}

  /**
   * The first poll comes within half an interval, at a random point: agents restarted together
   * (a rolling update, a power event) would otherwise poll, and retry a failed poll, in step.
   */
  start(): void {
    this.schedule(Math.round((this.options.random ?? Math.random)() * (this.options.intervalMs / 2)));
  }

  /** The pause before the next poll. */
  nextDelayMs(): number {
    return jitteredInterval(this.options.intervalMs, this.options.random);
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    if (this.closed) return;
    this.timer = setTimeout(() => {
      void this.poll().finally(() => this.schedule(this.nextDelayMs()));
    }, delayMs);
    this.timer.unref();
  }

  /**
   * Adds the node's own diagnostics to a passing scrape-based verdict. Undefined: not now (a
   * diagnosis is already running); the next poll tries again.
   */
  private async deepen(verdict: { ok: boolean; detail: string }): Promise<{ ok: boolean; detail: string } | undefined> {
    const diagnosed = await this.diagnosed(verdict);
    return diagnosed === undefined ? undefined : this.validated(diagnosed);
  }

  /** Adds the node's validation under load to a passing verdict; undefined: one is running, try at the next poll. */
  private async validated(verdict: { ok: boolean; detail: string }): Promise<{ ok: boolean; detail: string } | undefined> {
    if (!verdict.ok || !this.options.validate) return verdict;
    const answer = await this.options.validate();
    if (answer.status === 409) return undefined;
    const report = validationReportSchema.safeParse(answer.body);
    if (answer.status !== 200 || !report.success)
      return { ok: false, detail: `validation could not run (HTTP ${answer.status}): ${JSON.stringify(answer.body).slice(0, 300)}` };
    const checks = report.data.checks
      .map((check) => `${check.name} ${check.result} in ${check.seconds.toFixed(1)} s${check.reason ? ` (${check.reason})` : ''}`)
      .join('; ');
    return report.data.ok
      ? { ok: true, detail: `${verdict.detail}; validation passed: ${checks}` }
      : { ok: false, detail: `validation failed: ${checks}`.slice(0, 2000) };
  }

  private async diagnosed(verdict: { ok: boolean; detail: string }): Promise<{ ok: boolean; detail: string } | undefined> {
    if (!verdict.ok || !this.options.diagnose) return verdict;
    const answer = await this.options.diagnose();
    // 503: no diagnostics configured on this node; the scrape-based check is all there is.
    if (answer.status === 503) return verdict;
    if (answer.status === 409) return undefined;
    const report = diagnoseReportSchema.safeParse(answer.body);
    if (answer.status !== 200 || !report.success)
      return { ok: false, detail: `diagnostics could not run (HTTP ${answer.status}): ${JSON.stringify(answer.body).slice(0, 300)}` };
    const failed = report.data.checks.filter((check) => !check.ok);
    if (failed.length > 0) {
      return {
        ok: false,
        detail: `diagnostics failed: ${failed.map((check) => `${check.name} ${check.result}${check.reason ? ` (${check.reason})` : ''}`).join('; ')}`.slice(
          0,
          2000,
        ),
      };
    }
    return { ok: true, detail: `${verdict.detail}; diagnostics passed: ${report.data.checks.map((check) => check.name).join(', ') || 'none selected'}` };
  }

  /** One round: ask for the node's standby state, and self-check when asked to. Never throws. */
  async poll(): Promise<void> {
    const { controllerUrl, token, node, logger } = this.options;
    try {
      const headers = { authorization: `Bearer ${currentToken(token)}`, 'content-type': 'application/json' };
      const response = await fetch(`${controllerUrl}/api/v1/standby/${encodeURIComponent(node)}`, { headers, signal: AbortSignal.timeout(5000) });
      if (!response.ok) return;
      const body = (await response.json()) as { state?: string };
      if (body.state !== 'self_check') return;
      const verdict = await this.deepen(selfCheck(await this.options.scrape()));
      if (verdict === undefined) return;
      await fetch(`${controllerUrl}/api/v1/standby/${encodeURIComponent(node)}/self-check`, {
        method: 'POST',
        headers,
        body: JSON.stringify(verdict),
        signal: AbortSignal.timeout(5000),
      });
      logger.info({ ok: verdict.ok, detail: verdict.detail }, 'standby self-check reported');
    } catch (error) {
      logger.debug({ err: error }, 'standby poll failed; will try again');
    }
  }
}
