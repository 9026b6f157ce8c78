import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Registry } from 'prom-client';
import { errorMessage } from '../core/errors.js';
import type { FastPathEvent } from '../core/fast-path.js';
import type { Logger } from '../core/log.js';
import { CollectorSet, type CollectorFactory, type CollectorPaths } from './collector.js';
import { createFastPathClient, type FastPathSender } from './fast-path-client.js';

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
  /** The enabled collectors (see enabledFactories in exporters/index.ts). */
  readonly collectors: readonly CollectorFactory[];
  readonly controllerUrl?: string | undefined;
  readonly controllerToken?: string | undefined;
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

class NodeAgent implements Agent {
  readonly registry = new Registry();
  private readonly fastPath: FastPathSender;
  private readonly collectors: CollectorSet;
  private server: Server | undefined;
  private collectorsStarted: Promise<void> | undefined;
  private closing: Promise<void> | undefined;

  constructor(private readonly options: AgentOptions) {
    this.fastPath = createFastPathClient({
      controllerUrl: options.controllerUrl,
      token: options.controllerToken,
      registry: this.registry,
      logger: options.logger.child({ component: 'fast-path' }),
    });
    const context = {
      registry: this.registry,
      paths: options.paths,
      logger: options.logger,
      node: options.node,
      fastPath: (event: FastPathEvent) => this.fastPath.send(event),
      pollIntervalSeconds: options.pollIntervalSeconds,
    };
    this.collectors = new CollectorSet(
      options.collectors.map((factory) => factory.create(context)),
      this.registry,
      options.logger,
    );
  }

  async start(): Promise<AddressInfo> {
    if (this.closing) throw new Error('agent is closed');
    await this.startCollectors();
    if (!this.server) {
      const server = createServer((request, response) => void this.handle(request, response));
      this.server = server;
      const { host, port } = this.options.listen ?? DEFAULT_LISTEN;
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
      server.on('error', (error) => this.options.logger.error({ err: errorMessage(error) }, 'HTTP server error'));
      this.options.logger.info({ address: server.address(), collectors: this.collectors.names }, 'agent listening');
    }
    return this.server.address() as AddressInfo;
  }

  async scrapeOnce(): Promise<string> {
    await this.startCollectors();
    return this.collectors.scrape();
  }

  close(): Promise<void> {
    this.closing ??= this.shutdown();
    return this.closing;
  }

  private startCollectors(): Promise<void> {
    this.collectorsStarted ??= this.collectors.start();
    return this.collectorsStarted;
  }

  private async shutdown(): Promise<void> {
    const server = this.server;
    if (server) {
      await new Promise<void>((resolve) => {
        server.close((error) => {
          if (error) this.options.logger.warn({ err: errorMessage(error) }, 'HTTP server did not close cleanly');
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

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const path = new URL(request.url ?? '/', 'http://agent').pathname;
    try {
      if (request.method !== 'GET' && request.method !== 'HEAD') {
        response.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      } else if (path === '/metrics') {
        const body = await this.collectors.scrape();
        response.writeHead(200, { 'content-type': this.registry.contentType }).end(body);
      } else if (path === '/healthz') {
        response.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
      } else if (path === '/') {
        response.writeHead(200, { 'content-type': 'text/plain' }).end('steadfast agent: see /metrics and /healthz\n');
      } else {
        response.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
      }
    } catch (error) {
      this.options.logger.error({ err: errorMessage(error), path }, 'request failed');
      if (!response.headersSent) response.writeHead(500, { 'content-type': 'text/plain' });
      response.end('internal error\n');
    }
  }
}

export function createAgent(options: AgentOptions): Agent {
  return new NodeAgent(options);
}
