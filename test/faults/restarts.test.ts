import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';
import { SimEnvironment } from '../../tryit/environment.js';
import { waitFor } from '../../tryit/processes.js';
import { countSlurmDrains as countDrains, runFallenOffBus } from '../../tryit/scenario.js';

/**
 * Restarts of the monitoring parts on the real processes: after Prometheus or Alertmanager
 * restarts, alerts reach the controller again; after an agent restarts, its counters start over
 * (or are read again from the kernel log) and that must not look like a new fault.
 */

const run = promisify(execFile);

interface PrometheusAlert {
  labels: Record<string, string>;
  state: string;
  activeAt: string;
}

async function prometheusAlerts(env: SimEnvironment): Promise<PrometheusAlert[]> {
  const body = (await (await fetch(`${env.prometheus.url}/api/v1/alerts`)).json()) as { data: { alerts: PrometheusAlert[] } };
  return body.data.alerts;
}

async function xidCounter(env: SimEnvironment, node: string): Promise<number[]> {
  const query = encodeURIComponent(`steadfast_xid_errors_total{node="${node}"}`);
  const body = (await (await fetch(`${env.prometheus.url}/api/v1/query?query=${query}`)).json()) as { data: { result: { value: [number, string] }[] } };
  return body.data.result.map((series) => Number(series.value[1]));
}

async function everyAgentScraped(env: SimEnvironment, after: number): Promise<boolean> {
  const body = (await (await fetch(`${env.prometheus.url}/api/v1/targets?state=active`)).json()) as {
    data: { activeTargets: { scrapePool: string; health: string; lastScrape: string }[] };
  };
  const agents = body.data.activeTargets.filter((target) => target.scrapePool === 'steadfast-agent');
  return agents.length === env.agents.length && agents.every((target) => target.health === 'up' && Date.parse(target.lastScrape) > after);
}

/** Whether Prometheus has evaluated every rule group since `after`. */
async function rulesEvaluatedSince(env: SimEnvironment, after: number): Promise<boolean> {
  const body = (await (await fetch(`${env.prometheus.url}/api/v1/rules`)).json()) as { data: { groups: { lastEvaluation: string }[] } };
  return body.data.groups.length > 0 && body.data.groups.every((group) => Date.parse(group.lastEvaluation) > after);
}

describe('restarts of Prometheus, Alertmanager and the agents', () => {
  let env: SimEnvironment;

  beforeAll(async () => {
    env = await SimEnvironment.start({ nodes: 4, maxDrainsPerWindow: 10 });
  }, 90_000);
  afterAll(async () => {
    await env?.stop();
  });

  it('delivers the Prometheus alert for a new fault after Prometheus restarted', async () => {
    const restartedAt = Date.now();
    await env.prometheus.restart();
    await waitFor('Prometheus to scrape every agent again', () => everyAgentScraped(env, restartedAt), 30_000, 200);
    const result = await runFallenOffBus(env, { node: 'node-1', gpuIndex: 0, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
  }, 60_000);

  it('delivers the Prometheus alert for a new fault after Alertmanager restarted', async () => {
    await env.alertmanager.restart();
    const result = await runFallenOffBus(env, { node: 'node-2', gpuIndex: 1, timeoutMs: 40_000 });
    expect(result.problems).toEqual([]);
  }, 60_000);

  it('makes no new decision and drains nothing again when agents restart, and a node whose log was rotated away raises no alert', async () => {
    // node-3: a fatal Xid, drained. node-4: two application-class Xids (one short of the alert's three).
    const drained = await runFallenOffBus(env, { node: 'node-3', gpuIndex: 2, timeoutMs: 40_000 });
    expect(drained.problems).toEqual([]);
    env.node('node-4').injectXid(4, 13, 'Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address');
    env.node('node-4').injectXid(4, 13, 'Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address');
    await waitFor("node-4's Xids in Prometheus", async () => (await xidCounter(env, 'node-4')).reduce((sum, value) => sum + value, 0) === 2, 20_000, 200);
    const before = { node3: await xidCounter(env, 'node-3'), decisions: (await env.audit()).filter((entry) => entry.type === 'decision').length };

    // Each agent is down for three scrapes: Prometheus marks its series stale, then sees them again.
    const restartedAt = Date.now();
    await Promise.all([env.restartAgent('node-3', { downMs: 3000 }), env.restartAgent('node-4', { rotateKernelLog: true, downMs: 3000 })]);
    const backAt = Date.now();
    await waitFor('Prometheus to scrape the restarted agents', () => everyAgentScraped(env, backAt), 20_000, 200);
    // Several scrape and evaluation rounds (1 s each) for a false alert to show and reach the
    // controller: every rule group evaluated again five intervals after the agents were back.
    await waitFor('five more rule evaluations after the agents came back', () => rulesEvaluatedSince(env, backAt + 5000), 30_000, 200);

    // node-3's agent read the same kernel log again: the same count. node-4's log is gone: no series, no alert.
    expect(await xidCounter(env, 'node-3')).toEqual(before.node3);
    expect(await xidCounter(env, 'node-4')).toEqual([]);
    const node4Alerts = (await prometheusAlerts(env)).filter((alert) => alert.labels.node === 'node-4');
    expect(node4Alerts.map((alert) => alert.labels.alertname)).toEqual([]);

    // The restarted agent finds the fatal Xid it reported in the log and does not send it again (its
    // xid state file); whatever else reached the controller about node-3 — Prometheus may re-fire
    // its alert after the gap — joins the decision made.
    expect((await env.audit()).filter((entry) => entry.type === 'decision')).toHaveLength(before.decisions);
    const again = (await env.audit('node-3')).filter((entry) => entry.type === 'signal' && Number(entry.id.split('-')[0]) >= restartedAt);
    expect(again.filter((entry) => (entry.data.signal as { source?: string }).source === 'agent')).toEqual([]);
    for (const entry of again) {
      const signal = entry.data.signal as { kind?: string; evidence?: { status?: string } };
      if (signal.kind === 'xid' && signal.evidence?.status !== 'resolved') expect(entry.data.sameFault, entry.summary).toBe(true);
    }
    expect(drained.slurmDrains).toBe(1);
    expect(countDrains(env, 'node-3')).toBe(1);
    expect((await env.audit('node-4')).filter((entry) => entry.type !== 'signal')).toEqual([]);
    expect(await env.controller.backend.nodeState('node-4')).toMatchObject({ drained: false });
  }, 90_000);
});

/**
 * The same question over longer spans than a live test can wait, with `promtool test rules` on
 * the shipped rule files: counters that start over, and series that vanish for a few scrapes
 * while an agent restarts.
 */
describe('the counter rules around resets and agent restarts', () => {
  const agent = 'instance="10.0.0.3:9401", job="steadfast-agent", node="node-3"';

  /** Runs one promtool case expecting no `alertname` alert at any of `evalTimes`; returns its output. */
  function expectSilence(ruleFile: string, alertname: string, series: string, values: string, evalTimes: string[]): Promise<string> {
    return promtool(
      ruleFile,
      series,
      values,
      evalTimes.map((time) => `      - eval_time: ${time}\n        alertname: ${alertname}\n        exp_alerts: []`).join('\n'),
    );
  }

  /** Runs one promtool case with the given `alert_rule_test` entries; returns its output. */
  async function promtool(ruleFile: string, series: string, values: string, cases: string): Promise<string> {
    const dir = mkdtempSync(join(tmpdir(), 'steadfast-promtool-'));
    try {
      const file = join(dir, 'restart.test.yml');
      writeFileSync(
        file,
        `rule_files:\n  - ${join(repoRoot(), 'rules', ruleFile)}\nevaluation_interval: 15s\ntests:\n  - interval: 15s\n    input_series:\n      - series: '${series}'\n        values: '${values}'\n    alert_rule_test:\n${cases}\n`,
      );
      const { stdout, stderr } = await run('promtool', ['test', 'rules', file]).catch((error: { stdout?: string; stderr?: string }) => ({
        stdout: error.stdout ?? '',
        stderr: error.stderr ?? '',
      }));
      return `${stdout}${stderr}`;
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }

  it('does not count a hardware counter reset (a driver reload zeroes link_downed) as link flaps', async () => {
    const series = `steadfast_rdma_port_link_downed_total{${agent}, device="mlx5_0", port="1"}`;
    // 5 downs long ago, then the counter starts over at 0 and stays there.
    const output = await expectSilence('network.yml', 'SteadfastRdmaPortFlapping', series, '5x40 0x40', ['10m15s', '11m', '13m', '15m30s']);
    expect(output).toContain('SUCCESS');
  });

  it('does not fire when a restarted agent no longer has the series (its kernel log rotated away)', async () => {
    const series = `steadfast_xid_errors_total{${agent}, pci_bus_id="0000:3a:00", xid="79", severity="fatal"}`;
    const output = await expectSilence('xid.yml', 'SteadfastXidFatal', series, '1x40 stale', ['10m30s', '11m', '15m30s', '16m']);
    expect(output).toContain('SUCCESS');
  });

  // The "first appearance" half of steadfast:xid_errors_fatal:increase5m (rules/promql.ts
  // newEvents) leaves out a series that comes back after a gap with the highest count it had in
  // the hour before: an agent restart reading the same count back, not a new Xid.
  it('does not fire again for an old fatal Xid after an agent restart that read the same count back', async () => {
    const series = `steadfast_xid_errors_total{${agent}, pci_bus_id="0000:3a:00", xid="79", severity="fatal"}`;
    // 1 for ten minutes (an old Xid), two missed scrapes (the restart at 10 min), then 1 again.
    const output = await expectSilence('xid.yml', 'SteadfastXidFatal', series, '1x40 stale stale 1x60', ['11m', '15m15s', '15m30s', '16m']);
    const failedAt = [...output.matchAll(/alertname: SteadfastXidFatal, time: (\S+),/g)].map((match) => match[1]);
    expect(failedAt).toEqual([]);
  });

  // KNOWN BUG, reported: a restart within minutes of a fatal Xid resolves SteadfastXidFatal while
  // the series is stale and fires it again afterwards, a new alert for the same fault (the
  // controller joins it to its decision). `keep_firing_for: 2m` on the alert would bridge the gap
  // (checked with promtool 2.42) but changes every resolution boundary the rule tests pin. This
  // test pins today's behaviour; once fixed, expect SUCCESS here instead.
  it('KNOWN BUG: drops the alert for a recent fatal Xid while a restarting agent misses scrapes', async () => {
    const series = `steadfast_xid_errors_total{${agent}, pci_bus_id="0000:3a:00", xid="79", severity="fatal"}`;
    const labels = `{alertname: SteadfastXidFatal, domain: gpu, instance: "10.0.0.3:9401", job: steadfast-agent, node: node-3, pci_bus_id: "0000:3a:00", severity: critical, xid: "79", xid_severity: fatal}`;
    const annotations = [
      '              description: GPU 0000:3a:00 on node node-3 logged fatal Xid 79 (1 new in the last 5 minutes). steadfast drains the node.',
      '              runbook_url: https://github.com/steadfast-dev/steadfast/blob/main/docs/runbooks/steadfast-xid-fatal.md',
      '              summary: A GPU reported a fatal Xid error.',
    ].join('\n');
    const firing = (time: string): string =>
      `      - eval_time: ${time}\n        alertname: SteadfastXidFatal\n        exp_alerts:\n          - exp_labels: ${labels}\n            exp_annotations:\n${annotations}`;
    // The Xid appears at 1 min; the agent restarts at 3.5 min (two missed scrapes). Expected: firing throughout.
    const output = await promtool('xid.yml', series, '_x4 1x10 stale stale 1x40', ['3m', '4m', '5m'].map(firing).join('\n'));
    const failedAt = [...output.matchAll(/alertname: SteadfastXidFatal, time: (\S+),/g)].map((match) => match[1]);
    expect(failedAt).toEqual(['4m']);
  });
});
