import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../../actuators/dry-run.js';
import { resumeCommand } from '../../../cli/resume.js';
import { QUEUE_NAMES } from '../../../core/queues.js';
import type { Controller } from '../../../controller/service.js';
import { ALERTMANAGER_TOKEN, agentToken, post, startController, testConfig } from '../../support/controller.js';
import { runCli } from '../../support/cli.js';
import { testRedis } from '../../support/redis.js';
import { storedSignals } from '../../support/stored-signals.js';
import { until } from '../../support/until.js';

/**
 * What an operator's `steadfast resume --force` closes: a drain's fault re-delivered after it
 * (Alertmanager re-sending an old webhook among new alerts, an agent's late report) takes no claim
 * on the node, so the node's next real fault is decided and drains it again; and the intake stores
 * one signal once however many batches carry it.
 */

const MINUTE = 60_000;

/** A webhook of firing alerts, each `[alertname, node, startsAt, fingerprint, extra labels]`. */
function webhook(...alerts: [string, string, number, string, Record<string, string>?][]): Record<string, unknown> {
  return {
    version: '4',
    status: 'firing',
    receiver: 'steadfast-controller',
    alerts: alerts.map(([alertname, node, startsAt, fingerprint, labels]) => ({
      status: 'firing',
      labels: { alertname, node, severity: 'critical', ...labels },
      annotations: { summary: alertname },
      startsAt: new Date(startsAt).toISOString(),
      fingerprint,
    })),
  };
}

function xid79(node: string, startsAt: number): [string, string, number, string, Record<string, string>] {
  // Alertmanager's fingerprint hashes the labels: every firing of this alert carries the same one.
  return ['SteadfastXidFatal', node, startsAt, `xid79-${node}`, { pci_bus_id: '0000:3a:00', xid: '79' }];
}

describe('a resume closes the faults before it', () => {
  const work = mkdtempSync(join(tmpdir(), 'steadfast-resume-closes-'));
  let store = testRedis();
  let controller: Controller | undefined;
  afterEach(async () => {
    await controller?.close();
    controller = undefined;
    await store.cleanup();
  });
  afterAll(() => rmSync(work, { recursive: true, force: true }));

  async function start(): Promise<{ controller: Controller; url: string; backend: DryRunBackend }> {
    store = testRedis();
    const started = await startController(testConfig(store.url, store.prefix));
    controller = started.controller;
    return { controller: started.controller, url: started.url, backend: new DryRunBackend(store.redis, store.keys) };
  }

  /** Waits until the policy worker has taken every stored batch. */
  async function signalsSettled(): Promise<void> {
    const queue = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    try {
      await until(
        'every signal batch processed',
        () => queue.getJobCounts('waiting', 'active', 'delayed', 'prioritized'),
        (counts) => Object.values(counts).every((count) => count === 0),
      );
    } finally {
      await queue.close();
    }
  }

  async function resumeForced(node: string): Promise<string> {
    const config = join(work, 'config.json');
    writeFileSync(config, JSON.stringify({ redis: { url: store.url, prefix: store.prefix }, backend: { kind: 'dry-run' } }));
    const run = await runCli(resumeCommand(), [node, '--force', '--reason', 'vendor says fine', '--config', config]);
    expect(run.exitCode, run.stderr).toBe(0);
    return run.stdout;
  }

  it('drains a node again on a new Xid 79 after a forced resume, though the old webhook came again with another alert in between', async () => {
    const { controller, url, backend } = await start();
    const drained = (): Promise<string[]> => backend.recorded().then((nodes) => Object.keys(nodes));
    const signalAudited = (node: string, count: number): Promise<unknown> =>
      until(
        `${count} signals about ${node} audited`,
        () => controller.audit.read({ node, type: 'signal' }),
        (entries) => entries.length >= count,
      );

    const old = webhook(xid79('rn-4', Date.now() - 30 * MINUTE));
    expect((await post(`${url}/api/v1/alerts`, old, ALERTMANAGER_TOKEN)).status).toBe(202);
    await until('rn-4 drained', drained, (nodes) => nodes.includes('rn-4'));
    expect(await resumeForced('rn-4')).toMatch(/^rn-4: resumed through dry-run .*, without its checks; decision d-[0-9a-f]+ closed\n$/);
    expect(await drained()).toEqual([]);

    // The old webhook again, together with another alert: a batch never seen before.
    const replay = webhook(xid79('rn-4', Date.now() - 30 * MINUTE), [
      'SteadfastRdmaPortFlapping',
      'rn-5',
      Date.now(),
      'flap-rn-5',
      { device: 'mlx5_0', port: '1' },
    ]);
    expect((await post(`${url}/api/v1/alerts`, replay, ALERTMANAGER_TOKEN)).status).toBe(202);
    await signalAudited('rn-5', 1);
    await signalsSettled();
    expect(await store.redis.get(store.keys.nodeDrainClaim('rn-4'))).toBeNull();

    // A new Xid 79 on the node: a fault of its own, drained.
    expect((await post(`${url}/api/v1/alerts`, webhook(xid79('rn-4', Date.now())), ALERTMANAGER_TOKEN)).status).toBe(202);
    await until('rn-4 drained again', drained, (nodes) => nodes.includes('rn-4'));
    const decisions = await controller.audit.read({ node: 'rn-4', type: 'decision' });
    expect(decisions).toHaveLength(2);
  });

  it("records and does not act on a report of a fault from before the resume that the intake no longer remembers, nor on an agent's late report of it", async () => {
    const { controller, url, backend } = await start();
    const drainedAt = Date.now() - 20 * MINUTE;
    expect((await post(`${url}/api/v1/alerts`, webhook(xid79('rn-6', drainedAt)), ALERTMANAGER_TOKEN)).status).toBe(202);
    await until(
      'rn-6 drained',
      () => backend.recorded(),
      (nodes) => 'rn-6' in nodes,
    );
    await resumeForced('rn-6');

    // Past the intake's memory of stored signals (a day, or its count): the same webhook is stored again.
    await store.redis.del(store.keys.intakeSeenSignals);
    expect((await post(`${url}/api/v1/alerts`, webhook(xid79('rn-6', drainedAt)), ALERTMANAGER_TOKEN)).status).toBe(202);
    // The node's agent delivers its report of the same Xid late (it was queued while the controller was away).
    const late = {
      kind: 'xid',
      node: 'rn-6',
      gpu: '0000:3a:00',
      xid: 79,
      message: 'GPU has fallen off the bus.',
      time: new Date(drainedAt + 1000).toISOString(),
    };
    expect((await post(`${url}/api/v1/signals`, late, agentToken('rn-6'))).status).toBe(202);
    const closed = await until(
      'the late report recorded',
      () => controller.audit.read({ node: 'rn-6', type: 'signal' }),
      (entries) => entries.some((entry) => entry.summary.startsWith('agent reports Xid 79')),
    );
    expect(closed.find((entry) => entry.summary.startsWith('agent reports Xid 79'))?.summary).toMatch(
      /; no action: it dates from .*, before an operator returned rn-6 to service at /,
    );
    await signalsSettled();
    expect(await store.redis.get(store.keys.nodeDrainClaim('rn-6'))).toBeNull();
    expect(await backend.recorded()).toEqual({});
    expect(await controller.audit.read({ node: 'rn-6', type: 'decision' })).toHaveLength(1);
  });

  it('stores one signal once though ten batches carry it, each with another', async () => {
    const { url } = await start();
    const queue = new Queue(QUEUE_NAMES.signals, { connection: store.redis, prefix: store.prefix });
    try {
      const repeated: [string, string, number, string] = ['SteadfastGpuTemperatureHigh', 'rn-8', Date.now() - MINUTE, 'hot-rn-8'];
      for (let batch = 0; batch < 10; batch += 1) {
        const answer = await post(
          `${url}/api/v1/alerts`,
          webhook(repeated, ['SteadfastGpuTemperatureHigh', `rn-9${batch}`, Date.now(), `hot-rn-9${batch}`]),
          ALERTMANAGER_TOKEN,
        );
        expect(answer.status).toBe(202);
      }
      const { byId } = await storedSignals(queue);
      const copies = async (): Promise<number> => {
        let count = 0;
        for (const job of await queue.getJobs(['waiting', 'active', 'completed', 'failed', 'delayed', 'prioritized'], 0, -1)) {
          count += ((job.data as { signals?: { node?: string }[] }).signals ?? []).filter((signal) => signal.node === 'rn-8').length;
        }
        return count;
      };
      expect([...byId.values()].filter((signal) => signal.node?.startsWith('rn-9')).length).toBe(10);
      expect(await copies()).toBe(1);
    } finally {
      await queue.close();
    }
  });
});
