import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SimEnvironment } from '../../tryit/environment.js';
import { renderAlertmanagerConfig } from '../../rules/index.js';
import { alertmanagerPeers, startAlertmanager, type AlertmanagerPart } from '../../tryit/parts.js';
import { waitFor } from '../../tryit/processes.js';
import { runFallenOffBus } from '../../tryit/scenario.js';

/**
 * An Alertmanager HA pair on the real parts: two prometheus-alertmanager processes clustered
 * over loopback gossip, Prometheus sending every alert to both, both routing to the controller.
 * A fault must still end in one decision and one Slurm drain, and with one Alertmanager dead
 * the other must carry the alert alone.
 */

/** Webhook notifications an Alertmanager sent successfully, from its own metrics. */
async function webhooksSent(part: AlertmanagerPart): Promise<number> {
  const text = await (await fetch(`${part.url}/metrics`)).text();
  const total = /^alertmanager_notifications_total\{integration="webhook"\} (\d+)/m.exec(text)?.[1];
  const failed = /^alertmanager_notifications_failed_total\{integration="webhook"[^}]*\} (\d+)/m.exec(text)?.[1];
  return Number(total ?? 0) - Number(failed ?? 0);
}

/** Whether the Alertmanager holds a firing SteadfastXidFatal alert for `node`. */
async function holdsXidAlert(part: AlertmanagerPart, node: string): Promise<boolean> {
  const filter = encodeURIComponent(`alertname="SteadfastXidFatal"`);
  const alerts = (await (await fetch(`${part.url}/api/v2/alerts?filter=${filter}`)).json()) as { labels: Record<string, string> }[];
  return alerts.some((alert) => alert.labels.node === node);
}

describe('an Alertmanager HA pair in front of the controller', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 3, fastPath: false, alertmanagers: 2, maxDrainsPerWindow: 10 });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('runs two clustered Alertmanagers, each seeing the other, and Prometheus sends to both', async () => {
    expect(env.alertmanagers).toHaveLength(2);
    for (const part of env.alertmanagers) expect(await alertmanagerPeers(part), part.name).toBe(2);
    const response = await fetch(`${env.prometheus.url}/api/v1/alertmanagers`);
    const body = (await response.json()) as { data: { activeAlertmanagers: { url: string }[] } };
    expect(body.data.activeAlertmanagers.map((entry) => new URL(entry.url).host).sort()).toEqual(env.alertmanagers.map((part) => part.address).sort());
  });

  it('turns one fault, alerted to both Alertmanagers, into one decision and one Slurm drain', async () => {
    const result = await runFallenOffBus(env, { node: 'node-1', gpuIndex: 0, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
    expect(result.slurmDrains).toBe(1);
    for (const part of env.alertmanagers) expect(await holdsXidAlert(part, 'node-1'), `${part.name} holds the alert`).toBe(true);
    const sent = await Promise.all(env.alertmanagers.map((part) => webhooksSent(part)));
    expect(sent.reduce((sum, count) => sum + count, 0)).toBeGreaterThanOrEqual(1);
    const audit = await env.audit('node-1');
    expect(audit.filter((entry) => entry.type === 'decision')).toHaveLength(1);
    expect(audit.filter((entry) => entry.type === 'action' && entry.data.state === 'running')).toHaveLength(1);
  }, 60_000);

  it('drains once when both Alertmanagers of a pair notify the controller of the same alert', async () => {
    // A pair that cannot gossip (a partition, here two unclustered processes): each notifies on
    // its own, every time. The controller's intake must make one signal of the two.
    const config = renderAlertmanagerConfig({
      webhookUrl: `${env.controllerUrl}/api/v1/alerts`,
      credentialsFile: env.credentials.alertmanagerTokenFile,
      groupWait: '0s',
      groupInterval: '1s',
    });
    const pair = [
      await startAlertmanager(env.processes, env.root, config, { name: 'partitioned-a' }),
      await startAlertmanager(env.processes, env.root, config, { name: 'partitioned-b' }),
    ];
    const alert = [
      {
        labels: {
          alertname: 'SteadfastXidFatal',
          node: 'node-3',
          pci_bus_id: '0000:ba:00',
          xid: '79',
          xid_severity: 'fatal',
          severity: 'critical',
          domain: 'gpu',
          job: 'steadfast-agent',
        },
        annotations: { summary: 'A GPU reported a fatal Xid error.' },
        startsAt: new Date().toISOString(),
      },
    ];
    // As Prometheus does: the same alert to every Alertmanager it knows.
    for (const part of pair) {
      const response = await fetch(`${part.url}/api/v2/alerts`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(alert),
      });
      expect(response.status).toBe(200);
    }
    await waitFor(
      'both Alertmanagers to notify',
      async () => (await Promise.all(pair.map((part) => webhooksSent(part)))).every((count) => count >= 1),
      20_000,
      200,
    );
    await waitFor('node-3 drained', async () => (await env.controller.backend.nodeState('node-3')).drained, 20_000, 100);
    const audit = await env.audit('node-3');
    expect(audit.filter((entry) => entry.type === 'signal')).toHaveLength(1);
    expect(audit.filter((entry) => entry.type === 'decision')).toHaveLength(1);
    expect(audit.filter((entry) => entry.type === 'action' && entry.data.state === 'running')).toHaveLength(1);
    for (const part of pair) await env.processes.stop(part.name, 0, 'SIGKILL');
  }, 60_000);

  it('still drains from the Prometheus alert when one Alertmanager of the pair is dead', async () => {
    const [first] = env.alertmanagers as [AlertmanagerPart, AlertmanagerPart];
    await env.processes.stop(first.name, 0, 'SIGKILL');
    const result = await runFallenOffBus(env, { node: 'node-2', gpuIndex: 3, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
    expect(result.slurmDrains).toBe(1);
  }, 60_000);
});
