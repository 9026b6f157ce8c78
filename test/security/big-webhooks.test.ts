import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES } from '../../core/queues.js';
import { signalsFromWebhookAlerts, webhookEnvelopeSchema } from '../../controller/intake/alertmanager.js';
import { ControllerProcess } from '../../tryit/controller-process.js';
import { ProcessGroup, freePort } from '../../tryit/processes.js';
import { TEST_TOKEN, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { storedSignals } from '../support/stored-signals.js';

/**
 * A burst of big webhooks at once against the controller process (its own memory, measured from
 * /proc) and the real Redis: the in-flight body budget turns the excess away with 503 before
 * reading it, so memory stays bounded; every 202 has stored all its alerts, every 503 none, and
 * the refused webhooks, sent again as Alertmanager would, are stored exactly once.
 */

const WEBHOOKS = 10;
const ALERTS_PER_WEBHOOK = 3000;
const BUDGET_BYTES = 5 * 1024 * 1024;
/**
 * Resident memory the burst may add to the idle controller process. An in-flight body costs many
 * times its size until it is answered (parsed alerts, signals, the Redis transaction): the budget
 * admits about three of these webhooks at once (about 120 MiB measured); all ten at once took 343 MiB.
 */
const PEAK_RSS_GROWTH_LIMIT_BYTES = 192 * 1024 * 1024;

function bigWebhook(index: number): Record<string, unknown> {
  const startsAt = new Date(Date.now() - 60_000).toISOString();
  return {
    version: '4',
    groupKey: `{}:{alertname="NodeFilesystemFull", batch="${index}"}`,
    status: 'firing',
    receiver: 'steadfast-controller',
    groupLabels: { alertname: 'NodeFilesystemFull' },
    commonLabels: { alertname: 'NodeFilesystemFull', severity: 'warning' },
    commonAnnotations: {},
    externalURL: 'http://alertmanager:9093',
    alerts: Array.from({ length: ALERTS_PER_WEBHOOK }, (_, alert) => ({
      status: 'firing',
      labels: {
        alertname: 'NodeFilesystemFull',
        severity: 'warning',
        node: `gpu-${String(index).padStart(3, '0')}-${alert}`,
        mountpoint: '/scratch',
        instance: `gpu-${index}-${alert}:9100`,
      },
      annotations: { summary: 'Filesystem almost full', description: `/scratch on gpu-${index}-${alert} has less than 5% space left.` },
      startsAt,
      endsAt: '0001-01-01T00:00:00Z',
      generatorURL: 'http://prometheus:9090/graph?g0.expr=node_filesystem_avail_bytes+%2F+node_filesystem_size_bytes+%3C+0.05',
      fingerprint: `${index.toString(16).padStart(4, '0')}${alert.toString(16).padStart(12, '0')}`,
    })),
  };
}

async function deliver(url: string, body: string): Promise<{ status: number; ids: string[]; retryAfter: string | null }> {
  const response = await fetch(`${url}/api/v1/alerts`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${TEST_TOKEN}` },
    body,
  });
  const answer = (await response.json()) as { ids?: string[] };
  return { status: response.status, ids: answer.ids ?? [], retryAfter: response.headers.get('retry-after') };
}

describe('a burst of big webhooks', () => {
  const store = testRedis();
  const group = new ProcessGroup();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-big-webhooks-'));
  let controller: ControllerProcess;
  let signals: Queue;

  beforeAll(async () => {
    const config = testConfig(store.url, store.prefix, {
      controller: { port: await freePort(), inFlightBodyBytes: BUDGET_BYTES, rateLimit: { requestsPerSecond: 0 } },
    });
    controller = new ControllerProcess(group, { name: 'controller', dir, config, workers: false });
    await controller.start();
    signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
  }, 90_000);

  afterAll(async () => {
    await signals.close();
    await group.stopAll();
    await store.cleanup();
    rmSync(dir, { recursive: true, force: true });
  });

  it('keeps memory bounded, stores all of every 202 and none of every 503, and stores each refused webhook once when it is sent again', async () => {
    const bodies = Array.from({ length: WEBHOOKS }, (_, index) => JSON.stringify(bigWebhook(index)));
    expect(Buffer.byteLength(bodies[0] ?? '') * WEBHOOKS).toBeGreaterThan(2 * BUDGET_BYTES);
    const idle = controller.peakRssBytes();
    const answers = await Promise.all(bodies.map((body) => deliver(controller.url, body)));
    const statuses = answers.map((answer) => answer.status);
    const peak = controller.peakRssBytes();
    console.log(
      `big webhooks: ${statuses.filter((status) => status === 503).length} of ${WEBHOOKS} answered 503 at first; controller RSS ${(idle / 2 ** 20).toFixed(0)} MiB idle, ${(peak / 2 ** 20).toFixed(0)} MiB at its peak`,
    );
    expect(peak - idle).toBeLessThan(PEAK_RSS_GROWTH_LIMIT_BYTES);
    expect(
      statuses.every((status) => status === 202 || status === 503),
      statuses.join(','),
    ).toBe(true);
    expect(statuses).toContain(202);
    expect(statuses).toContain(503);

    const { byId } = await storedSignals(signals);
    for (const [index, answer] of answers.entries()) {
      // The ids a webhook's alerts get, worked out the way the intake does.
      const envelope = webhookEnvelopeSchema.parse(JSON.parse(bodies[index] ?? ''));
      const expected = (await signalsFromWebhookAlerts(envelope, new Date())).signals.map((signal) => signal.id);
      const stored = expected.filter((id) => byId.has(id)).length;
      if (answer.status === 202) {
        expect(answer.ids).toEqual(expected);
        expect(stored, `webhook ${index} answered 202`).toBe(ALERTS_PER_WEBHOOK);
      } else {
        expect(answer.retryAfter).toBe('5');
        expect(stored, `webhook ${index} answered 503`).toBe(0);
      }
    }

    // Alertmanager sends a 5xx'd webhook again; one at a time, each now fits.
    for (const [index, answer] of answers.entries()) {
      if (answer.status === 503) expect((await deliver(controller.url, bodies[index] ?? '')).status).toBe(202);
    }
    const after = await storedSignals(signals);
    expect(after.byId.size).toBe(WEBHOOKS * ALERTS_PER_WEBHOOK);
    expect(after.copies, 'each signal stored once').toBe(WEBHOOKS * ALERTS_PER_WEBHOOK);
  }, 120_000);
});
