import { createBullBoard } from '@bull-board/api';
import { BullMQAdapter } from '@bull-board/api/bullMQAdapter';
import { ExpressAdapter } from '@bull-board/express';
import type { AppViewRoute } from '@bull-board/api/typings/app';
import type { Queue } from 'bullmq';
import type express from 'express';
import type { NextFunction, Request, Response } from 'express';
import { RETRY_AFTER_SECONDS } from './http-errors.js';
import { requireScope } from './routes.js';
import { QUEUE_BOARD_SCOPE } from './scopes.js';

export const QUEUE_BOARD_PATH = '/queues';

export interface QueueBoardOptions {
  /** Offer retry, remove, pause, clean and the other writes; off by default (a read-only board). */
  readonly allowActions?: boolean;
  /**
   * A health check of Redis that answers within its own deadline. The board's data calls wait
   * on the queues' connection, which waits for Redis: while this check fails they answer 503 at
   * once instead.
   */
  readonly storeUp?: () => Promise<boolean>;
}

/**
 * Serves bull-board, the BullMQ web UI, at /queues: the steadfast queues' counts, jobs, their
 * data and failure reasons. It sits behind `guard`, the controller's auth middleware, and the
 * board's own scope check (reads `read`, writes `operate`). The guard takes a credential as a
 * bearer header or, since a browser cannot send one, as the HTTP Basic password (any user name;
 * the 401 makes the browser prompt). Read-only unless `allowActions`: the board hides its write
 * buttons, and every request other than GET or HEAD is refused here as well, before it reaches
 * the board.
 *
 * Mount it before the app's catch-all 404 handler.
 */
export function mountQueueBoard(app: express.Express, queues: Queue[], guard: express.RequestHandler, options: QueueBoardOptions = {}): void {
  const allowActions = options.allowActions ?? false;
  const serverAdapter = new SelfContainedAdapter();
  serverAdapter.setBasePath(QUEUE_BOARD_PATH);
  createBullBoard({
    queues: queues.map((queue) => new BullMQAdapter(queue, { readOnlyMode: !allowActions, allowRetries: allowActions })),
    serverAdapter,
    options: { uiConfig: { boardTitle: 'steadfast queues' } },
  });
  // bull-board's adapter is a whole express app, mounted here as a sub-app.
  const board: express.Express = serverAdapter.getRouter();
  board.disable('x-powered-by');
  const storeUp = options.storeUp;
  app.use(QUEUE_BOARD_PATH, guard, boardScope, allowActions ? sameOriginWrites : readOnly, ...(storeUp ? [whileStoreAnswers(storeUp)] : []), board);
}

/** The board's data calls (under /api; the page and its scripts need no Redis) only while `storeUp` holds; 503 with Retry-After otherwise. */
function whileStoreAnswers(storeUp: () => Promise<boolean>): express.RequestHandler {
  return (req: Request, res: Response, next: NextFunction) => {
    if (!req.path.startsWith('/api/')) {
      next();
      return;
    }
    storeUp().then((up) => {
      if (up) next();
      else
        res
          .status(503)
          .set('Retry-After', RETRY_AFTER_SECONDS)
          .json({ error: 'the queues cannot be read: Redis is unreachable or does not answer; retry later' });
    }, next);
  };
}

/** The board's reads need the `read` scope, its writes (where allowed) `operate`. */
function boardScope(req: Request, res: Response, next: NextFunction): void {
  const scope = req.method === 'GET' || req.method === 'HEAD' ? QUEUE_BOARD_SCOPE : 'operate';
  requireScope({ method: req.method, path: QUEUE_BOARD_PATH, scope })(req, res, next);
}

/**
 * `<link>` elements that load from another origin. bull-board's page pulls its fonts from Google
 * Fonts; on an air-gapped cluster that request hangs or fails, and elsewhere it tells a third
 * party who opens the board. Without the link the page falls back to the system sans-serif and
 * monospace fonts its CSS names next to IBM Plex.
 */
const EXTERNAL_LINK = /<link\b[^>]*\bhref\s*=\s*["']?(?:[a-z][a-z0-9+.-]*:)?\/\/[^>]*>\s*/gi;

/** The page without anything it would load from another origin. */
export function withoutExternalLinks(html: string): string {
  return html.replace(EXTERNAL_LINK, '');
}

/** bull-board's Express adapter, whose page loads nothing from outside the controller. */
class SelfContainedAdapter extends ExpressAdapter {
  override setEntryRoute(routeDef: AppViewRoute): ExpressAdapter {
    this.app[routeDef.method](routeDef.route, (_req: Request, res: Response, next: NextFunction) => {
      const { name, params } = routeDef.handler({ basePath: this.basePath, uiConfig: this.uiConfig });
      res.render(name, params, (error: Error | null, html: string) => {
        if (error) next(error);
        else res.type('html').send(withoutExternalLinks(html));
      });
    });
    return this;
  }
}

function isRead(req: Request): boolean {
  return req.method === 'GET' || req.method === 'HEAD';
}

function readOnly(req: Request, res: Response, next: NextFunction): void {
  if (isRead(req)) {
    next();
    return;
  }
  res.status(405).set('Allow', 'GET, HEAD').json({ error: 'the queue board is read-only' });
}

/**
 * Basic credentials are sent by the browser on its own, so a write must come from the board's
 * own page: a request whose Origin names another host is refused (cross-site request forgery).
 */
function sameOriginWrites(req: Request, res: Response, next: NextFunction): void {
  const origin = req.get('origin');
  if (isRead(req) || origin === undefined || hostOf(origin) === req.get('host')) {
    next();
    return;
  }
  res.status(403).json({ error: 'cross-origin writes to the queue board are refused' });
}

function hostOf(origin: string): string | undefined {
  try {
    return new URL(origin).host;
  } catch {
    return undefined;
  }
}
