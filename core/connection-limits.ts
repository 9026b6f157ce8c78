import { createServer, type RequestListener, type Server } from 'node:http';
import type { Socket } from 'node:net';

export interface ConnectionLimits {
  readonly headersTimeoutSeconds: number;
  readonly requestTimeoutSeconds: number;
  /** 0: no cap. */
  readonly maxPerClient: number;
}

/**
 * An HTTP server (the controller's, the node agent's) bounding what a client can hold of it
 * before it has shown a token: slow headers and slow bodies are cut by Node's own timers, and
 * connections beyond the per-address cap are closed as they open. Behind a load balancer every
 * request comes from its address: set the cap to 0 there.
 */
export function createLimitedServer(
  handler: RequestListener,
  limits: ConnectionLimits,
  /** Called for each refused connection; `first` once per address until its connections drop back under the cap. */
  onRefused: (address: string, first: boolean) => void,
): Server {
  const headersTimeout = limits.headersTimeoutSeconds * 1000;
  const server = createServer(
    {
      headersTimeout,
      requestTimeout: limits.requestTimeoutSeconds * 1000,
      // Node checks both timeouts on this interval; its default (30 s) lets a slow client stay far longer.
      connectionsCheckingInterval: Math.min(1000, headersTimeout),
    },
    handler,
  );
  if (limits.maxPerClient <= 0) return server;
  const open = new Map<string, number>();
  const refusing = new Set<string>();
  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress ?? 'unknown';
    const count = (open.get(address) ?? 0) + 1;
    if (count > limits.maxPerClient) {
      onRefused(address, !refusing.has(address));
      refusing.add(address);
      socket.destroy();
      return;
    }
    open.set(address, count);
    socket.once('close', () => {
      const left = (open.get(address) ?? 1) - 1;
      if (left < limits.maxPerClient) refusing.delete(address);
      if (left <= 0) open.delete(address);
      else open.set(address, left);
    });
  });
  return server;
}

/** Tries to take a port held a moment longer (a restarting predecessor, a client's passing connection) before giving up. */
const LISTEN_ATTEMPTS = 6;
const LISTEN_RETRY_MS = 500;

/** Listens on `host:port`; a port in use is tried again for a few seconds, any other failure is thrown at once. */
export async function listenOn(server: Server, port: number, host: string): Promise<void> {
  for (let attempt = 1; ; attempt += 1) {
    try {
      await new Promise<void>((resolve, reject) => {
        server.once('error', reject);
        server.listen(port, host, () => {
          server.off('error', reject);
          resolve();
        });
      });
      return;
    } catch (error) {
      const inUse = (error as NodeJS.ErrnoException).code === 'EADDRINUSE';
      if (!inUse || port === 0 || attempt >= LISTEN_ATTEMPTS) throw error;
      await new Promise((resolve) => setTimeout(resolve, LISTEN_RETRY_MS));
    }
  }
}
