import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ScaleCluster, type InjectionResult } from '../../tryit/scale-cluster.js';

/**
 * 256 simulated nodes scraped every second by the real Prometheus with the shipped rules, half
 * of them running a job the controller's online analyzers watch (fail-slow, multi-signal
 * detection every 5 s). A few fatal Xids on the other half, through the fast path and through
 * Prometheus alone, must each be drained once, promptly, while Prometheus and the controller
 * keep up. bench/scale.ts runs the same with more injections and an 8-node baseline.
 */

const NODES = 256;

describe(`a ${NODES}-node simulated cluster on the real parts`, () => {
  let cluster: ScaleCluster;
  const results: InjectionResult[] = [];

  beforeAll(async () => {
    cluster = await ScaleCluster.start({ nodes: NODES, jobNodes: NODES / 2 });
  }, 60_000);
  afterAll(async () => {
    await cluster?.stop();
  });

  it('has Prometheus scrape every node within the interval and evaluate every rule group within it', async () => {
    expect(await cluster.targetHealth()).toEqual({ up: NODES, down: 0 });
    // Every node's exposition arrives in one scrape round.
    const perRound = await cluster.query('sum(scrape_samples_scraped{job="steadfast-agent"})');
    expect(perRound[0]).toBeGreaterThan(NODES * 60);
    for (const seconds of await cluster.ruleGroupSeconds()) expect(seconds).toBeLessThan(1);
  });

  it('drains each injected fault once, by the fast path sooner than by Prometheus alone', async () => {
    const victims = cluster.names.slice(0, 6);
    for (const [index, node] of victims.entries()) {
      const path = index % 2 === 0 ? 'fast' : 'prometheus';
      const injectedAt = Date.now();
      results.push(await cluster.inject(node, 0, path));
      expect(await cluster.recycle(node, 0, injectedAt), `Prometheus alert for ${node}`).toBe(true);
      await sleep(200 + Math.random() * 500);
    }
    const latency = (path: string): number[] => results.filter((result) => result.path === path).map((result) => result.latencyMs ?? Number.POSITIVE_INFINITY);
    const median = (values: number[]): number => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)] ?? Number.NaN;
    // Each drain was decided on the first report of its fault: the agent's own on the fast path,
    // which does not wait for a scrape, a rule and Alertmanager, and so drains sooner (the
    // figures themselves are bench/scale.ts's).
    for (const result of results)
      expect(result.firstReportFrom, `first report of the fault on ${result.node}`).toBe(result.path === 'fast' ? 'agent' : 'alertmanager');
    expect(median(latency('fast'))).toBeLessThan(median(latency('prometheus')));
    for (const ms of latency('prometheus')) expect(ms).toBeLessThan(30_000);
    const drains = cluster.plane.slurmDrainCounts();
    expect([...drains.keys()].sort()).toEqual(victims);
    for (const node of victims) expect(drains.get(node), `Slurm drains of ${node}`).toBe(1);
  }, 60_000);

  it('keeps the controller up with its queues and its online analyzers, with no false suspect on a healthy fleet', async () => {
    const metrics = await (await fetch(`${cluster.controllerMetricsUrl}/metrics`)).text();
    const oldest = Number(/^steadfast_queue_oldest_waiting_seconds\{queue="signals"\} (\S+)$/m.exec(metrics)?.[1] ?? Number.NaN);
    expect(oldest).toBeLessThan(2);
    const log = readFileSync(cluster.controller.logFile, 'utf8');
    expect(log).not.toMatch(/multi-signal detection failed|fail-slow check failed|recovery tick failed/);
    const audit = await cluster.audit.read({ limit: 10_000, type: 'signal' });
    expect(audit.filter((entry) => (entry.data.signal as { kind?: string } | undefined)?.kind === 'suspect_node')).toEqual([]);
    expect(await cluster.analysisLeader()).toBeTruthy();
  });
});
