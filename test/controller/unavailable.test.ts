import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { startRedis } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { TEST_TOKEN, post, startController, testConfig } from '../support/controller.js';
import { controllerExit } from '../support/controller-exit.js';
import { testRedis } from '../support/redis.js';

/** A controller that cannot do its job says so: it exits when it cannot listen, and answers 503 while Redis is down. */
describe('a controller that cannot serve', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-unavailable-'));
  const processes = new ProcessGroup();
  afterAll(async () => {
    await processes.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('exits non-zero, naming the address, when its port is taken, instead of running its workers unseen', async () => {
    const squatter: Server = createServer();
    await new Promise<void>((done) => squatter.listen(0, '127.0.0.1', done));
    const port = (squatter.address() as { port: number }).port;
    const store = testRedis();
    try {
      const config = join(root, 'taken.yaml');
      writeFileSync(
        config,
        `redis:\n  url: ${store.url}\n  prefix: ${store.prefix}\ncontroller:\n  host: 127.0.0.1\n  port: ${port}\n  auth:\n    operatorToken: ${TEST_TOKEN}\n`,
      );
      const { code, stderr } = await controllerExit(config);
      expect(code).toBe(1);
      expect(stderr).toContain(`steadfast: cannot listen on 127.0.0.1:${port}: listen EADDRINUSE`);
    } finally {
      squatter.close();
      await store.cleanup();
    }
  }, 40_000);

  it('answers 503 with Retry-After, not 500, on the job APIs while Redis is down, and still shuts down', async () => {
    const redis = await startRedis(processes, root, 'redis-down');
    const { controller, url } = await startController(testConfig(redis.url, 'down'));
    try {
      const job = { name: 'llama', nodes: ['n00', 'n01'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'accept', codeVersion: 'v1' };
      expect((await post(`${url}/api/v1/jobs`, job)).status).toBe(201);
      await processes.stop('redis-down');
      const auth = { authorization: `Bearer ${TEST_TOKEN}` };
      for (const path of ['/api/v1/jobs', '/api/v1/jobs/llama', '/api/v1/jobs/llama/microbatches', '/api/v1/standby/n00', '/api/v1/queues']) {
        const response = await fetch(`${url}${path}`, { headers: auth, signal: AbortSignal.timeout(5000) });
        expect(response.status, path).toBe(503);
        expect(response.headers.get('retry-after'), path).toBe('5');
      }
      expect((await post(`${url}/api/v1/jobs/llama/checkpoints`, [{ step: 1, rank: 0, tier: 'remote' }])).status).toBe(503);
    } finally {
      // Shutting down with Redis gone ends too (this test's timeout would catch a hang): the
      // workers get a grace period, then their connections are cut.
      await controller.close();
    }
  }, 40_000);
});
