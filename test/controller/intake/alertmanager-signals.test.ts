import fc from 'fast-check';
import { afterEach, describe, expect, it } from 'vitest';
import { signalsFromWebhook, webhookPayloadSchema } from '../../../controller/intake/alertmanager.js';
import type { Controller } from '../../../controller/service.js';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { signalSchema } from '../../../core/signal.js';
import { ALERT_CATALOGUE } from '../../../rules/catalogue.js';
import { post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/**
 * What the webhook schema accepts, the signal schema must accept too: otherwise an alert gets
 * 202 and then fails in the policy worker as an invalid payload, with no audit entry and no drain.
 */

/** Short text of any characters, or text up to `max` long: fast-check alone rarely tries long strings. */
const long = (max: number): fc.Arbitrary<string> =>
  fc.oneof(
    fc.string({ maxLength: 40, unit: 'grapheme-ascii' }),
    fc.tuple(fc.integer({ min: 1, max }), fc.constantFrom('a', '9', '_', '¤')).map(([n, unit]) => unit.repeat(n)),
  );
const labelName = fc.oneof(fc.constantFrom('alertname', 'node', 'xid', 'job', 'training_job', 'domain', 'severity', 'pci_bus_id', 'instance'), long(140));
const labelValue = fc.oneof(fc.constantFrom('SteadfastXidFatal', 'SteadfastGpuLost', 'node-3', '79', 'training', 'llama', '0000:3a:00.0'), long(20_000));
const alert = fc.record({
  labels: fc.dictionary(labelName, labelValue, { maxKeys: 8 }),
  annotations: fc.dictionary(fc.constantFrom('summary', 'description', 'runbook_url'), long(20_000), { maxKeys: 3 }),
  startsAt: fc.constant('2026-11-21T10:00:00Z'),
  generatorURL: fc.option(long(20_000), { nil: undefined }),
  fingerprint: fc.option(fc.stringMatching(/^[0-9a-f]{16}$/), { nil: undefined }),
});

describe('Alertmanager alerts become valid signals', () => {
  it('turns every webhook the intake accepts into signals the workers accept (fast-check, 300 webhooks)', () => {
    fc.assert(
      fc.property(fc.array(alert, { minLength: 1, maxLength: 3 }), (alerts) => {
        const parsed = webhookPayloadSchema.safeParse({ version: '4', status: 'firing', receiver: 'steadfast', alerts });
        if (!parsed.success) return;
        for (const signal of signalsFromWebhook(parsed.data, new Date())) {
          const checked = signalSchema.safeParse(signal);
          expect(checked.success, checked.success ? '' : checked.error.message).toBe(true);
        }
      }),
      { numRuns: 300, seed: 20261123 },
    );
  });

  it('refuses an Xid alert whose xid is not a number, naming the field, instead of draining on "fatal Xid ?"', () => {
    const parsed = webhookPayloadSchema.safeParse({
      version: '4',
      status: 'firing',
      receiver: 'steadfast',
      alerts: [{ labels: { alertname: 'SteadfastXidFatal', node: 'node-3', xid: '79; touch /tmp/x' }, startsAt: '2026-11-21T10:00:00Z' }],
    });
    expect(parsed.success).toBe(false);
    expect(parsed.error?.issues[0]?.path).toEqual(['alerts', 0, 'labels', 'xid']);
  });

  it('turns each alert of the catalogue into the signal kind its rule means, and any other alert into an alert signal', () => {
    const labelsOf = (alertname: string) => ({ alertname, node: 'node-3', xid: '79', pci_bus_id: '0000:3a:00.0' });
    const expected = [...ALERT_CATALOGUE.values()].map((entry) => [entry.alert, entry.meaning.signal]);
    expected.push(['SomebodyElsesAlert', 'alert'], ['constructor', 'alert'], ['__proto__', 'alert']);
    const alerts = expected.map(([name]) => ({ labels: labelsOf(name ?? ''), startsAt: '2026-11-21T10:00:00Z' }));
    const payload = webhookPayloadSchema.parse({ version: '4', status: 'firing', receiver: 'steadfast-controller', alerts });
    expect(signalsFromWebhook(payload, new Date('2026-11-21T10:00:01Z')).map((signal) => [signal.evidence.alertname, signal.kind])).toEqual(expected);
    expect(expected.filter(([, kind]) => kind !== 'alert').length, 'the catalogue maps some alerts to their own kinds').toBeGreaterThan(0);
  });

  it('refuses an alert the catalogue turns into an Xid signal when it carries no Xid', () => {
    for (const entry of [...ALERT_CATALOGUE.values()].filter((candidate) => candidate.meaning.signal === 'xid')) {
      const alerts = [{ labels: { alertname: entry.alert, node: 'node-3' }, startsAt: '2026-11-21T10:00:00Z' }];
      const result = webhookPayloadSchema.safeParse({ version: '4', status: 'firing', receiver: 'r', alerts });
      expect(result.success, entry.alert).toBe(false);
    }
  });

  it('cuts a long description but keeps the alert whole, saying it was cut', () => {
    const payload = webhookPayloadSchema.parse({
      version: '4',
      status: 'firing',
      receiver: 'steadfast',
      alerts: [
        {
          labels: { alertname: 'SteadfastXidFatal', node: 'node-3', xid: '79', training_job: 'not a job name!' },
          annotations: { description: 'x'.repeat(5000) },
          startsAt: '2026-11-21T10:00:00Z',
        },
      ],
    });
    const [signal] = signalsFromWebhook(payload, new Date());
    expect(String(signal?.evidence.description)).toMatch(/^x{4000,}…\[truncated\]$/);
    expect(String(signal?.evidence.description).length).toBe(4096);
    expect(signal?.job).toBeUndefined();
    expect(signal?.evidence['label.training_job']).toBe('not a job name!');
  });

  it("takes the training job from training_job, never the agents' scrape job, and still from a training job named in job", () => {
    const alert = (labels: Record<string, string>) => ({
      labels: { alertname: 'SteadfastTrainingStalled', node: 'node-3', domain: 'training', ...labels },
      annotations: {},
      startsAt: '2026-11-21T10:00:00Z',
    });
    const payload = webhookPayloadSchema.parse({
      version: '4',
      status: 'firing',
      receiver: 'steadfast',
      alerts: [alert({ job: 'steadfast-agent', training_job: 'llama-70b' }), alert({ job: 'steadfast-agent' }), alert({ job: 'gpt-small' })],
    });
    expect(signalsFromWebhook(payload, new Date()).map((signal) => signal.job)).toEqual(['llama-70b', undefined, 'gpt-small']);
  });
});

describe('an accepted alert is acted on', () => {
  const controllers: Controller[] = [];
  const stores: ReturnType<typeof testRedis>[] = [];
  afterEach(async () => {
    await Promise.all(controllers.splice(0).map((controller) => controller.close()));
    await Promise.all(stores.splice(0).map((store) => store.cleanup()));
  });

  it('drains the node of a fatal-Xid alert with a 5,000-character description, and audits it', async () => {
    const store = testRedis();
    stores.push(store);
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    controllers.push(controller);
    const webhook = {
      version: '4',
      status: 'firing',
      receiver: 'steadfast',
      alerts: [
        {
          labels: { alertname: 'SteadfastXidFatal', node: 'node-3', xid: '79', pci_bus_id: '00000000:3A:00.0', severity: 'critical' },
          annotations: { description: 'd'.repeat(5000) },
          startsAt: new Date().toISOString(),
        },
      ],
    };
    expect((await post(`${url}/api/v1/alerts`, webhook)).status).toBe(202);
    await until(
      'node-3 drained',
      () => new DryRunBackend(store.redis, store.keys).recorded(),
      (drained) => 'node-3' in drained,
    );
    const signals = await controller.audit.read({ type: 'signal' });
    expect(signals.some((entry) => entry.node === 'node-3' && entry.summary.includes('Xid 79'))).toBe(true);
  });
});
