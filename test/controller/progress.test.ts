import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { TrainingProgressEvent } from '../../core/fast-path-event.js';
import { ProgressWatch, TrainingProgressReports } from '../../controller/progress.js';
import type { Controller } from '../../controller/service.js';
import { agentToken, post, startController, TEST_TOKEN, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/** A Prometheus stand-in answering instant queries with the iteration per node the test sets. */
async function fakePrometheus(iterations: Record<string, number>): Promise<{ url: string; server: Server; queries: string[] }> {
  const queries: string[] = [];
  const server = createServer((request, response) => {
    const query = new URL(request.url ?? '/', 'http://x').searchParams.get('query') ?? '';
    queries.push(query);
    const result = Object.entries(iterations).map(([node, value]) => ({ metric: { node }, value: [Date.now() / 1000, String(value)] }));
    response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ status: 'success', data: { resultType: 'vector', result } }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server, queries };
}

describe('restarts judged by training progress', () => {
  const servers: Server[] = [];
  let controller: Controller | undefined;
  afterEach(async () => {
    await controller?.close();
    controller = undefined;
    servers.splice(0).forEach((server) => server.close());
  });

  it("asks Prometheus for the newest iteration on the job's own nodes and decides on growth or timeout", async () => {
    const store = testRedis();
    const iterations: Record<string, number> = { n0: 100 };
    const prometheus = await fakePrometheus(iterations);
    servers.push(prometheus.server);
    try {
      const watch = new ProgressWatch(store.redis, store.keys, {
        prometheusUrl: prometheus.url,
        timeoutMs: 60_000,
        nodeLabel: 'node',
        nodesOf: () => Promise.resolve(['n0']),
      });
      await watch.watch('llama', 't-1:2', 1_000);
      expect(prometheus.queries[0]).toBe('max by (node) (steadfast_training_iteration{training_job="llama"})');
      expect(await watch.check('llama', ['n0'], 2_000)).toBeUndefined();
      // A node outside the job shows the job's name with a higher iteration: not the job's progress.
      iterations.stranger = 500;
      expect(await watch.check('llama', ['n0'], 2_500)).toBeUndefined();
      iterations.n0 = 101;
      expect(await watch.check('llama', ['n0'], 3_000)).toMatchObject({
        job: 'llama',
        event: { type: 'restart_succeeded', time: 3_000 },
        eventId: 't-1:2:progress',
        seen: expect.stringMatching(/Prometheus: the newest iteration is 101, up from 100/),
      });
      expect(await watch.check('llama', ['n0'], 4_000)).toBeUndefined();
      await watch.watch('llama', 't-2:2', 10_000);
      expect(await watch.check('llama', ['n0'], 70_001)).toMatchObject({
        job: 'llama',
        event: {
          type: 'restart_failed',
          time: 70_001,
          detail: expect.stringMatching(/^no new iteration within 60 s of the restart \(no agent of n0 reported one, nor Prometheus\)/),
        },
        eventId: 't-2:2:no-progress',
      });
    } finally {
      await store.cleanup();
    }
  });

  it("counts an agent's progress report from a node of the job made after the relaunch, and no other", async () => {
    const store = testRedis();
    const prometheus = await fakePrometheus({ n0: 500, n1: 500 });
    servers.push(prometheus.server);
    const report = (node: string, job: string, time: number, at = 21): TrainingProgressEvent => ({
      kind: 'training_progress',
      node,
      job,
      rank: 0,
      iteration: at,
      message: '',
      time: new Date(time).toISOString(),
    });
    try {
      const reports = new TrainingProgressReports(store.redis, store.keys);
      // Nobody registered "ghost": its reports are dropped, and make no key.
      expect(await reports.record([report('n0', 'ghost', 5_000)], 5_000)).toBe(0);
      expect(await store.redis.exists(store.keys.jobProgressReports('ghost'))).toBe(0);
      await store.redis.hset(store.keys.job('llama'), 'spec', '{}');
      const watch = new ProgressWatch(store.redis, store.keys, {
        prometheusUrl: prometheus.url,
        timeoutMs: 60_000,
        nodeLabel: 'node',
        nodesOf: () => Promise.resolve(['n0', 'n1']),
      });
      await watch.watch('llama', 't-1:2', 10_000);
      // The old run's last step, delivered late; a node that is not the job's; an agent clock ahead of the controller's.
      expect(await reports.record([report('n0', 'llama', 9_000)], 11_000)).toBe(1);
      expect(await reports.record([report('intruder', 'llama', 12_000)], 12_000)).toBe(1);
      expect(await watch.check('llama', ['n0', 'n1'], 12_500)).toBeUndefined();
      expect(await reports.record([report('n1', 'llama', 40_000)], 9_500)).toBe(1);
      expect(await watch.check('llama', ['n0', 'n1'], 12_600)).toBeUndefined();
      // A rank on n1 records an iteration after the relaunch; Prometheus still shows nothing new.
      expect(await reports.record([report('n1', 'llama', 13_000, 21), report('n1', 'llama', 13_400, 22)], 13_500)).toBe(1);
      const queries = prometheus.queries.length;
      expect(await watch.check('llama', ['n0', 'n1'], 14_000)).toMatchObject({
        event: { type: 'restart_succeeded', time: 14_000 },
        eventId: 't-1:2:progress',
        seen: "n1's agent reported iteration 22 of rank 0 3.4 s after the relaunch",
      });
      // Decided by the report alone: Prometheus was not asked.
      expect(prometheus.queries).toHaveLength(queries);
    } finally {
      await store.cleanup();
    }
  });

  it('keeps a restarted job recovering until its iteration grows, then marks it running', async () => {
    const store = testRedis();
    const iterations: Record<string, number> = { n0: 500, n1: 500 };
    const prometheus = await fakePrometheus(iterations);
    servers.push(prometheus.server);
    try {
      const started = await startController(testConfig(store.url, store.prefix, { progress: { prometheusUrl: prometheus.url } }));
      controller = started.controller;
      await post(`${started.url}/api/v1/jobs`, {
        name: 'llama',
        nodes: ['n0', 'n1'],
        ranksPerNode: 1,
        topology: { dp: 2 },
        launcher: 'accept',
        codeVersion: 'v1',
      });
      await started.controller.backend.holdStandby('spare');
      await post(`${started.url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n1', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      await until(
        'restart launched',
        () => started.controller.jobs.get('llama'),
        (record) => record.spec.nodes.includes('spare'),
      );
      // Launched, but no new iteration yet: still recovering after a progress check (the launch's baseline query, then a tick's).
      await until(
        'a progress check after the launch',
        () => Promise.resolve(prometheus.queries.length),
        (count) => count >= 2,
      );
      expect((await started.controller.jobs.get('llama')).state).toBe('recovering');
      // The relaunched job runs on n0 and the standby.
      iterations.n0 = 520;
      await until(
        'running again',
        () => started.controller.jobs.get('llama'),
        (record) => record.state === 'running',
        15_000,
      );
    } finally {
      await controller?.close();
      controller = undefined;
      await store.cleanup();
    }
  }, 40_000);

  it("marks a relaunched job running on its agents' fast-path reports while Prometheus sees nothing, and not on a report from a node outside the job", async () => {
    const store = testRedis();
    const iterations: Record<string, number> = {};
    const prometheus = await fakePrometheus(iterations);
    servers.push(prometheus.server);
    const progress = (node: string, at: number): Record<string, unknown> => ({
      kind: 'training_progress',
      node,
      job: 'llama',
      rank: 1,
      iteration: at,
      message: 'rank 1 resumed',
      time: new Date().toISOString(),
    });
    try {
      const started = await startController(testConfig(store.url, store.prefix, { progress: { prometheusUrl: prometheus.url } }));
      controller = started.controller;
      await post(`${started.url}/api/v1/jobs`, {
        name: 'llama',
        nodes: ['n0', 'n1'],
        ranksPerNode: 1,
        topology: { dp: 2 },
        launcher: 'accept',
        codeVersion: 'v1',
      });
      await started.controller.backend.holdStandby('spare');
      await post(
        `${started.url}/api/v1/signals`,
        { kind: 'gpu_lost', node: 'n1', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() },
        agentToken('n1'),
      );
      await until(
        'restart launched',
        () => started.controller.jobs.get('llama'),
        (record) => record.spec.nodes.includes('spare'),
      );
      // n1 was evicted: its agent's report no longer speaks for the job. A stranger's does not either.
      for (const node of ['n1', 'stranger']) {
        const answer = await post(`${started.url}/api/v1/signals`, progress(node, 21), agentToken(node));
        expect(answer.status).toBe(202);
      }
      // An agent speaks for its own node only.
      expect((await post(`${started.url}/api/v1/signals`, progress('spare', 21), agentToken('n0'))).status).toBe(403);
      const checks = prometheus.queries.length;
      await until(
        'a progress check after those reports',
        () => Promise.resolve(prometheus.queries.length),
        (count) => count > checks,
      );
      expect((await started.controller.jobs.get('llama')).state).toBe('recovering');
      // The standby's agent sees the relaunched rank train: the job runs again, no scrape needed.
      const answer = await post(`${started.url}/api/v1/signals`, [progress('spare', 21)], agentToken('spare'));
      expect(answer).toMatchObject({ status: 202, body: { accepted: 1, ids: [] } });
      await until(
        'running again',
        () => started.controller.jobs.get('llama'),
        (record) => record.state === 'running',
        15_000,
      );
      expect(iterations).toEqual({});
      // A progress report is no fault: nothing of it reaches the audit trail or the signal queue.
      const audit = await fetch(`${started.url}/api/v1/audit?limit=200`, { headers: { authorization: `Bearer ${TEST_TOKEN}` } }).then(
        (response) => response.json() as Promise<{ entries: { summary: string }[] }>,
      );
      expect(audit.entries.filter((entry) => /training_progress|resumed/.test(entry.summary))).toEqual([]);
    } finally {
      await controller?.close();
      controller = undefined;
      await store.cleanup();
    }
  }, 40_000);
});
