import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { ProgressWatch } from '../../controller/progress.js';
import type { Controller } from '../../controller/service.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

/** A Prometheus stand-in answering instant queries with the iteration the test sets. */
async function fakePrometheus(iteration: { value: number | null }): Promise<{ url: string; server: Server; queries: string[] }> {
  const queries: string[] = [];
  const server = createServer((request, response) => {
    const query = new URL(request.url ?? '/', 'http://x').searchParams.get('query') ?? '';
    queries.push(query);
    const result = iteration.value === null ? [] : [{ metric: {}, value: [Date.now() / 1000, String(iteration.value)] }];
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

  it('asks Prometheus for the job\'s newest iteration and decides on growth or timeout', async () => {
    const store = testRedis();
    const iteration = { value: 100 as number | null };
    const prometheus = await fakePrometheus(iteration);
    servers.push(prometheus.server);
    try {
      const watch = new ProgressWatch(store.redis, store.keys, prometheus.url, 60_000);
      await watch.watch('llama', 't-1:2', 1_000);
      expect(prometheus.queries[0]).toBe('max(steadfast_training_iteration{training_job="llama"})');
      expect(await watch.check('llama', 2_000)).toBeUndefined();
      iteration.value = 101;
      expect(await watch.check('llama', 3_000)).toEqual({ job: 'llama', event: { type: 'restart_succeeded', time: 3_000 }, eventId: 't-1:2:progress' });
      expect(await watch.check('llama', 4_000)).toBeUndefined();
      await watch.watch('llama', 't-2:2', 10_000);
      expect(await watch.check('llama', 70_001)).toEqual({
        job: 'llama',
        event: { type: 'restart_failed', time: 70_001, detail: 'no new iteration within 60 s of the restart' },
        eventId: 't-2:2:no-progress',
      });
    } finally {
      await store.cleanup();
    }
  });

  it('keeps a restarted job recovering until its iteration grows, then marks it running', async () => {
    const store = testRedis();
    const iteration = { value: 500 as number | null };
    const prometheus = await fakePrometheus(iteration);
    servers.push(prometheus.server);
    try {
      const started = await startController(testConfig(store.url, store.prefix, { progress: { prometheusUrl: prometheus.url } }));
      controller = started.controller;
      await post(`${started.url}/api/v1/jobs`, { name: 'llama', nodes: ['n0', 'n1'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'accept', codeVersion: 'v1' });
      await started.controller.backend.holdStandby('spare');
      await post(`${started.url}/api/v1/signals`, { kind: 'gpu_lost', node: 'n1', gpu: '0000:18:00', message: 'gone', time: new Date().toISOString() });
      await until('restart launched', () => started.controller.jobs.get('llama'), (record) => record.spec.nodes.includes('spare'));
      // Launched, but no new iteration yet: still recovering after a tick.
      await new Promise((resolve) => setTimeout(resolve, 6_000));
      expect((await started.controller.jobs.get('llama')).state).toBe('recovering');
      iteration.value = 520;
      await until('running again', () => started.controller.jobs.get('llama'), (record) => record.state === 'running', 15_000);
    } finally {
      await controller?.close();
      controller = undefined;
      await store.cleanup();
    }
  }, 40_000);
});
