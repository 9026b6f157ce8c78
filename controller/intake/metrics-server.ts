import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Registry } from 'prom-client';
import type { Logger } from '../../core/log.js';

/**
 * The handler of the controller's metrics listener (config `controller.metrics`), apart from the
 * intake's port so that scrapes, which carry no token, can be kept to Prometheus by a firewall.
 * Rendering reads queue depths and job ratios from Redis; scrapes that arrive while a rendering
 * is under way share it, so a flood of scrapes costs Redis one rendering at a time, not one per
 * request, and a scrape that arrives after the last one finished always gets fresh values.
 */
export function metricsHandler(registry: Registry, logger: Logger): (req: IncomingMessage, res: ServerResponse) => void {
  let underWay: Promise<string> | undefined;

  function render(): Promise<string> {
    if (underWay) return underWay;
    const text = registry.metrics();
    underWay = text;
    const done = (): void => {
      if (underWay === text) underWay = undefined;
    };
    text.then(done, done);
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
