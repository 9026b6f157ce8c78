import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Queue } from 'bullmq';
import express, { type NextFunction, type Request, type Response } from 'express';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../../core/audit.js';
import { Credentials } from '../../../core/credentials.js';
import { silentLogger } from '../../../core/log.js';
import { AccessAudit, ForbiddenError, authorize, sendForbidden } from '../../../controller/intake/auth.js';
import { mountQueueBoard } from '../../../controller/intake/queue-board.js';
import { ALERTMANAGER_TOKEN, READ_ONLY_TOKEN, TEST_TOKEN } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';

interface BoardQueue {
  name: string;
  counts: Record<string, number>;
  readOnlyMode: boolean;
  allowRetries: boolean;
}

const basic = (user: string, password: string): string => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

async function listen(app: express.Express): Promise<{ server: Server; url: string }> {
  const server = app.listen(0, '127.0.0.1');
  await new Promise<void>((resolve, reject) => {
    server.once('listening', resolve);
    server.once('error', reject);
  });
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

async function close(server: Server): Promise<void> {
  await new Promise<void>((resolve) => {
    server.close(() => resolve());
    server.closeAllConnections();
  });
}

describe('queue board at /queues', () => {
  const env = testRedis();
  const signals = new Queue('signals', { connection: env.redis, prefix: env.prefix });
  const actions = new Queue('actions', { connection: env.redis, prefix: env.prefix });
  let readOnly: { server: Server; url: string };
  let writable: { server: Server; url: string };

  beforeAll(async () => {
    await signals.add('signal', { node: 'gpu-1' });
    await signals.add('signal', { node: 'gpu-2' });
    await actions.add('drain', { node: 'gpu-1' }, { delay: 60_000 });
    const app = express();
    app.disable('x-powered-by'); // as createApp does; the board's own sub-app must not add it back
    const credentials = new Credentials({ operator: TEST_TOKEN, readOnly: READ_ONLY_TOKEN, alertmanager: ALERTMANAGER_TOKEN });
    const access = new AccessAudit(new AuditLog(env.redis, env.keys), silentLogger());
    const guard = authorize({ credentials, access, onReject: () => undefined, basic: true });
    // As createApp does: a refusal by a route's scope check becomes the audited 403.
    const forbiddenAs403 = (error: unknown, req: Request, res: Response, next: NextFunction): void => {
      if (error instanceof ForbiddenError) sendForbidden({ access, onReject: () => undefined }, req, res, error.identity, error.scope, error.message);
      else next(error);
    };
    mountQueueBoard(app, [signals, actions], guard);
    app.use((_req, res) => {
      res.status(404).json({ error: 'no such endpoint' });
    });
    app.use(forbiddenAs403);
    readOnly = await listen(app);
    const writableApp = express();
    mountQueueBoard(writableApp, [signals, actions], guard, { allowActions: true });
    writableApp.use(forbiddenAs403);
    writable = await listen(writableApp);
  });

  afterAll(async () => {
    await Promise.all([close(readOnly.server), close(writable.server)]);
    await Promise.all([signals.close(), actions.close()]);
    await env.cleanup();
  });

  it('answers 401 with a Basic challenge without credentials, or with a wrong token', async () => {
    for (const authorization of [undefined, 'Bearer wrong-token-0123456789', basic('admin', 'wrong-token-0123456789'), basic('admin', ''), 'Basic !!!']) {
      const response = await fetch(`${readOnly.url}/queues`, { headers: authorization ? { authorization } : {} });
      expect(response.status, authorization).toBe(401);
      expect(response.headers.get('www-authenticate')).toBe('Basic realm="steadfast"');
      await response.body?.cancel();
    }
    const api = await fetch(`${readOnly.url}/queues/api/queues`);
    expect(api.status).toBe(401);
    await api.body?.cancel();
  });

  it('serves the UI page with a bearer header and with Basic auth (any user name)', async () => {
    for (const authorization of [`Bearer ${TEST_TOKEN}`, basic('admin', TEST_TOKEN), basic('', TEST_TOKEN)]) {
      const response = await fetch(`${readOnly.url}/queues`, { headers: { authorization } });
      expect(response.status, authorization).toBe(200);
      expect(response.headers.get('content-type')).toMatch(/text\/html/);
      const html = await response.text();
      expect(html).toContain('steadfast queues');
      expect(html).toMatch(/<base href="\/queues\/?"/);
      expect(response.headers.get('x-powered-by')).toBeNull();
    }
  });

  it("shows the board to the read-only credential, refuses Alertmanager's with 403, and leaves board writes to the operator", async () => {
    const page = await fetch(`${readOnly.url}/queues`, { headers: { authorization: basic('viewer', READ_ONLY_TOKEN) } });
    expect(page.status).toBe(200);
    await page.body?.cancel();
    const alertmanager = await fetch(`${readOnly.url}/queues/api/queues`, { headers: { authorization: `Bearer ${ALERTMANAGER_TOKEN}` } });
    expect(alertmanager.status).toBe(403);
    expect(((await alertmanager.json()) as { error: string }).error).toBe('role alertmanager may not GET /queues/api/queues: it needs scope "read"');
    const write = await fetch(`${writable.url}/queues/api/queues/signals/pause`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${READ_ONLY_TOKEN}`, origin: writable.url },
    });
    expect(write.status).toBe(403);
    expect(((await write.json()) as { error: string }).error).toMatch(/role read-only .* needs scope "operate"/);
    expect(await signals.isPaused()).toBe(false);
  });

  it('serves the static assets the page links to', async () => {
    const html = await (await fetch(`${readOnly.url}/queues`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } })).text();
    const script = /src="(static\/[^"]+\.js)"/.exec(html)?.[1];
    expect(script).toBeDefined();
    const response = await fetch(`${readOnly.url}/queues/${script}`, { headers: { authorization: basic('admin', TEST_TOKEN) } });
    expect(response.status).toBe(200);
    await response.body?.cancel();
  });

  it('references nothing outside the controller from its pages or their stylesheets (air-gapped clusters)', async () => {
    const authorization = `Bearer ${TEST_TOKEN}`;
    const external = /(?:\b[a-z][a-z0-9+.-]*:)?\/\/[a-z0-9.-]+/gi;
    for (const page of ['/queues', '/queues/queue/signals']) {
      const html = await (await fetch(`${readOnly.url}${page}`, { headers: { authorization } })).text();
      const loaded = [...html.matchAll(/\b(?:href|src)\s*=\s*"([^"]*)"/g)].map((match) => match[1] ?? '');
      expect(loaded.length, page).toBeGreaterThan(3);
      expect(
        loaded.filter((url) => /^(?:[a-z][a-z0-9+.-]*:|\/\/)/i.test(url) && !url.startsWith('data:')),
        page,
      ).toEqual([]);
      expect(html.match(external), page).toBeNull();
      const stylesheets = loaded.filter((url) => url.endsWith('.css'));
      expect(stylesheets.length, page).toBeGreaterThan(0);
      for (const sheet of stylesheets) {
        const response = await fetch(`${readOnly.url}/queues/${sheet}`, { headers: { authorization } });
        expect(response.status, sheet).toBe(200);
        const css = await response.text();
        expect(css.length, sheet).toBeGreaterThan(1000);
        expect(css.match(external), sheet).toBeNull();
        expect(css, sheet).not.toMatch(/@import/);
      }
    }
  });

  it('lists both queues with their counts on the JSON API, read-only', async () => {
    const response = await fetch(`${readOnly.url}/queues/api/queues`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { queues: BoardQueue[] };
    const byName = new Map(body.queues.map((queue) => [queue.name, queue]));
    expect([...byName.keys()].sort()).toEqual(['actions', 'signals']);
    expect(byName.get('signals')?.counts).toMatchObject({ waiting: 2, active: 0, delayed: 0, failed: 0 });
    expect(byName.get('actions')?.counts).toMatchObject({ waiting: 0, delayed: 1 });
    for (const queue of body.queues) expect(queue).toMatchObject({ readOnlyMode: true, allowRetries: false });
  });

  it('refuses writes when read-only, and leaves the queue alone', async () => {
    for (const path of ['/queues/api/queues/signals/empty', '/queues/api/queues/signals/pause']) {
      const response = await fetch(`${readOnly.url}${path}`, { method: 'PUT', headers: { authorization: `Bearer ${TEST_TOKEN}` } });
      expect(response.status, path).toBe(405);
      await response.body?.cancel();
    }
    expect(await signals.getWaitingCount()).toBe(2);
    expect(await signals.isPaused()).toBe(false);
  });

  it('with allowActions, offers retries and takes same-origin writes but refuses cross-origin ones', async () => {
    const auth = { authorization: basic('admin', TEST_TOKEN) };
    const listing = (await (await fetch(`${writable.url}/queues/api/queues`, { headers: auth })).json()) as { queues: BoardQueue[] };
    for (const queue of listing.queues) expect(queue).toMatchObject({ readOnlyMode: false, allowRetries: true });

    const crossSite = await fetch(`${writable.url}/queues/api/queues/signals/pause`, { method: 'PUT', headers: { ...auth, origin: 'https://evil.example' } });
    expect(crossSite.status).toBe(403);
    await crossSite.body?.cancel();
    expect(await signals.isPaused()).toBe(false);

    const sameSite = await fetch(`${writable.url}/queues/api/queues/signals/pause`, { method: 'PUT', headers: { ...auth, origin: writable.url } });
    expect(sameSite.status).toBe(200);
    await sameSite.body?.cancel();
    expect(await signals.isPaused()).toBe(true);
    await signals.resume();
  });
});
