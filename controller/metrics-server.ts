import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import type { Logger } from '../core/log.js';

/**
 * The handler of the controller's metrics listener (config `controller.metrics`), apart from the
 * intake's port so that scrapes, which carry no token, can be kept to Prometheus by a firewall.
 * Rendering reads queue depths and job ratios from Redis; scrapes that arrive within
 * `reuseMs` of a render share it, so a flood of scrapes costs Redis and the event loop one
 * render per interval, not one per request.
 */
export function metricsHandler(registry: Registry, logger: Logger, reuseMs = 1000): (req: IncomingMessage, res: ServerResponse) => void {
  let latest: { at: number; text: Promise<string> } | undefined;

  function render(): Promise<string> {
    const now = Date.now();
    if (latest && now - latest.at < reuseMs) return latest.text;
    const text = registry.metrics();
    latest = { at: now, text };
    // A failed render is not reused.
    text.catch(() => {
      if (latest?.text === text) latest = undefined;
    });
    return text;
  }

  return (req, res) => {
    const path = (req.url ?? '').split('?')[0];
    if (path !== '/metrics') {
      res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: this listener serves /metrics only\n');
      return;
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      return;
    }
    render().then(
      (text) => res.writeHead(200, { 'content-type': registry.contentType }).end(req.method === 'HEAD' ? undefined : text),
      (error: unknown) => {
        logger.warn({ err: error }, 'rendering metrics failed');
        res.writeHead(500, { 'content-type': 'text/plain' }).end('rendering metrics failed; see the controller log\n');
      },
    );
  };
}
