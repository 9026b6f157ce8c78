import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { workerConnection } from '../../core/redis.js';
import type { Controller } from '../../controller/service.js';
import { startRedis } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { READ_ONLY_TOKEN, TEST_TOKEN, agentToken, post, startController, testConfig } from '../support/controller.js';
import { until } from '../support/until.js';

/**
 * A Redis that keeps its connections open but answers nothing (stopped with SIGSTOP: a wedged or
 * swapping server looks the same) must not hold the controller's answers: the health check, the
 * jobs, the queues, the audit, the queue board's data, a standby's poll, a registration and an agent's progress report each answer
 * 503 within seconds, and 200 again once Redis runs. Before, the health check's PING had no
 * deadline and the API's reads none either: they waited for as long as Redis was stopped.
 */

/** What a caller may wait for an answer while Redis does not answer: the API's deadlines are 2 s (health) and 5 s (a command), and a failed request's health check. */
const ANSWER_BOUND_MS = 15_000;

let registrations = 0;
const JOB = { name: 'hung', nodes: ['n00', 'n01'], ranksPerNode: 1, topology: { dp: 2 }, launcher: 'accept', codeVersion: 'v1' };

interface Probe {
  readonly what: string;
  readonly path: string;
  readonly token?: string;
  /** A POST's body, made anew for each call where a request may be taken once only. */
  readonly body?: unknown;
}

const PROBES: readonly Probe[] = [
  { what: 'the health check', path: '/healthz' },
  { what: 'the jobs', path: '/api/v1/jobs', token: READ_ONLY_TOKEN },
  { what: 'one job', path: '/api/v1/jobs/hung', token: READ_ONLY_TOKEN },
  { what: 'the queues', path: '/api/v1/queues', token: READ_ONLY_TOKEN },
  { what: 'the audit', path: '/api/v1/audit?limit=5', token: READ_ONLY_TOKEN },
  { what: "the queue board's data", path: '/queues/api/queues', token: READ_ONLY_TOKEN },
  { what: 'the pause gate', path: '/api/v1/pause', token: TEST_TOKEN },
  { what: "a standby's poll", path: '/api/v1/standby/n05', token: agentToken('n05') },
  {
    what: 'a registration',
    path: '/api/v1/jobs',
    token: TEST_TOKEN,
    body: () => ({ ...JOB, name: `hung-${(registrations += 1)}`, nodes: [`r${registrations}`], topology: { dp: 1 } }),
  },
  {
    what: "an agent's progress report",
    path: '/api/v1/signals',
    token: agentToken('n00'),
    body: { kind: 'training_progress', node: 'n00', job: 'hung', rank: 0, iteration: 7, message: '', time: new Date().toISOString() },
  },
];

/** The probe's status and how long it took; a probe still unanswered at twice the bound is cut and counted as status 0. */
async function ask(url: string, probe: Probe): Promise<{ status: number; ms: number; retryAfter: string | null }> {
  const started = Date.now();
  const body = typeof probe.body === 'function' ? (probe.body as () => unknown)() : probe.body;
  try {
    const response = await fetch(`${url}${probe.path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { ...(probe.token ? { authorization: `Bearer ${probe.token}` } : {}), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      signal: AbortSignal.timeout(2 * ANSWER_BOUND_MS),
    });
    await response.arrayBuffer();
    return { status: response.status, ms: Date.now() - started, retryAfter: response.headers.get('retry-after') };
  } catch {
    return { status: 0, ms: Date.now() - started, retryAfter: null };
  }
}

describe('a Redis that is connected but answers nothing', () => {
  const group = new ProcessGroup();
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-hung-redis-'));
  let controller: Controller;
  let url: string;
  let redisPid = 0;
  let stopped = false;

  beforeAll(async () => {
    const redis = await startRedis(group, dir);
    const probe = workerConnection(redis.url);
    const info = await probe.info('server');
    probe.disconnect();
    redisPid = Number(/process_id:(\d+)/.exec(info)?.[1]);
    expect(redisPid).toBeGreaterThan(0);
    ({ controller, url } = await startController(testConfig(redis.url, 'hung', { controller: { rateLimit: { requestsPerSecond: 0 } } }), { workers: false }));
    expect((await post(`${url}/api/v1/jobs`, JOB)).status).toBe(201);
  }, 60_000);

  afterAll(async () => {
    if (stopped) process.kill(redisPid, 'SIGCONT');
    await controller?.close();
    await group.stopAll();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers every read, a registration and an agent report, 503 with Retry-After within seconds while Redis is stopped, and 200 or 202 again once it runs', async () => {
    const ok = (status: number): boolean => status === 200 || status === 201 || status === 202;
    for (const probe of PROBES) expect(ok((await ask(url, probe)).status), probe.what).toBe(true);

    process.kill(redisPid, 'SIGSTOP');
    stopped = true;
    const answers = await Promise.all(PROBES.map((probe) => ask(url, probe)));
    for (const [index, answer] of answers.entries()) {
      const { what } = PROBES[index] as Probe;
      expect(answer.status, `${what}: answered ${answer.status} after ${answer.ms} ms`).toBe(503);
      expect(answer.ms, what).toBeLessThan(ANSWER_BOUND_MS);
      if (what !== 'the health check') expect(answer.retryAfter, what).not.toBeNull();
    }

    process.kill(redisPid, 'SIGCONT');
    stopped = false;
    for (const probe of PROBES)
      await until(
        `${probe.what} to answer again`,
        () => ask(url, probe),
        (answer) => ok(answer.status),
        ANSWER_BOUND_MS,
      );
  }, 90_000);
});
