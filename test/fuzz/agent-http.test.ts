import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../agent/collectors/diagnose.js';
import { PY_SPY_FLAG, processCollectorFactory } from '../../agent/collectors/process.js';
import { trainingCollectorFactory } from '../../agent/collectors/training/collector.js';
import { RANK_PIDS, writeTorchrunProcfs } from '../agent/fake-procfs.js';
import { FIXTURES } from '../agent/helpers.js';
import { FuzzReport, budget, fuzz, watchProcess } from './harness.js';
import { expectNoPrototypePollution, expectWellFormed, requestBodies, type RequestBody } from './inputs.js';

/**
 * Fuzzes the node agent's POST endpoints (training push, stack trace, stop-time diagnostics)
 * and its request line, over real HTTP: every answer on an API route is JSON, a bad request
 * is a 4xx naming the problem, nothing crashes the agent, and a series pushed before the
 * fuzzing still reads the same afterwards.
 */

const REPORT = new FuzzReport('agent HTTP');
const TOKEN = 'agent-fuzz-token-0123456789';
const FAKE_PY_SPY = join(FIXTURES, 'exporters', 'fake-py-spy.sh');

const STEP = {
  job: 'fuzz',
  rank: 0,
  iteration: 1200,
  iteration_seconds: 4.2,
  loss: { 'lm loss': 2.31 },
  grad_norm: 0.8,
  learning_rate: 0.0003,
  tflops_per_gpu: 410,
};
const KEPT_STEP = { job: 'keep-job', rank: 5, iteration: 1234, loss: 1.5 };

async function send(base: string, path: string, request: RequestBody): Promise<{ status: number; contentType: string; text: string }> {
  const headers: Record<string, string> = { authorization: `Bearer ${TOKEN}` };
  if (request.contentType !== undefined) headers['content-type'] = request.contentType;
  const response = await fetch(`${base}${path}`, { method: 'POST', headers, body: request.body });
  return { status: response.status, contentType: response.headers.get('content-type') ?? '', text: await response.text() };
}

/** One raw request line; resolves with the status answered, rejects if none comes within 5 s. */
function rawRequestStatus(port: number, method: string, target: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let received = '';
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(`${method} ${target} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer ${TOKEN}\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`);
    });
    socket.setEncoding('latin1');
    socket.setTimeout(5000, () => socket.destroy(new Error(`no answer within 5 s to ${method} ${JSON.stringify(target)}`)));
    socket.on('data', (chunk: string) => {
      received += chunk;
    });
    socket.on('error', reject);
    socket.on('close', () => {
      const status = /^HTTP\/1\.1 (\d{3})/.exec(received)?.[1];
      if (status === undefined) reject(new Error(`no status line answered to ${method} ${JSON.stringify(target)}`));
      else resolve(Number(status));
    });
  });
}

describe('agent POST endpoints under fuzzing', () => {
  const watch = watchProcess();
  let dir: string;
  let agent: Agent;
  let base: string;
  let port: number;

  async function keptSeries(): Promise<string[]> {
    const text = await (await fetch(`${base}/metrics`)).text();
    return text.split('\n').filter((line) => line.includes('job="keep-job"') && !line.startsWith('#'));
  }
  let keptBefore: string[];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'steadfast-fuzz-agent-'));
    writeTorchrunProcfs(join(dir, 'proc'));
    const diagnostics = join(dir, 'diagnostics.json');
    writeFileSync(
      diagnostics,
      JSON.stringify({
        checks: [
          { name: 'quick', command: ['true'], timeoutSeconds: 5 },
          { name: 'also-quick', command: ['true'], timeoutSeconds: 5, standby: false },
        ],
      }),
    );
    agent = createAgent({
      node: 'fuzz-node',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: join(dir, 'sys'), procfs: join(dir, 'proc'), kmsg: join(dir, 'kmsg'), nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: [trainingCollectorFactory, processCollectorFactory, diagnoseCollectorFactory],
      settings: { [PY_SPY_FLAG]: FAKE_PY_SPY, [DIAGNOSE_CONFIG_FLAG]: diagnostics },
      apiToken: TOKEN,
      rateLimit: { requestsPerSecond: 0, burst: 1 },
      logger: silentLogger(),
    });
    ({ port } = await agent.start());
    base = `http://127.0.0.1:${port}`;
    const pushed = await send(base, '/api/v1/training', { body: JSON.stringify(KEPT_STEP), shape: 'json' });
    expect(pushed.status).toBe(202);
    keptBefore = await keptSeries();
    expect(keptBefore.length).toBeGreaterThan(0);
  });

  afterAll(async () => {
    REPORT.print();
    watch.stop();
    await agent.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('answers every fuzzed POST /api/v1/training with JSON: 202 for valid steps, a 4xx naming the problem otherwise', async () => {
    await fuzz(
      REPORT,
      'POST /api/v1/training',
      requestBodies([STEP, [STEP, { ...STEP, rank: 1 }], { job: 'fuzz', rank: 2, iteration: 0, loss: 'nan' }]),
      async (request) => expectWellFormed(await send(base, '/api/v1/training', request), [202, 400, 413, 429], request),
      budget(300, 4),
    );
  });

  it('answers every fuzzed POST /api/v1/trace with JSON: 200 with the dumps when valid, a 4xx naming the problem otherwise', async () => {
    await fuzz(
      REPORT,
      'POST /api/v1/trace',
      requestBodies([{}, { timeoutSeconds: 5 }, { pids: [RANK_PIDS[0], RANK_PIDS[1]], timeoutSeconds: 5 }]),
      async (request) => expectWellFormed(await send(base, '/api/v1/trace', request), [200, 400, 409, 413], request),
      budget(150, 5),
    );
  });

  it('answers every fuzzed POST /api/v1/diagnose with JSON: 200 with the checks when valid, a 4xx naming the problem otherwise', async () => {
    await fuzz(
      REPORT,
      'POST /api/v1/diagnose',
      requestBodies([{}, { checks: ['quick'], timeoutSeconds: 10, peers: ['n01', 'n02'] }, { standby: true }]),
      async (request) => expectWellFormed(await send(base, '/api/v1/diagnose', request), [200, 400, 409, 413], request),
      budget(250, 4),
    );
  });

  it('answers every fuzzed request line without a 5xx and without failing to answer', async () => {
    const printable = fc.string({ unit: fc.integer({ min: 0x21, max: 0x7e }).map((code) => String.fromCharCode(code)), maxLength: 60 });
    const target = fc
      .tuple(fc.constantFrom('', '/', '/api/v1/', '/api/v1/trace', 'http://', 'http://a:', '//', 'http://[', '*', '/metrics'), printable)
      .map(([prefix, rest]) => `${prefix}${rest}`);
    await fuzz(
      REPORT,
      'raw request targets',
      fc.tuple(fc.constantFrom('GET', 'POST', 'PUT', 'HEAD', 'OPTIONS'), target),
      async ([method, path]) => {
        const status = await rawRequestStatus(port, method, path);
        expect(status, `${method} ${path}`).toBeLessThan(500);
        return String(status);
      },
      budget(200, 2),
    );
  });

  it('still serves, and still holds the series pushed before the fuzzing, unchanged', async () => {
    expect(await keptSeries()).toEqual(keptBefore);
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expectNoPrototypePollution();
    expect(watch.problems).toEqual([]);
  });
});
