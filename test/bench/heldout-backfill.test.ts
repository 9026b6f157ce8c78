import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backfillFleet, startPrometheusOn } from '../../bench/heldout/backfill.js';
import { DAY, HOUR, MINUTE, planFleet, type FleetPlan } from '../../bench/heldout/fleet.js';
import { instantQuery } from '../../core/prometheus.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { agentMetricNames } from '../support/promql.js';

/**
 * The held-out fleet survives the trip into the real Prometheus: promtool backfills every sample,
 * the labelled faults show at their labelled times under the agent's own metric names, and the
 * silent node is silent. (The detector's score is a bench figure, not asserted here.)
 */

const group = new ProcessGroup();
let root: string;
let url: string;
let plan: FleetPlan;
let samples: number;

const query = async (expr: string, time: number) => instantQuery(url, expr, { time });
const value = async (expr: string, time: number) => (await query(expr, time))[0]?.value;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'steadfast-heldout-test-'));
  const start = Math.floor(Date.now() / DAY) * DAY - 2 * DAY;
  plan = planFleet({ seed: 7, start, days: 0.25, stepSeconds: 30, nodes: 8, gpusPerNode: 8, faultKinds: ['silent', 'ib_link', 'hbm_ecc'] });
  ({ samples } = await backfillFleet(plan, root, join(root, 'data'), 4));
  ({ url } = await startPrometheusOn(group, root, join(root, 'data')));
}, 180_000);

afterAll(async () => {
  await group.stopAll();
  rmSync(root, { recursive: true, force: true });
});

describe('the held-out fleet in the real Prometheus', () => {
  it('holds every sample that was written, and a node that never went down has one every 30 s', async () => {
    // Range functions drop the metric name, so count family by family.
    const names = (await query('count by (__name__) (last_over_time({job="steadfast-agent"}[7h]))', plan.end)).map((sample) => sample.labels.__name__);
    let stored = 0;
    let series = 0;
    for (const name of names) {
      stored += (await value(`sum(count_over_time(${name}{job="steadfast-agent"}[7h]))`, plan.end)) ?? 0;
      series += (await value(`count(count_over_time(${name}{job="steadfast-agent"}[7h]))`, plan.end)) ?? 0;
    }
    expect(series).toBeGreaterThan(8 * 100);
    expect(stored).toBe(samples);
    const steady = plan.nodes.find(
      (node) => !plan.faults.some((fault) => fault.node === node) && !plan.confusers.some((event) => event.kind === 'reboot' && event.node === node),
    );
    expect(steady).toBeDefined();
    const steps = (plan.end - plan.start) / plan.stepMs;
    expect(await value(`count_over_time(steadfast_collector_success{node="${steady}",collector="xid"}[7h])`, plan.end)).toBe(steps);
  });

  it('names its series only with metric names the steadfast agent exports', async () => {
    const names = (await query('count by (__name__) ({job="steadfast-agent"})', plan.end - MINUTE)).map((sample) => sample.labels.__name__);
    const agent = new Set(await agentMetricNames());
    expect(names.length).toBeGreaterThan(10);
    expect(names.filter((name) => !agent.has(name ?? ''))).toEqual([]);
  });

  it('shows the memory fault as rising correctable ECC errors on its GPU, then its Xid at the labelled failure time', async () => {
    const fault = plan.faults.find((candidate) => candidate.kind === 'hbm_ecc');
    if (!fault) throw new Error('the plan has no memory fault');
    const span = `${Math.round((fault.failure - fault.precursorStart) / 1000)}s`;
    const eccOf = (gpu: string) => `sum(increase(steadfast_gpu_ecc_errors_total{node="${fault.node}",gpu="${gpu}",type="correctable"}[${span}]))`;
    const faulty = await value(eccOf(String(fault.gpu)), fault.failure - plan.stepMs);
    const healthy = await value(
      `max(increase(steadfast_gpu_ecc_errors_total{node!="${fault.node}",type="correctable"}[${span}]))`,
      fault.failure - plan.stepMs,
    );
    expect(faulty).toBeGreaterThan(20);
    expect(faulty).toBeGreaterThan(10 * Math.max(1, healthy ?? 0));
    const xid = `steadfast_xid_errors_total{node="${fault.node}",xid="${fault.xid}"}`;
    expect(await query(xid, fault.failure - plan.stepMs)).toEqual([]);
    expect(await value(xid, fault.failure + plan.stepMs)).toBe(1);
  });

  it('shows the link fault as symbol errors on one port before the link goes down at the failure time', async () => {
    const fault = plan.faults.find((candidate) => candidate.kind === 'ib_link');
    if (!fault) throw new Error('the plan has no link fault');
    const port = `mlx5_${fault.gpu % 4}`;
    const span = `${Math.round((fault.failure - fault.precursorStart) / 1000)}s`;
    expect(
      await value(`increase(steadfast_rdma_port_symbol_errors_total{node="${fault.node}",device="${port}"}[${span}])`, fault.failure - plan.stepMs),
    ).toBeGreaterThan(50);
    const downed = `steadfast_rdma_port_link_downed_total{node="${fault.node}",device="${port}"}`;
    expect(await value(downed, fault.failure - plan.stepMs)).toBe(0);
    expect(await value(downed, fault.failure + plan.stepMs)).toBe(1);
  });

  it('has no series from the silent node after its failure, and all of them before', async () => {
    const fault = plan.faults.find((candidate) => candidate.kind === 'silent');
    if (!fault) throw new Error('the plan has no silent node');
    const present = `count(steadfast_gpu_present{node="${fault.node}"})`;
    expect(await value(present, fault.failure - plan.stepMs)).toBe(8);
    // Prometheus looks back 5 minutes for an instant value: after that the node is gone.
    expect(await query(present, fault.failure + 6 * MINUTE)).toEqual([]);
    expect(fault.repairedAt - fault.failure).toBeGreaterThan(HOUR);
  });
});
