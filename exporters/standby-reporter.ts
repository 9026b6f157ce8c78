import { errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';

/**
 * The agent's side of the warm standby pool (ByteRobust §6.2, §7 "each agent queries the
 * controller to determine its state"): it polls `GET /api/v1/standby/:node`, and while its node
 * waits for a self-check it judges its own health from one scrape of its collectors — every
 * collector working, every GPU present, no fatal Xid — and posts the verdict.
 */

export interface StandbyReporterOptions {
  readonly controllerUrl: string;
  readonly token: string;
  readonly node: string;
  readonly intervalMs: number;
  /** One scrape of the agent's own collectors. */
  readonly scrape: () => Promise<string>;
  readonly logger: Logger;
}

/** A node is healthy when no collector fails, no GPU is missing and no fatal Xid was counted. */
export function selfCheck(exposition: string): { ok: boolean; detail: string } {
  const problems: string[] = [];
  for (const line of exposition.split('\n')) {
    const failing = /^steadfast_collector_success\{collector="([^"]+)"\} 0$/.exec(line);
    if (failing) problems.push(`collector ${failing[1]} failing`);
    const missing = /^steadfast_gpu_present\{[^}]*pci_bus_id="([^"]+)"[^}]*\} 0$/.exec(line);
    if (missing) problems.push(`GPU ${missing[1]} missing`);
    const xid = /^steadfast_xid_errors_total\{[^}]*xid="(\d+)"[^}]*severity="fatal"[^}]*\} (\d+)/.exec(line);
    if (xid && Number(xid[2]) > 0) problems.push(`fatal Xid ${xid[1]} seen`);
  }
  return problems.length === 0 ? { ok: true, detail: 'all collectors working, every GPU present, no fatal Xid' } : { ok: false, detail: problems.join('; ') };
}

export class StandbyReporter {
  private timer: NodeJS.Timeout | undefined;
  private closed = false;

  constructor(private readonly options: StandbyReporterOptions) {}

  start(): void {
    this.schedule(0);
  }

  close(): void {
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
  }

  private schedule(delayMs: number): void {
    if (this.closed) return;
    this.timer = setTimeout(() => {
      void this.poll().finally(() => this.schedule(this.options.intervalMs));
    }, delayMs);
    this.timer.unref();
  }

  /** One round: ask for the node's standby state, and self-check when asked to. Never throws. */
  async poll(): Promise<void> {
    const { controllerUrl, token, node, logger } = this.options;
    const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
    try {
      const response = await fetch(`${controllerUrl}/api/v1/standby/${encodeURIComponent(node)}`, { headers, signal: AbortSignal.timeout(5000) });
      if (!response.ok) return;
      const body = (await response.json()) as { state?: string };
      if (body.state !== 'self_check') return;
      const verdict = selfCheck(await this.options.scrape());
      await fetch(`${controllerUrl}/api/v1/standby/${encodeURIComponent(node)}/self-check`, {
        method: 'POST',
        headers,
        body: JSON.stringify(verdict),
        signal: AbortSignal.timeout(5000),
      });
      logger.info({ ok: verdict.ok, detail: verdict.detail }, 'standby self-check reported');
    } catch (error) {
      logger.debug({ err: errorMessage(error) }, 'standby poll failed; will try again');
    }
  }
}
