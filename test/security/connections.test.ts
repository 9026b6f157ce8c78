import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { TEST_TOKEN, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/** Resolves when the server closes `socket`, with what it sent before, or with null after `ms`. */
function closedWithin(socket: Socket, ms: number): Promise<string | null> {
  return new Promise((resolve) => {
    let said = '';
    socket.on('data', (chunk: Buffer) => (said += chunk.toString()));
    const timer = setTimeout(() => resolve(null), ms);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(said);
    });
  });
}

async function opened(port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1');
  socket.on('error', () => undefined);
  await new Promise((resolve) => socket.once('connect', resolve));
  return socket;
}

describe('connections before authentication', () => {
  const store = testRedis();
  let controller: Controller;
  let url = '';
  let metricsUrl = '';
  let port = 0;
  const sockets: Socket[] = [];

  beforeAll(async () => {
    const config = testConfig(store.url, store.prefix, {
      controller: { connections: { headersTimeoutSeconds: 1, requestTimeoutSeconds: 2, maxPerClient: 8 } },
    });
    ({ controller, url, metricsUrl } = await startController(config, { workers: false }));
    port = Number(new URL(url).port);
  });

  afterAll(async () => {
    for (const socket of sockets) socket.destroy();
    await controller.close();
    await store.cleanup();
  });

  it('cuts a client that never finishes its headers, and keeps answering others', async () => {
    const slow = await opened(port);
    sockets.push(slow);
    slow.write('POST /api/v1/alerts HTTP/1.1\r\nHost: controller\r\nX-Slow: ');
    const said = await closedWithin(slow, 8000);
    expect(said, 'the slow connection was still open after 8 s').not.toBeNull();
    expect(said).toMatch(/^(HTTP\/1\.1 408|$)/);
    expect((await fetch(`${url}/healthz`)).status).toBe(200);
  });

  it('closes connections past the per-address cap as they open, counts them, and serves again once they are gone', async () => {
    const held = await Promise.all(Array.from({ length: 8 }, () => opened(port)));
    sockets.push(...held);
    const extra = await opened(port);
    sockets.push(extra);
    expect(await closedWithin(extra, 3000)).toBe('');
    for (const socket of held) socket.destroy();
    await new Promise((resolve) => setTimeout(resolve, 100));
    const metrics = await (await fetch(`${metricsUrl}/metrics`)).text();
    expect(metrics).toMatch(/steadfast_requests_rejected_total\{endpoint="connection",reason="too_many_connections"\} [1-9]/);
    const answer = await fetch(`${url}/api/v1/jobs`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } });
    expect(answer.status).toBe(200);
  });
});
