import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { freePorts } from '../../sim/processes.js';

describe('free loopback ports for the simulated parts', () => {
  it('gives as many distinct ports as asked for, each free to listen on', async () => {
    const ports = await freePorts(40);
    expect(ports).toHaveLength(40);
    expect(new Set(ports).size).toBe(40);
    expect(ports.every((port) => port > 0)).toBe(true);
    const servers = await Promise.all(
      ports.map(
        (port) =>
          new Promise<ReturnType<typeof createServer>>((resolve, reject) => {
            const server = createServer();
            server.once('error', reject);
            server.listen(port, '127.0.0.1', () => resolve(server));
          }),
      ),
    );
    await Promise.all(servers.map((server) => new Promise<void>((resolve) => server.close(() => resolve()))));
  });
});
