import { lazyCrypto } from '../core/lazy-crypto.js';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry, collectDefaultMetrics } from 'prom-client';
import { registerBuildInfo } from '../core/build-info.js';
import { createLimitedServer, type ConnectionLimits } from '../core/connection-limits.js';
import { DIAGNOSE_PATH } from '../core/diagnostics.js';
import { VALIDATE_PATH } from '../core/validation.js';
import { errorMessage } from '../core/errors.js';
import type { FastPathEvent } from '../core/fast-path-event.js';
import type { Logger } from '../core/log.js';
import { ClientRateLimiter, rateLimitMessage, type RateLimitSettings } from '../core/rate-limit.js';
import { GpuProcessBoard } from './gpu-processes.js';
import { GpuSourceChoice } from './gpu-source.js';
import { GpuWork } from './gpu-work.js';
import { XidLedger } from './xid-ledger.js';
import { CollectorSet, type AgentRoute, type CollectorFactory, type CollectorStartOptions } from './collector.js';
import type { CollectorSettings } from './flags.js';
import type { CollectorPaths } from './paths.js';
import { XidPolicyClient } from './xid-policy-client.js';
import { createFastPathClient, type FastPathOutcomeHandler, type FastPathSender, type TokenSource } from './fast-path-client.js';
import { StandbyReporter } from './standby-reporter.js';

/** How often an agent asks the controller whether its node is a standby waiting for a self-check. */
const STANDBY_POLL_MS = 10_000;

/**
 * The node agent's composition root: one registry, one fast-path client, the enabled
 * collectors and the HTTP server Prometheus scrapes. Nothing here is module-global, so tests
 * run several agents side by side on fixture trees.
 */

export interface AgentOptions {
  /** This node's name as the controller and the cluster backend know it (validated by the caller). */
  readonly node: string;
  /** Where to listen; port 0 picks a free port. Defaults to 0.0.0.0:9401. */
  readonly listen?: { readonly host: string; readonly port: number } | undefined;
  readonly paths: CollectorPaths;
  readonly pollIntervalSeconds: number;
  /** The enabled collectors (see enabledFactories in agent/index.ts). */
  readonly collectors: readonly CollectorFactory[];
  readonly controllerUrl?: string | undefined;
  readonly controllerToken?: TokenSource | undefined;
  /** Collector flag values (`training.log` → file); see CollectorFactory.flags. */
  readonly settings?: CollectorSettings | undefined;
  /** Bearer token required on the agent's POST endpoints; none: they are open (bind to a trusted network). */
  readonly apiToken?: string | undefined;
  /** Per-client limit on the POST endpoints (429 with Retry-After past it); 0 per second: none. Default DEFAULT_AGENT_RATE_LIMIT. */
  readonly rateLimit?: RateLimitSettings | undefined;
  /** What one client may hold of the HTTP server before it has sent a request. Default DEFAULT_AGENT_CONNECTIONS. */
  readonly connections?: ConnectionLimits | undefined;
  readonly logger: Logger;
}

export interface Agent {
  readonly registry: Registry;
  /** Starts the collectors and the HTTP server; resolves with the address it listens on. */
  start(): Promise<AddressInfo>;
  /** Starts the collectors (not the server) if needed and returns one scrape's exposition text. */
  scrapeOnce(): Promise<string>;
  /** Stops the server, the collectors and the fast-path client. Safe to call more than once. */
  close(): Promise<void>;
}

export const DEFAULT_LISTEN = { host: '0.0.0.0', port: 9401 } as const;

/**
 * Every rank of a node pushes its steps from the same address, so the agent's default is wide:
 * 8 ranks at 10 iterations a second fit, a client spinning in a loop does not.
 */
export const DEFAULT_AGENT_RATE_LIMIT: RateLimitSettings = { requestsPerSecond: 100, burst: 200 };

/**
 * Prometheus holds one connection per scrape target and each rank of a training job at most one
 * while it pushes, so 32 connections per client address leave room; slow headers are cut after
 * 10 s and slow bodies (at most 1 MiB) after 30 s, as on the controller, instead of Node's 60 s
 * and 300 s.
 */
export const DEFAULT_AGENT_CONNECTIONS: ConnectionLimits = { headersTimeoutSeconds: 10, requestTimeoutSeconds: 30, maxPerClient: 32 };

class NodeAgent implements Agent {
  readonly registry = new Registry();
  /**
   * The agent process itself (memory, CPU, open fds, event loop) and its build, served on
   * /metrics after the collectors' series. Kept apart so that `scrapeOnce` shows what the node
   * measures, the same on every run.
   */
  private readonly processRegistry = new Registry();
  private readonly fastPath: FastPathSender;
  /** Which codes beyond the fatal Xids the controller wants on the fast path; absent without a controller. */
  private readonly xidPolicy: XidPolicyClient | undefined;
  private readonly collectors: CollectorSet;
  private server: Server | undefined;
  private standby: StandbyReporter | undefined;
  private collectorsStarted: Promise<void> | undefined;
  private closing: Promise<void> | undefined;
  private readonly limiter: ClientRateLimiter;

  constructor(private readonly options: AgentOptions) {
    // An empty token would compare equal to a missing header.
    if (options.apiToken !== undefined && options.apiToken.trim() === '') throw new Error('apiToken must not be empty; leave it out to run without one');
    this.limiter = new ClientRateLimiter(options.rateLimit ?? DEFAULT_AGENT_RATE_LIMIT);
    collectDefaultMetrics({ register: this.processRegistry });
    registerBuildInfo(this.processRegistry);
    this.fastPath = createFastPathClient({
      controllerUrl: options.controllerUrl,
      token: options.controllerToken,
      registry: this.registry,
      logger: options.logger.child({ component: 'fast-path' }),
    });
    this.xidPolicy = options.controllerUrl
      ? new XidPolicyClient({ controllerUrl: options.controllerUrl, token: options.controllerToken, logger: options.logger.child({ component: 'xid-policy' }) })
      : undefined;
    const context = {
      fastPathCodes: this.xidPolicy,
      registry: this.registry,
      paths: options.paths,
      logger: options.logger,
      node: options.node,
      fastPath: (event: FastPathEvent, onOutcome?: FastPathOutcomeHandler) => this.fastPath.send(event, onOutcome),
      pollIntervalSeconds: options.pollIntervalSeconds,
      settings: options.settings ?? {},
      gpuProcesses: new GpuProcessBoard(),
      gpuSource: new GpuSourceChoice({ settings: options.settings ?? {}, paths: options.paths, logger: options.logger, registry: this.registry }),
      xids: new XidLedger(this.registry),
      gpuWork: new GpuWork(),
    };
    this.collectors = new CollectorSet(
      options.collectors.map((factory) => factory.create(context)),
      this.registry,
      options.logger,
    );
  }

  /** The diagnose collector's route, called in-process for a standby self-check. */
  private standbyDiagnose(): (() => Promise<{ status: number; body: unknown }>) | undefined {
    const route = this.collectors.routes.find((candidate) => candidate.method === 'POST' && candidate.path === DIAGNOSE_PATH);
    if (!route) return undefined;
    return () => route.handle({ method: 'POST', path: DIAGNOSE_PATH, query: new URLSearchParams(), body: { standby: true } });
  }

  /** A collector's POST route called in-process (the standby self-check's validation), when that collector is enabled. */
  private inProcess(path: string, body: unknown): (() => Promise<{ status: number; body: unknown }>) | undefined {
    const route = this.collectors.routes.find((candidate) => candidate.method === 'POST' && candidate.path === path);
    return route && (() => route.handle({ method: 'POST', path, query: new URLSearchParams(), body }));
  }

  async start(): Promise<AddressInfo> {
    if (this.closing) throw new Error('agent is closed');
    // Serving does not wait for the GPU's first poll: scrapes answer with what is read so far.
    await this.startCollectors({ waitForFirstRead: false });
    void this.xidPolicy?.start();
    if (this.options.controllerUrl && this.options.controllerToken && !this.standby) {
      this.standby = new StandbyReporter({
        controllerUrl: this.options.controllerUrl,
        token: this.options.controllerToken,
        node: this.options.node,
        intervalMs: STANDBY_POLL_MS,
        scrape: () => this.collectors.scrape(),
        diagnose: this.standbyDiagnose(),
        validate: this.inProcess(VALIDATE_PATH, {}),
        logger: this.options.logger.child({ component: 'standby' }),
      });
      this.standby.start();
    }
    if (!this.server) {
      const limits = this.options.connections ?? DEFAULT_AGENT_CONNECTIONS;
      const refused = (address: string, first: boolean): void => {
        if (first)
          this.options.logger.warn(
            { client: address, maxPerClient: limits.maxPerClient },
            'a client holds as many connections as it may; closing its further ones until it drops some',
          );
      };
      const server = createLimitedServer(
        (request, response) => {
          // handle() answers its own failures; this is the last line, so nothing becomes an unhandled rejection.
          this.handle(request, response).catch((error: unknown) => {
            this.options.logger.error({ err: error }, 'request failed outside its handler');
            response.destroy();
          });
        },
        limits,
        refused,
      );
      this.server = server;
      const { host, port } = this.options.listen ?? DEFAULT_LISTEN;
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
      server.on('error', (error) => this.options.logger.error({ err: error }, 'HTTP server error'));
      this.options.logger.info({ address: server.address(), collectors: this.collectors.names }, 'agent listening');
      const open = this.collectors.routes.filter((route) => route.method === 'POST').map((route) => route.path);
      if (this.options.apiToken === undefined && open.length > 0) {
        this.options.logger.warn({ endpoints: open }, 'POST endpoints accept requests without a token (--web.token-file); keep the agent on a trusted network');
      }
    }
    return this.server.address() as AddressInfo;
  }

  async scrapeOnce(): Promise<string> {
    await this.startCollectors({ waitForFirstRead: true });
    return this.collectors.scrape();
  }

  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private startCollectors(options: CollectorStartOptions): Promise<void> {
    this.collectorsStarted ??= this.collectors.start(options);
    return this.collectorsStarted;
  }

  private async shutdown(): Promise<void> {
    this.standby?.close();
    this.xidPolicy?.close();
    const server = this.server;
    if (server) {
      await new Promise<void>((resolve) => {
        server.close((error) => {
          if (error) this.options.logger.warn({ err: error }, 'HTTP server did not close cleanly');
          resolve();
        });
        // Scrapers keep connections alive; they must not hold the shutdown.
        server.closeIdleConnections();
      });
    }
    await this.collectorsStarted;
    await this.collectors.close();
    await this.fastPath.close();
  }

  private authorised(request: IncomingMessage): boolean {
    const token = this.options.apiToken;
    if (token === undefined) return true;
    const given = /^Bearer\s+(.+)$/i.exec(request.headers.authorization ?? '')?.[1]?.trim() ?? '';
    const digest = (text: string): Buffer => lazyCrypto().createHash('sha256').update(text).digest();
    return lazyCrypto().timingSafeEqual(digest(given), digest(token));
  }

  private async serveRoute(route: AgentRoute, request: IncomingMessage, response: ServerResponse, url: URL): Promise<void> {
    if (request.method !== route.method) {
      sendJson(response, 405, { error: `use ${route.method} for ${route.path}` });
      return;
    }
    if (route.method === 'POST') {
      // Before authentication, so that guessing tokens is throttled as well.
      const decision = this.limiter.take(request.socket.remoteAddress ?? 'unknown');
      if (!decision.allowed) {
        response.setHeader('retry-after', String(decision.retryAfterSeconds));
        sendJson(response, 429, { error: rateLimitMessage(this.limiter.settings, decision.retryAfterSeconds) });
        return;
      }
    }
    if (route.method === 'POST' && !this.authorised(request)) {
      response.setHeader('www-authenticate', 'Bearer realm="steadfast-agent"');
      sendJson(response, 401, { error: 'missing or invalid "Authorization: Bearer <token>" header' });
      return;
    }
    let body: unknown;
    if (route.method === 'POST') {
      const read = await readBody(request);
      if (!read.ok) {
        // The rest of an oversized body is not worth reading: answer, then drop the connection.
        response.setHeader('connection', 'close');
        sendJson(response, read.status, { error: read.error });
        return;
      }
      try {
        body = read.text.trim() === '' ? undefined : JSON.parse(read.text);
      } catch (error) {
        sendJson(response, 400, { error: `request body is not valid JSON: ${errorMessage(error)}` });
        return;
      }
    }
    const answer = await route.handle({ method: request.method, path: url.pathname, query: url.searchParams, body });
    sendJson(response, answer.status, answer.body);
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    // An absolute-form target (`GET http://a:b/ HTTP/1.1`) can be an invalid URL; that must be a 400, not a crash.
    const target = request.url ?? '/';
    if (!URL.canParse(target, 'http://agent')) {
      sendJson(response, 400, { error: 'request target is not a valid URL' });
      return;
    }
    const url = new URL(target, 'http://agent');
    const path = url.pathname;
    try {
      const route = this.collectors.routes.find((candidate) => candidate.path === path);
      if (route) {
        await this.serveRoute(route, request, response, url);
      } else if (request.method !== 'GET' && request.method !== 'HEAD') {
        response.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      } else if (path === '/metrics') {
        const body = (await this.collectors.scrape()) + (await this.processRegistry.metrics());
        response.writeHead(200, { 'content-type': this.registry.contentType }).end(body);
      } else if (path === '/healthz') {
        response.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
      } else if (path === '/') {
        response.writeHead(200, { 'content-type': 'text/plain' }).end('steadfast agent: see /metrics and /healthz\n');
      } else {
        response.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      }
    } catch (error) {
      this.options.logger.error({ err: error, path }, 'request failed');
      if (response.headersSent) response.destroy();
      else sendJson(response, 500, { error: 'internal error; see the agent log' });
    }
  }
}

/** Largest request body a collector endpoint accepts. */
const MAX_BODY_BYTES = 1024 * 1024;

function sendJson(response: ServerResponse, status: number, body: unknown): void {
  const text = typeof body === 'string' ? body : JSON.stringify(body);
  response.writeHead(status, { 'content-type': typeof body === 'string' ? 'text/plain' : 'application/json' }).end(text);
}

async function readBody(request: IncomingMessage): Promise<{ ok: true; text: string } | { ok: false; status: number; error: string }> {
  const declared = Number(request.headers['content-length'] ?? 0);
  if (declared > MAX_BODY_BYTES) return { ok: false, status: 413, error: `request body larger than ${MAX_BODY_BYTES} bytes` };
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of request) {
    const buffer = chunk as Buffer;
    size += buffer.length;
    if (size > MAX_BODY_BYTES) return { ok: false, status: 413, error: `request body larger than ${MAX_BODY_BYTES} bytes` };
    chunks.push(buffer);
  }
  return { ok: true, text: Buffer.concat(chunks).toString('utf8') };
}

export function createAgent(options: AgentOptions): Agent {
  return new NodeAgent(options);
}
