import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { Counter, Registry } from 'prom-client';
import { afterEach, describe, expect, it } from 'vitest';
import type { StepRecord } from '../../core/steps.js';
import { configSchema } from '../../core/config.js';
import { GrafanaAnnotator } from '../../controller/grafana.js';
import type { Controller } from '../../controller/service.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

const GRAFANA_TOKEN = 'glsa_test_0123456789abcdef';

interface Received {
  method: string | undefined;
  path: string | undefined;
  authorization: string | undefined;
  contentType: string | undefined;
  body: unknown;
}

/** A stand-in for Grafana's HTTP API: records every request and answers as `reply` says. */
class GrafanaStandIn {
  readonly received: Received[] = [];
  private readonly server: Server;
  private readonly hanging: ServerResponse[] = [];

  constructor(private readonly reply: 'ok' | 'error' | 'hang' = 'ok') {
    this.server = createServer((request, response) => void this.handle(request, response));
  }

  async start(): Promise<string> {
    this.server.listen(0, '127.0.0.1');
    await once(this.server, 'listening');
    return `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    this.received.push({
      method: request.method,
      path: request.url,
      authorization: request.headers.authorization,
      contentType: request.headers['content-type'],
      body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown,
    });
    if (this.reply === 'hang') {
      this.hanging.push(response);
      return;
    }
    response.writeHead(this.reply === 'ok' ? 200 : 503, { 'content-type': 'application/json' });
    response.end(this.reply === 'ok' ? '{"id":1,"message":"Annotation added"}' : '{"message":"database is locked"}');
  }

  async close(): Promise<void> {
    for (const response of this.hanging) response.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

function record(state: StepRecord['state'] = 'done'): StepRecord {
  return {
    ref: 'd-42',
    verb: 'drain',
    node: 'node-3',
    state,
    detail: 'drained: fatal Xid 79',
    backend: 'slurm',
    time: '2025-06-01T12:00:00.000Z',
  };
}

function annotator(url: string, options: { timeoutMs?: number; dashboardUid?: string } = {}) {
  const registry = new Registry();
  const failed = new Counter({ name: 'steadfast_grafana_annotations_failed_total', help: 'h', labelNames: ['reason'], registers: [registry] });
  const lines: string[] = [];
  const logger = pino({ level: 'warn' }, { write: (line: string) => void lines.push(line) });
  const client = new GrafanaAnnotator({ url, token: GRAFANA_TOKEN, timeoutMs: options.timeoutMs ?? 2000, dashboardUid: options.dashboardUid, failed, logger });
  const failures = async (reason: string): Promise<number> => (await failed.get()).values.find((value) => value.labels.reason === reason)?.value ?? 0;
  return { client, failures, lines };
}

async function until(what: string, ok: () => boolean | Promise<boolean>, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await ok())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

describe('Grafana annotations client', () => {
  const standIns: GrafanaStandIn[] = [];
  afterEach(async () => Promise.all(standIns.splice(0).map((standIn) => standIn.close())));

  async function grafana(reply: 'ok' | 'error' | 'hang' = 'ok'): Promise<{ standIn: GrafanaStandIn; url: string }> {
    const standIn = new GrafanaStandIn(reply);
    standIns.push(standIn);
    return { standIn, url: await standIn.start() };
  }

  it('POSTs the finished action to /api/annotations with the bearer token, the steadfast, verb, state and node tags, and the dashboard uid', async () => {
    const { standIn, url } = await grafana();
    const { client, failures } = annotator(url, { dashboardUid: 'steadfast-fleet' });
    client.annotate(record('refused'));
    await client.settled();
    expect(standIn.received).toEqual([
      {
        method: 'POST',
        path: '/api/annotations',
        authorization: `Bearer ${GRAFANA_TOKEN}`,
        contentType: 'application/json',
        body: {
          time: Date.parse('2025-06-01T12:00:00.000Z'),
          tags: ['steadfast', 'drain', 'refused', 'node-3'],
          text: 'drain node-3: refused (drained: fatal Xid 79) [slurm, decision d-42]',
          dashboardUID: 'steadfast-fleet',
        },
      },
    ]);
    expect(await failures('status')).toBe(0);
  });

  it('keeps a path prefix in the Grafana URL and leaves dashboardUID out when none is configured', async () => {
    const { standIn, url } = await grafana();
    const { client } = annotator(`${url}/grafana/`);
    client.annotate(record());
    await client.settled();
    expect(standIn.received[0]?.path).toBe('/grafana/api/annotations');
    expect(standIn.received[0]?.body).not.toHaveProperty('dashboardUID');
  });

  it('counts and logs an error answer, a Grafana that does not answer in time, and one that is not there, without throwing', async () => {
    const failing = annotator((await grafana('error')).url);
    failing.client.annotate(record());
    await failing.client.settled();
    expect(await failing.failures('status')).toBe(1);
    expect(failing.lines.join('')).toContain('HTTP 503');

    const slow = annotator((await grafana('hang')).url, { timeoutMs: 200 });
    slow.client.annotate(record());
    await slow.client.settled();
    expect(await slow.failures('timeout')).toBe(1);

    const stopped = await grafana();
    await stopped.standIn.close();
    standIns.pop();
    const absent = annotator(stopped.url);
    absent.client.annotate(record());
    await absent.client.settled();
    expect(await absent.failures('unreachable')).toBe(1);
    expect(absent.lines.join('')).toContain('ECONNREFUSED');
  });
});

describe('the controller with a grafana section', () => {
  const stores: ReturnType<typeof testRedis>[] = [];
  const controllers: Controller[] = [];
  const standIns: GrafanaStandIn[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(standIns.splice(0).map((standIn) => standIn.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  async function setUp(reply: 'ok' | 'error'): Promise<{ standIn: GrafanaStandIn; controller: Controller; url: string }> {
    const standIn = new GrafanaStandIn(reply);
    standIns.push(standIn);
    const grafanaUrl = await standIn.start();
    const store = testRedis();
    stores.push(store);
    const config = testConfig(store.url, store.prefix, { grafana: { url: grafanaUrl, token: GRAFANA_TOKEN, dashboardUid: 'steadfast-node' } });
    const { controller, url } = await startController(config);
    controllers.push(controller);
    return { standIn, controller, url };
  }

  const xid = (node: string): Record<string, unknown> => ({
    kind: 'xid',
    node,
    gpu: '0000:3a:00',
    xid: 79,
    message: 'GPU has fallen off the bus.',
    time: new Date().toISOString(),
  });
  const actionStates = async (controller: Controller, node: string): Promise<unknown[]> =>
    (await controller.audit.read({ node })).filter((entry) => entry.type === 'action').map((entry) => entry.data.state);

  it('annotates a drain once it is done', async () => {
    const { standIn, controller, url } = await setUp('ok');
    expect((await post(`${url}/api/v1/signals`, xid('node-7'))).status).toBe(202);
    await until('the annotation', () => standIn.received.length === 1);
    expect(standIn.received[0]).toMatchObject({
      method: 'POST',
      path: '/api/annotations',
      authorization: `Bearer ${GRAFANA_TOKEN}`,
      body: { tags: ['steadfast', 'drain', 'done', 'node-7'], dashboardUID: 'steadfast-node' },
    });
    expect(await actionStates(controller, 'node-7')).toContain('done');
  });

  it('still carries out and records the action when Grafana answers with an error, and counts the failed annotation', async () => {
    const { standIn, controller, url } = await setUp('error');
    expect((await post(`${url}/api/v1/signals`, xid('node-8'))).status).toBe(202);
    await until('the failed annotation to be counted', async () =>
      (await controller.metrics.registry.metrics()).includes('steadfast_grafana_annotations_failed_total{reason="status"} 1'),
    );
    expect(standIn.received).toHaveLength(1);
    const states = await actionStates(controller, 'node-8');
    expect(states).toContain('done');
    expect(states).not.toContain('failed');
  });
});

describe('the grafana config section', () => {
  const base = { controller: { auth: { operatorToken: 'x'.repeat(16) } } };

  it('is optional, and takes a URL, a token and a dashboard uid with a default timeout', () => {
    expect(configSchema.parse(base).grafana).toBeUndefined();
    expect(
      configSchema.parse({ ...base, grafana: { url: 'https://grafana.example.com', token: GRAFANA_TOKEN, dashboardUid: 'steadfast-fleet' } }).grafana,
    ).toEqual({
      url: 'https://grafana.example.com',
      token: GRAFANA_TOKEN,
      dashboardUid: 'steadfast-fleet',
      timeoutMs: 5000,
    });
  });

  it('refuses a section without a token, with a URL that is not http(s), or with an unknown key, naming the field', () => {
    const problems = (grafana: object): string => {
      const result = configSchema.safeParse({ ...base, grafana });
      return result.success ? '' : result.error.issues.map((issue) => `${issue.path.join('.')}: ${issue.message}`).join('; ');
    };
    expect(problems({ url: 'http://grafana:3000' })).toBe('grafana.token: set token or tokenFile');
    expect(problems({ url: 'grafana:3000', token: GRAFANA_TOKEN })).toMatch(/^grafana\.url: /);
    expect(problems({ url: 'http://grafana:3000', token: GRAFANA_TOKEN, dashboard: 'x' })).toMatch(/dashboard/);
  });
});
