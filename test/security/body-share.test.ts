import { connect, type Socket } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../controller/service.js';
import { ALERTMANAGER_TOKEN, agentToken, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

/**
 * One credential cannot hold the controller's whole in-flight body budget: four connections with
 * one agent's token, each declaring a 4 MiB body and trickling it a byte at a time, once made
 * every Alertmanager webhook answer 503 until the request timeout. Each credential now has its
 * share, and a body that arrives too slowly is cut off with 408.
 */

const MIB = 1024 * 1024;

interface Trickler {
  readonly socket: Socket;
  /** The status line of the answer, once one came. */
  readonly answer: Promise<string>;
  readonly closed: Promise<void>;
  stop(): void;
}

/** A POST that declares `length` bytes and sends one every 100 ms. */
function trickle(port: number, token: string, length: number): Trickler {
  const socket = connect(port, '127.0.0.1');
  let received = '';
  const answer = new Promise<string>((resolve) => {
    socket.on('data', (chunk) => {
      received += chunk.toString('latin1');
      const line = received.split('\r\n')[0] ?? '';
      if (received.includes('\r\n')) resolve(line);
    });
    socket.on('close', () => resolve(received.split('\r\n')[0] ?? ''));
  });
  const closed = new Promise<void>((resolve) => socket.on('close', () => resolve()));
  socket.on('error', () => undefined);
  socket.write(
    `POST /api/v1/signals HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\nContent-Type: application/json\r\nContent-Length: ${length}\r\n\r\n[`,
  );
  const timer = setInterval(() => socket.writable && socket.write(' '), 100);
  return { socket, answer, closed, stop: () => clearInterval(timer) };
}

describe('request bodies held per credential', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let port: number;

  beforeAll(async () => {
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0 } } }), {
      workers: false,
    }));
    port = Number(new URL(url).port);
  });

  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it('keeps serving Alertmanager while one agent trickles four 4 MiB bodies, and cuts the trickles off', async () => {
    const tricklers = Array.from({ length: 4 }, () => trickle(port, agentToken('n00'), 4 * MIB));
    try {
      // The first trickle holds this agent's whole share: the others are refused at once.
      const early = await Promise.all(tricklers.slice(1).map((trickler) => trickler.answer));
      for (const line of early) expect(line).toBe('HTTP/1.1 503 Service Unavailable');
      const webhooks = await Promise.all(
        Array.from({ length: 12 }, (_, index) =>
          fetch(`${url}/api/v1/alerts`, {
            method: 'POST',
            headers: { authorization: `Bearer ${ALERTMANAGER_TOKEN}`, 'content-type': 'application/json' },
            body: JSON.stringify(xidAlertPayload({ groupKey: `g${index}` })),
          }),
        ),
      );
      expect(webhooks.map((response) => response.status)).toEqual(Array.from({ length: 12 }, () => 202));
      // The one still trickling is answered 408 and its connection closed.
      const first = tricklers[0] as Trickler;
      expect(await first.answer).toBe('HTTP/1.1 408 Request Timeout');
      await first.closed;
    } finally {
      for (const trickler of tricklers) {
        trickler.stop();
        trickler.socket.destroy();
      }
    }
  }, 30_000);
});
