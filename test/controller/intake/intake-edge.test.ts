import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { parse as parseYaml } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { QUEUE_NAMES } from '../../../core/queues.js';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import type { Controller } from '../../../controller/service.js';
import { ALERTMANAGER_CONFIG, CONTROLLER_RECEIVER } from '../../../rules/index.js';
import { TEST_TOKEN, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { storedSignals } from '../../support/stored-signals.js';
import { until } from '../../support/until.js';

/**
 * What the intake refuses and how it counts: the content it takes (JSON, UTF-8, no NUL, plausible
 * times), alerts judged one by one (a bad one is listed, the rest stored), and a drain reason
 * built from checked fields only. Real controller with its workers, real Redis, dry-run backend.
 */

const WEBHOOKS = join(import.meta.dirname, '..', '..', 'fixtures', 'realworld', 'alertmanager-webhook');

interface Answer {
  status: number;
  body: { error?: string; accepted?: number; ids?: string[]; refused?: { index: number; reason: string }[] };
}

async function send(url: string, body: string | Uint8Array<ArrayBuffer>, contentType: string | undefined, path = '/api/v1/alerts'): Promise<Answer> {
  const headers: Record<string, string> = { authorization: `Bearer ${TEST_TOKEN}` };
  if (contentType !== undefined) headers['content-type'] = contentType;
  const response = await fetch(`${url}${path}`, { method: 'POST', headers, body });
  return { status: response.status, body: (await response.json()) as Answer['body'] };
}

function alert(labels: Record<string, string>, startsAt = new Date().toISOString()): Record<string, unknown> {
  return { status: 'firing', labels: { severity: 'critical', ...labels }, annotations: { summary: 'test' }, startsAt };
}

function webhook(alerts: unknown[]): Record<string, unknown> {
  return { version: '4', status: 'firing', receiver: CONTROLLER_RECEIVER, groupLabels: {}, commonLabels: {}, commonAnnotations: {}, alerts };
}

describe('controller intake: what it refuses, and how it counts', () => {
  const store = testRedis();
  let controller: Controller;
  let url: string;
  let metricsUrl: string;
  let signals: Queue;

  beforeAll(async () => {
    // The default body limit: the shipped Alertmanager config must fit it.
    ({ controller, url, metricsUrl } = await startController(testConfig(store.url, store.prefix, { controller: { rateLimit: { requestsPerSecond: 0 } } })));
    signals = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
  });
  afterAll(async () => {
    await signals.close();
    await controller.close();
    await store.cleanup();
  });

  it('accepts a webhook of the shipped max_alerts, each as big as the largest real alert, under the default body limit', async () => {
    const config = parseYaml(readFileSync(ALERTMANAGER_CONFIG, 'utf8')) as { receivers: { name: string; webhook_configs?: { max_alerts?: number }[] }[] };
    const maxAlerts = config.receivers.find((receiver) => receiver.name === CONTROLLER_RECEIVER)?.webhook_configs?.[0]?.max_alerts ?? 0;
    expect(maxAlerts).toBeGreaterThan(0);
    const sample = JSON.parse(readFileSync(join(WEBHOOKS, 'prometheus-msteams_grafana-inspired-payload_3alerts.json'), 'utf8')) as {
      alerts: Record<string, unknown>[];
    };
    const largest = sample.alerts.reduce((a, b) => (JSON.stringify(a).length >= JSON.stringify(b).length ? a : b));
    const alerts = Array.from({ length: maxAlerts }, (_, index) => ({ ...largest, fingerprint: index.toString(16).padStart(16, '0') }));
    const body = JSON.stringify({ ...sample, alerts });
    expect(Buffer.byteLength(body)).toBeGreaterThan(1024 * 1024);
    const answer = await send(url, body, 'application/json');
    expect(answer.status).toBe(202);
    expect(answer.body.accepted).toBe(maxAlerts);
    const { byId } = await storedSignals(signals);
    expect(answer.body.ids?.filter((id) => byId.has(id))).toHaveLength(maxAlerts);
  });

  it('takes only application/json, UTF-8 and uncompressed, and says what it got otherwise', async () => {
    const body = JSON.stringify(webhook([alert({ alertname: 'ContentTypeCheck', node: 'n01' })]));
    expect((await send(url, body, 'application/json; charset=utf-8')).status).toBe(202);
    expect(await send(url, body, 'text/plain')).toEqual({
      status: 415,
      body: { error: 'request body must be sent as "Content-Type: application/json" (UTF-8); got "text/plain"' },
    });
    expect(await send(url, body, undefined)).toMatchObject({ status: 415, body: { error: expect.stringMatching(/application\/json/) as unknown } });
    expect((await send(url, body, 'application/json; charset=utf-16')).status).toBe(415);
    expect((await send(url, body, 'application/x-www-form-urlencoded', '/api/v1/signals')).status).toBe(415);
  });

  it('refuses a body that is not UTF-8, and one with a NUL, naming the field', async () => {
    const bytes = new Uint8Array([...Buffer.from('{"version":"4","receiver":"'), 0xc3, 0x28, ...Buffer.from('"}')]);
    expect(await send(url, bytes, 'application/json')).toEqual({ status: 400, body: { error: 'request body is not valid UTF-8' } });
    const withNul = JSON.stringify(webhook([alert({ alertname: 'Nul\u0000Check', node: 'n01' })]));
    expect(await send(url, withNul, 'application/json')).toEqual({
      status: 400,
      body: { error: 'alerts.0.labels.alertname: must not contain a NUL character (\\u0000)' },
    });
    // A backslash followed by "u0000" is text, not a NUL.
    expect((await send(url, JSON.stringify(webhook([alert({ alertname: 'Escaped\\u0000Text', node: 'n01' })])), 'application/json')).status).toBe(202);
  });

  it('refuses times outside 2000 until a day from now, for alerts and fast-path events alike', async () => {
    const far = await post(`${url}/api/v1/alerts`, webhook([alert({ alertname: 'FarFuture', node: 'n01' }, '9999-12-31T23:59:59Z')]));
    expect(far.status).toBe(400);
    expect(far.body.error).toContain('alerts.0.startsAt: must be a time between 2000-01-01 and one day from now');
    const ends = await post(`${url}/api/v1/alerts`, webhook([{ ...alert({ alertname: 'FarEnd', node: 'n01' }), endsAt: '9999-12-31T23:59:59Z' }]));
    expect(ends.status).toBe(400);
    expect(ends.body.error).toContain('alerts.0.endsAt');
    const unset = await post(`${url}/api/v1/alerts`, webhook([{ ...alert({ alertname: 'UnsetEnd', node: 'n01' }), endsAt: '0001-01-01T00:00:00Z' }]));
    expect(unset.status).toBe(202);
    const event = { kind: 'gpu_lost', node: 'n01', gpu: '0000:3b:00', time: '9999-01-01T00:00:00Z' };
    const fast = await post(`${url}/api/v1/signals`, event);
    expect(fast.status).toBe(400);
    expect(fast.body.error).toContain('time: must be a time between 2000-01-01 and one day from now');
  });

  it('stores the valid alerts of a webhook and lists each refused one with its reason: a bad node, a non-numeric xid', async () => {
    const alerts = [
      alert({ alertname: 'SteadfastRdmaPortDown', node: 'n10', device: 'mlx5_0' }),
      alert({ alertname: 'SteadfastRdmaPortDown', node: 'n10; reboot', device: 'mlx5_0' }),
      alert({ alertname: 'SteadfastXidGpuResetRequired', node: 'n11', pci_bus_id: '0000:3b:00', xid: '79; touch /tmp/x', xid_severity: 'fatal' }),
      alert({ alertname: 'SteadfastRdmaPortDown', node: '--all', device: 'mlx5_1' }),
      alert({ alertname: 'SteadfastRdmaPortDown', node: 'n12', device: 'mlx5_1' }),
    ];
    const answer = await post(`${url}/api/v1/alerts`, webhook(alerts));
    expect(answer.status).toBe(202);
    const body = answer.body as Answer['body'];
    expect(body.accepted).toBe(2);
    expect(body.refused?.map((refusal) => refusal.index)).toEqual([1, 2, 3]);
    expect(body.refused?.[0]?.reason).toMatch(/^alerts\.1\.labels\.node: node must be 1-63 characters/);
    expect(body.refused?.[1]?.reason).toBe('alerts.2.labels.xid: xid must be an Xid code, a number of 1 to 6 digits');
    const { byId } = await storedSignals(signals);
    for (const id of body.ids ?? []) expect(byId.get(id)?.node).toMatch(/^n1[02]$/);
    const metrics = await (await fetch(`${metricsUrl}/metrics`)).text();
    expect(metrics).toMatch(/^steadfast_alerts_refused_total [3-9]\d*$/m);

    const allBad = await post(`${url}/api/v1/alerts`, webhook([alerts[1], alerts[3]]));
    expect(allBad.status).toBe(400);
    expect(allBad.body.error).toMatch(/all 2 alerts refused: alerts\.0\.labels\.node: .*; alerts\.1\.labels\.node: /);
  });

  it('builds a drain reason from checked fields only: a fast-path message never reaches it word for word', async () => {
    const message = 'NVRM: Xid (PCI:0000:5e:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot; $(touch /tmp/owned) `id`)';
    const event = { kind: 'xid', node: 'n20', gpu: '0000:5e:00', xid: 154, message, time: new Date().toISOString() };
    const answer = await post(`${url}/api/v1/signals`, event);
    expect(answer.status).toBe(202);
    const decision = await until(
      'the drain decision',
      () => controller.audit.read({ type: 'decision', node: 'n20' }),
      (entries) => entries.length > 0,
    );
    expect(decision[0]?.summary).toBe('drain n20: fatal Xid 154 (GPU recovery action is now a node reboot) on GPU 0000:5e:00');
    const drained = await until(
      'the dry-run drain',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (nodes) => 'n20' in nodes,
    );
    expect(drained.n20).not.toContain('touch');
    // The message itself is kept, as evidence, in the signal the audit records.
    const signal = await controller.audit.read({ type: 'signal', node: 'n20' });
    expect((signal[0]?.data.signal as { evidence: { message: string } }).evidence.message).toBe(message);
  });
});
