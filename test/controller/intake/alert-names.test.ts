import { afterAll, describe, expect, it } from 'vitest';
import type { Controller } from '../../../controller/service.js';
import { ALERTMANAGER_TOKEN, post, startController, testConfig } from '../../support/controller.js';
import { testRedis } from '../../support/redis.js';
import { until } from '../../support/until.js';

/** Names every JavaScript object inherits a member under. */
const INHERITED_NAMES = ['constructor', 'toString', '__proto__', 'hasOwnProperty', 'valueOf'];

describe('alerts named after an inherited object member', () => {
  const store = testRedis();
  let controller: Controller | undefined;
  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it('are stored and audited as any alert without a recovery rule, each on its node, none lost', async () => {
    const started = await startController(testConfig(store.url, store.prefix));
    controller = started.controller;
    const alerts = INHERITED_NAMES.map((alertname, index) => ({
      status: 'firing',
      labels: { alertname, node: `proto-${index}`, severity: 'critical' },
      annotations: { summary: alertname },
      startsAt: new Date().toISOString(),
    }));
    const answer = await post(`${started.url}/api/v1/alerts`, { version: '4', status: 'firing', receiver: 'steadfast-controller', alerts }, ALERTMANAGER_TOKEN);
    expect(answer.status).toBe(202);
    expect(answer.body.accepted).toBe(INHERITED_NAMES.length);

    const audited = await until(
      'every alert audited',
      async () => (await started.controller.audit.read({ type: 'signal', limit: 100 })).map((entry) => entry.summary),
      (summaries) => summaries.length >= INHERITED_NAMES.length,
    );
    expect(audited.sort()).toEqual(
      INHERITED_NAMES.map(
        (alertname, index) => `alertmanager reports ${alertname} on proto-${index}; no action: no recovery rule for alert ${alertname}`,
      ).sort(),
    );
    expect(await started.controller.audit.read({ type: 'decision' })).toEqual([]);
  });
});
