import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { instantQuery } from '../../core/prometheus.js';
import { silentLogger } from '../../core/log.js';
import type { Controller } from '../../controller/service.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { trainingCollectorFactory } from '../../agent/collectors/training/collector.js';
import { startPrometheus, type PrometheusPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { agentToken, post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/**
 * The progress watch's Prometheus road against a real Prometheus scraping real agents, each
 * target labelled with its node as the deploy configs label them. Node n0 is in no job; job jp
 * runs on n1 and n2, with a standby to take n2's place.
 */

const processes = new ProcessGroup();
const root = mkdtempSync(join(tmpdir(), 'steadfast-progress-prometheus-'));
const agents = new Map<string, { agent: Agent; url: string }>();
let prometheus: PrometheusPart;

beforeAll(async () => {
  for (const node of ['n0', 'n1']) {
    const agent = createAgent({
      node,
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent', procfs: '/nonexistent', kmsg: '/nonexistent', nvidiaSmi: '/nonexistent' },
      pollIntervalSeconds: 60,
      collectors: [trainingCollectorFactory],
      logger: silentLogger(),
    });
    const { port } = await agent.start();
    agents.set(node, { agent, url: `http://127.0.0.1:${port}` });
  }
  prometheus = await startPrometheus(processes, root, {
    targets: [...agents.entries()].map(([node, { url }]) => ({ address: url.replace('http://', ''), labels: { node } })),
    ruleFiles: [],
    alertmanagerAddress: '127.0.0.1:9',
    intervalSeconds: 1,
  });
}, 60_000);

afterAll(async () => {
  await Promise.all([...agents.values()].map(({ agent }) => agent.close()));
  await processes.stopAll();
  rmSync(root, { recursive: true, force: true });
});

/** A training loop on `node` pushes one step of jp to its own agent. */
async function push(node: string, iteration: number, extra: Record<string, unknown> = {}): Promise<number> {
  const response = await fetch(`${agents.get(node)?.url ?? ''}/api/v1/training`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ job: 'jp', rank: 0, iteration, ...extra }),
  });
  await response.body?.cancel();
  return response.status;
}

/** Waits until Prometheus holds `node`'s jp iteration at `iteration`. */
async function scraped(node: string, iteration: number): Promise<void> {
  await until(
    `Prometheus to hold ${node}'s iteration ${iteration}`,
    () => instantQuery(prometheus.url, `steadfast_training_iteration{training_job="jp",node="${node}"}`),
    (samples) => samples.some((sample) => sample.value === iteration),
  );
}

/** Instant queries Prometheus has answered so far (its own counter, which the test's reads of /metrics do not move). */
async function queriesAnswered(): Promise<number> {
  const text = await (await fetch(`${prometheus.url}/metrics`)).text();
  const line = text
    .split('\n')
    .find((row) => row.startsWith('prometheus_http_requests_total{') && row.includes('code="200"') && row.includes('handler="/api/v1/query"'));
  return line === undefined ? 0 : Number(line.split(' ').at(-1));
}

describe('a relaunch judged on Prometheus', () => {
  const store = testRedis();
  let controller: Controller | undefined;
  afterAll(async () => {
    await controller?.close();
    await store.cleanup();
  });

  it("counts the iterations of the job's own nodes only: a node outside the job pushing the job's name ends no recovery", async () => {
    // A push names the training job and rank, never the node: the node label is the scrape target's.
    expect(await push('n0', 1, { node: 'n1' })).toBe(400);
    expect(await push('n1', 100)).toBe(202);
    await scraped('n1', 100);

    const started = await startController(testConfig(store.url, store.prefix, { progress: { prometheusUrl: prometheus.url } }));
    controller = started.controller;
    const registered = await post(`${started.url}/api/v1/jobs`, {
      name: 'jp',
      nodes: ['n1', 'n2'],
      ranksPerNode: 1,
      topology: { dp: 2 },
      launcher: 'accept',
      codeVersion: 'v1',
    });
    expect(registered.status).toBe(201);
    await started.controller.backend.holdStandby('spare');
    expect(
      (
        await post(
          `${started.url}/api/v1/signals`,
          { kind: 'gpu_lost', node: 'n2', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() },
          agentToken('n2'),
        )
      ).status,
    ).toBe(202);
    await until(
      'the relaunch watched',
      () => store.redis.get(store.keys.jobAwaitingProgress('jp')),
      (raw) => raw !== null,
    );
    expect(JSON.parse((await store.redis.get(store.keys.jobAwaitingProgress('jp'))) ?? '{}')).toMatchObject({ baseline: 100 });

    // n0, in no job, pushes jp iterations past the baseline to its own agent.
    expect(await push('n0', 103)).toBe(202);
    await scraped('n0', 103);
    const before = await queriesAnswered();
    // Two of the controller's progress checks after Prometheus held n0's push (a check is one query).
    await until("two progress checks after the stranger's push", queriesAnswered, (count) => count >= before + 2, 20_000);
    expect((await started.controller.jobs.get('jp')).state).toBe('recovering');
    expect(await store.redis.get(store.keys.jobAwaitingProgress('jp'))).not.toBeNull();

    // A rank on n1, a node of the job, trains past the baseline: the relaunch worked.
    expect(await push('n1', 104)).toBe(202);
    await until(
      'jp running again',
      () => started.controller.jobs.get('jp'),
      (record) => record.state === 'running',
      20_000,
    );
  }, 90_000);
});
