import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import type { FastPathEvent } from '../../core/fast-path-event.js';
import { silentLogger } from '../../core/log.js';
import { createFastPathClient, type FastPathOutcome, type FastPathSender } from '../../agent/fast-path-client.js';
import { seriesValue, waitFor } from './helpers.js';

const TOKEN = 'test-token-0123456789';

interface Received {
  readonly method: string | undefined;
  readonly url: string | undefined;
  readonly headers: IncomingHttpHeaders;
  readonly body: unknown;
}

/** A stand-in controller that answers each request with the next status of `statuses` (the last repeats). */
async function controller(statuses: number[]): Promise<{ url: string; received: Received[]; server: Server }> {
  const received: Received[] = [];
  const server = createServer((request, response) => {
    let body = '';
    request.on('data', (chunk: Buffer) => (body += chunk.toString()));
    request.on('end', () => {
      received.push({ method: request.method, url: request.url, headers: request.headers, body: JSON.parse(body) as unknown });
      const status = statuses[Math.min(received.length - 1, statuses.length - 1)] ?? 202;
      response.writeHead(status, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  servers.push(server);
  return { url: `http://127.0.0.1:${port}`, received, server };
}

const servers: Server[] = [];
const clients: FastPathSender[] = [];

afterEach(async () => {
  await Promise.all(clients.splice(0).map((client) => client.close()));
  await Promise.all(servers.splice(0).map((server) => new Promise((resolve) => server.close(resolve))));
});

function client(controllerUrl: string | undefined, queueLimit = 1000): { sender: FastPathSender; registry: Registry } {
  const registry = new Registry();
  const sender = createFastPathClient({ controllerUrl, token: TOKEN, registry, logger: silentLogger(), initialBackoffMs: 10, maxBackoffMs: 40, queueLimit });
  clients.push(sender);
  return { sender, registry };
}

function event(xid = 79): FastPathEvent {
  return { kind: 'xid', node: 'node-1', gpu: '0000:91:00', xid, message: 'GPU has fallen off the bus.', time: new Date().toISOString() };
}

describe('fast-path client', () => {
  it('posts the event to /api/v1/signals with the bearer token', async () => {
    const stub = await controller([202]);
    const { sender, registry } = client(stub.url);
    const sent = event();
    sender.send(sent);
    await sender.drained();
    expect(stub.received).toHaveLength(1);
    expect(stub.received[0]).toMatchObject({ method: 'POST', url: '/api/v1/signals', body: sent });
    expect(stub.received[0]?.headers.authorization).toBe(`Bearer ${TOKEN}`);
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_sent_total')).toBe(1);
  });

  it('retries after a 503 and a 429 until the controller accepts, counting each failed attempt', async () => {
    const stub = await controller([503, 429, 202]);
    const { sender, registry } = client(stub.url);
    sender.send(event());
    await sender.drained();
    expect(stub.received).toHaveLength(3);
    const text = await registry.metrics();
    expect(seriesValue(text, 'steadfast_agent_fast_path_sent_total')).toBe(1);
    expect(seriesValue(text, 'steadfast_agent_fast_path_failed_total{reason="server_error"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_agent_fast_path_failed_total{reason="throttled"}')).toBe(1);
  });

  it('gives up on a 400 without retrying and drops the event', async () => {
    const stub = await controller([400, 202]);
    const { sender, registry } = client(stub.url);
    sender.send(event());
    await sender.drained();
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(stub.received).toHaveLength(1);
    const text = await registry.metrics();
    expect(seriesValue(text, 'steadfast_agent_fast_path_failed_total{reason="rejected"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_agent_fast_path_sent_total')).toBe(0);
  });

  it('sends events that queued up while the controller was down as one batch once it is back', async () => {
    const stub = await controller([503, 202]);
    const { sender } = client(stub.url);
    sender.send(event(79));
    sender.send(event(48));
    sender.send(event(95));
    await sender.drained();
    const last = stub.received.at(-1);
    expect(Array.isArray(last?.body) ? last.body.map((item: FastPathEvent) => item.xid) : last?.body).toEqual([79, 48, 95]);
  });

  it('keeps retrying while the controller is unreachable, drops the oldest event when the queue is full, and stops on close', async () => {
    const stub = await controller([202]);
    await new Promise((resolve) => stub.server.close(resolve));
    const { sender, registry } = client(stub.url, 2);
    sender.send(event(79));
    sender.send(event(48));
    sender.send(event(95));
    await waitFor(async () => (seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_failed_total{reason="network"}') ?? 0) >= 2);
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_failed_total{reason="queue_full"}')).toBe(1);
    await sender.close();
    await sender.close();
    await sender.drained();
  });

  it('drops an event that breaks the fast-path contract instead of sending it', async () => {
    const stub = await controller([202]);
    const { sender, registry } = client(stub.url);
    sender.send({ ...event(), gpu: 'GPU-0' });
    await sender.drained();
    expect(stub.received).toEqual([]);
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_failed_total{reason="invalid"}')).toBe(1);
  });

  it('does nothing when no controller is configured', async () => {
    const { sender, registry } = client(undefined);
    sender.send(event());
    await sender.drained();
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_sent_total')).toBe(0);
  });

  it("tells each event's sender what became of it: delivered after retries, refused, dropped from a full queue, not sent at close", async () => {
    const outcomes: Array<[number, FastPathOutcome]> = [];
    const note = (xid: number) => (outcome: FastPathOutcome) => void outcomes.push([xid, outcome]);

    const retried = await controller([503, 202]);
    const first = client(retried.url).sender;
    first.send(event(79), note(79));
    await first.drained();
    expect(outcomes).toEqual([[79, 'delivered']]);

    const refusing = await controller([400]);
    const second = client(refusing.url).sender;
    second.send(event(48), note(48));
    second.send({ ...event(95), gpu: 'GPU-0' }, note(95));
    await second.drained();
    expect(outcomes.slice(1)).toEqual([
      [95, 'refused'],
      [48, 'refused'],
    ]);

    const down = await controller([202]);
    await new Promise((resolve) => down.server.close(resolve));
    const third = client(down.url, 1).sender;
    third.send(event(13), note(13));
    third.send(event(31), note(31));
    await third.close();
    third.send(event(43), note(43));
    expect(outcomes.slice(3)).toEqual([
      [13, 'dropped'],
      [31, 'not_sent'],
      [43, 'not_sent'],
    ]);

    client(undefined).sender.send(event(61), note(61));
    expect(outcomes.at(-1)).toEqual([61, 'not_sent']);
  });

  it('drops training progress reports before faults when its queue is full, and tells each sender once', async () => {
    const outcomes: Array<[string, FastPathOutcome]> = [];
    const down = await controller([202]);
    await new Promise((resolve) => down.server.close(resolve));
    const { sender, registry } = client(down.url, 2);
    const progress: FastPathEvent = {
      kind: 'training_progress',
      node: 'node-1',
      job: 'llama',
      rank: 0,
      iteration: 7,
      message: '',
      time: new Date().toISOString(),
    };
    sender.send(event(79), (outcome) => void outcomes.push(['xid 79', outcome]));
    sender.send(progress, (outcome) => void outcomes.push(['progress', outcome]));
    sender.send(event(48), (outcome) => void outcomes.push(['xid 48', outcome]));
    expect(outcomes).toEqual([['progress', 'dropped']]);
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_failed_total{reason="queue_full"}')).toBe(1);
    await sender.close();
    expect(outcomes.slice(1)).toEqual([
      ['xid 79', 'not_sent'],
      ['xid 48', 'not_sent'],
    ]);
  });

  it('keeps sending when an outcome handler throws', async () => {
    const stub = await controller([202]);
    const { sender, registry } = client(stub.url);
    sender.send(event(79), () => {
      throw new Error('handler bug');
    });
    sender.send(event(48));
    await sender.drained();
    expect(seriesValue(await registry.metrics(), 'steadfast_agent_fast_path_sent_total')).toBe(2);
  });

  it('spreads the retries of 100 agents that fail together instead of retrying in step', async () => {
    // A controller that is down for everybody at once, as after a restart.
    const down = await controller([503]);
    const baseMs = 20;
    const capMs = 5000;
    const pauses: number[][] = [];
    for (let index = 0; index < 100; index += 1) {
      const mine: number[] = [];
      pauses.push(mine);
      const logger = pino({ level: 'warn' }, { write: (line: string) => void mine.push((JSON.parse(line) as { retryInMs: number }).retryInMs) });
      const sender = createFastPathClient({
        controllerUrl: down.url,
        token: TOKEN,
        registry: new Registry(),
        logger,
        initialBackoffMs: baseMs,
        maxBackoffMs: capMs,
      });
      clients.push(sender);
      sender.send(event());
    }
    // A bound on the wait, not a timing: 200 refused requests on a loaded machine take seconds.
    await waitFor(async () => pauses.every((mine) => mine.length >= 2), 60_000);
    for (const round of [0, 1]) {
      const chosen = pauses.map((mine) => mine[round] ?? -1);
      const highest = round === 0 ? 3 * baseMs : 9 * baseMs;
      expect(Math.min(...chosen)).toBeGreaterThanOrEqual(baseMs);
      expect(Math.max(...chosen)).toBeLessThanOrEqual(highest);
      // Ten equal slices of the possible range: in step, all 100 would share one slice.
      const slices = new Map<number, number>();
      for (const pause of chosen) {
        const slice = Math.min(9, Math.floor(((pause - baseMs) / (highest - baseMs)) * 10));
        slices.set(slice, (slices.get(slice) ?? 0) + 1);
      }
      // Uniform in round 1 (10 expected per slice); in round 2 the lowest slice is the likeliest (about 19).
      expect(Math.max(...slices.values()), `round ${round + 1}: ${JSON.stringify([...slices])}`).toBeLessThanOrEqual(round === 0 ? 25 : 40);
      expect(new Set(chosen).size).toBeGreaterThan(20);
    }
  });
});
