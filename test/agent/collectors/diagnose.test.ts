import { createHash } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { DIAGNOSE_PATH, diagnoseReportSchema, type CheckReport, type DiagnoseReport } from '../../../core/diagnostics.js';
import { CollectorSet, type AgentResponse, type Collector } from '../../../agent/collector.js';
import { DIAGNOSE_CONFIG_FLAG, createDiagnoseCollector, diagnoseCollectorFactory } from '../../../agent/collectors/diagnose.js';
import { promtoolCheckMetrics, seriesValue, testContext, waitFor } from '../helpers.js';

const SAMPLE_CONFIG = resolve(import.meta.dirname, '../../../docs/diagnostics.yaml');

let dir: string;
const open: Collector[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-diagnose-'));
});

afterEach(async () => {
  await Promise.all(open.splice(0).map((collector) => collector.close()));
  rmSync(dir, { recursive: true, force: true });
});

function configFile(config: unknown, name = 'diagnostics.json'): string {
  const file = join(dir, name);
  writeFileSync(file, typeof config === 'string' ? config : JSON.stringify(config));
  return file;
}

function collectorFor(file: string | undefined): { collector: Collector; context: ReturnType<typeof testContext> } {
  const context = testContext({}, 5, file === undefined ? {} : { [DIAGNOSE_CONFIG_FLAG]: file });
  const collector = createDiagnoseCollector(context, { killGraceMs: 500 });
  open.push(collector);
  return { collector, context };
}

function diagnose(collector: Collector, body?: unknown): Promise<AgentResponse> {
  const route = collector.routes?.find((candidate) => candidate.path === DIAGNOSE_PATH && candidate.method === 'POST');
  if (!route) throw new Error('the diagnose collector has no diagnose route');
  return route.handle({ method: 'POST', path: DIAGNOSE_PATH, query: new URLSearchParams(), body });
}

function report(response: AgentResponse): DiagnoseReport {
  expect(response.status).toBe(200);
  return diagnoseReportSchema.parse(response.body);
}

function check(answer: DiagnoseReport, name: string): CheckReport {
  const found = answer.checks.find((candidate) => candidate.name === name);
  if (!found) throw new Error(`no result for check ${name}`);
  return found;
}

const sh = (script: string): string[] => ['/bin/sh', '-c', script];

/** Whether a process exists and has not exited; a killed orphan may stay a zombie until init reaps it. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

describe('POST /api/v1/diagnose', () => {
  it('runs every configured check in order, then the reference, and reports each with its verdict', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'eud', command: ['true'], timeoutSeconds: 10 },
          { name: 'nccl-all-to-all', command: sh('echo "warming up"; echo "bus error on GPU 3" >&2; exit 3'), timeoutSeconds: 10 },
        ],
        reference: { command: ['echo', 'ref'], timeoutSeconds: 10 },
      }),
    );
    const answer = report(await diagnose(collector));
    expect(answer.node).toBe('node-1');
    expect(answer.checks.map(({ name, result, ok, exitCode, signal, timedOut }) => ({ name, result, ok, exitCode, signal, timedOut }))).toEqual([
      { name: 'eud', result: 'passed', ok: true, exitCode: 0, signal: null, timedOut: false },
      { name: 'nccl-all-to-all', result: 'failed', ok: false, exitCode: 3, signal: null, timedOut: false },
      { name: 'reference', result: 'passed', ok: true, exitCode: 0, signal: null, timedOut: false },
    ]);
    const failed = check(answer, 'nccl-all-to-all');
    expect(failed.reason).toBe('exited with status 3: bus error on GPU 3');
    expect(failed.outputTail).toContain('warming up');
    expect(check(answer, 'eud').reason).toBeUndefined();
    expect(answer.referenceHash).toBe(createHash('sha256').update('ref\n').digest('hex'));
  });

  it('runs only the checks the request names, and refuses unknown names with a 400 naming them', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'a', command: ['true'], timeoutSeconds: 5 },
          { name: 'b', command: ['true'], timeoutSeconds: 5 },
        ],
      }),
    );
    expect(report(await diagnose(collector, { checks: ['b'] })).checks.map((entry) => entry.name)).toEqual(['b']);
    const unknown = await diagnose(collector, { checks: ['a', 'eud', 'nccl'] });
    expect(unknown).toEqual({ status: 400, body: { error: 'unknown checks "eud", "nccl"; configured: a, b', field: 'checks' } });
  });

  it('answers 400 naming the field for a malformed request body', async () => {
    const { collector } = collectorFor(configFile({ checks: [{ name: 'a', command: ['true'], timeoutSeconds: 5 }] }));
    const bad = await diagnose(collector, { checks: [], timeoutSeconds: -1, extra: true });
    expect(bad.status).toBe(400);
    const error = (bad.body as { error: string }).error;
    expect(error).toContain('checks:');
    expect(error).toContain('timeoutSeconds:');
    expect(error).toMatch(/extra/);
    expect((await diagnose(collector, { peers: ['bad name'] })).status).toBe(400);
  });

  it('kills a check at its own time limit, with the processes it started, and counts it as timed out', async () => {
    const pidFile = join(dir, 'grandchild.pid');
    const { collector } = collectorFor(configFile({ checks: [{ name: 'hang', command: sh(`sleep 30 & echo $! > ${pidFile}; wait`), timeoutSeconds: 1 }] }));
    const started = Date.now();
    const hang = check(report(await diagnose(collector)), 'hang');
    expect(Date.now() - started).toBeLessThan(5000);
    expect(hang).toMatchObject({ result: 'timed_out', ok: false, timedOut: true, exitCode: null, signal: 'SIGTERM' });
    expect(hang.reason).toBe('did not finish within its time limit of 1 s and was killed');
    const grandchild = Number(readFileSync(pidFile, 'utf8'));
    await waitFor(() => !running(grandchild), 3000);
  });

  it('stops at the request time limit without blaming the node, and does not start what no longer fits', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'slow', command: ['sleep', '30'], timeoutSeconds: 60 },
          { name: 'next', command: ['true'], timeoutSeconds: 5 },
        ],
      }),
    );
    const answer = report(await diagnose(collector, { timeoutSeconds: 1 }));
    expect(check(answer, 'slow')).toMatchObject({
      result: 'incomplete',
      timedOut: true,
      reason: expect.stringContaining("when the request's time limit ran out (its own limit is 60 s)"),
    });
    expect(check(answer, 'next')).toMatchObject({
      result: 'incomplete',
      timedOut: false,
      seconds: 0,
      reason: "not started: the request's time limit of 1 s had run out",
    });
  });

  it('fails a check whose program is missing with a reason, and goes on with the next', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'eud', command: ['/nonexistent/dcgmi', 'diag', '-r', '2'], timeoutSeconds: 5 },
          { name: 'after', command: ['true'], timeoutSeconds: 5 },
        ],
      }),
    );
    const answer = report(await diagnose(collector));
    expect(check(answer, 'eud')).toMatchObject({
      result: 'failed',
      exitCode: null,
      reason: "/nonexistent/dcgmi not found (is it installed, and on the agent's PATH?)",
    });
    expect(check(answer, 'after').result).toBe('passed');
  });

  it('answers 409 to a second diagnosis while one runs, then serves again', async () => {
    const { collector } = collectorFor(configFile({ checks: [{ name: 'nap', command: ['sleep', '0.5'], timeoutSeconds: 5 }] }));
    const first = diagnose(collector);
    const second = await diagnose(collector);
    expect(second.status).toBe(409);
    expect((second.body as { error: string }).error).toContain('already running on node-1');
    expect((await first).status).toBe(200);
    expect((await diagnose(collector)).status).toBe(200);
  });

  it('judges nccl-tests bandwidth against the configured minimum', async () => {
    const line = 'echo "# Out of bounds values : 0 OK"; echo "# Avg bus bandwidth    : 42.5 "';
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'slow-link', command: sh(line), timeoutSeconds: 5, minAvgBusBandwidthGBps: 100 },
          { name: 'fast-enough', command: sh(line), timeoutSeconds: 5, minAvgBusBandwidthGBps: 40 },
          { name: 'silent', command: ['true'], timeoutSeconds: 5, minAvgBusBandwidthGBps: 40 },
        ],
      }),
    );
    const answer = report(await diagnose(collector));
    expect(check(answer, 'slow-link')).toMatchObject({
      result: 'failed',
      avgBusBandwidthGBps: 42.5,
      reason: 'average bus bandwidth 42.5 GB/s is below the expected 100 GB/s',
    });
    expect(check(answer, 'fast-enough')).toMatchObject({ result: 'passed', avgBusBandwidthGBps: 42.5 });
    expect(check(answer, 'silent').reason).toContain('no "# Avg bus bandwidth" line');
  });

  it('tells each check its node and peers, and keeps only the tail of long output', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'env', command: sh('echo "$STEADFAST_NODE|$STEADFAST_DIAGNOSE_PEERS|$STEADFAST_DIAGNOSE_CHECK"'), timeoutSeconds: 5 },
          { name: 'chatty', command: ['seq', '1', '5000'], timeoutSeconds: 5 },
        ],
      }),
    );
    const answer = report(await diagnose(collector, { peers: ['node-2', 'node-0'] }));
    expect(check(answer, 'env').outputTail).toBe('node-1|node-2,node-0|env\n');
    const tail = check(answer, 'chatty').outputTail;
    expect(tail.endsWith('4999\n5000\n')).toBe(true);
    expect(Buffer.byteLength(tail)).toBeLessThanOrEqual(4096);
  });

  it('gives no reference hash when the reference step fails', async () => {
    const { collector } = collectorFor(configFile({ reference: { name: 'ref', command: sh('echo partial; exit 1'), timeoutSeconds: 5 } }));
    const answer = report(await diagnose(collector));
    expect(check(answer, 'ref').result).toBe('failed');
    expect(answer.referenceHash).toBeUndefined();
  });

  it('reports a check cut short by the agent shutting down as incomplete', async () => {
    const { collector } = collectorFor(configFile({ checks: [{ name: 'long', command: ['sleep', '30'], timeoutSeconds: 60 }] }));
    const running = diagnose(collector);
    await new Promise((resolveSoon) => setTimeout(resolveSoon, 200));
    await collector.close();
    expect(check(report(await running), 'long')).toMatchObject({ result: 'incomplete', reason: 'stopped: the agent is shutting down' });
  });
});

describe('diagnose collector configuration', () => {
  it('answers 503 and fails the scrape when no config file is given, saying which flag to set', async () => {
    const { collector, context } = collectorFor(undefined);
    const answer = await diagnose(collector, {});
    expect(answer.status).toBe(503);
    expect((answer.body as { error: string }).error).toContain('--diagnose.config <file>');
    const text = await new CollectorSet([collector], context.registry, context.logger).scrape();
    expect(seriesValue(text, 'steadfast_collector_success{collector="diagnose"}')).toBe(0);
    expect(diagnoseCollectorFactory.defaultEnabled).toBe(false);
  });

  it('answers 503 naming the field of an invalid config', async () => {
    const { collector } = collectorFor(
      configFile({
        checks: [
          { name: 'a', command: [], timeoutSeconds: 5 },
          { name: 'a', command: ['true'], timeoutSeconds: 0 },
        ],
      }),
    );
    const answer = await diagnose(collector);
    expect(answer.status).toBe(503);
    const error = (answer.body as { error: string }).error;
    expect(error).toContain('checks.0.command: must name at least the program');
    expect(error).toContain('checks.1.timeoutSeconds');
    expect(error).toContain('check name "a" is used twice');
    await expect(collector.update()).rejects.toThrow(/invalid diagnostics config/);
  });

  it('reads YAML, and accepts the sample config shipped in docs/', async () => {
    expect(existsSync(SAMPLE_CONFIG)).toBe(true);
    const sample = collectorFor(SAMPLE_CONFIG).collector;
    await expect(sample.update()).resolves.toBeUndefined();
    const yaml = collectorFor(configFile('checks:\n  - name: ok\n    command: ["true"]\n    timeoutSeconds: 5\n', 'checks.yaml')).collector;
    expect(report(await diagnose(yaml)).checks[0]?.result).toBe('passed');
  });
});

describe('diagnose metrics', () => {
  it('counts runs by check and result and keeps the last duration, in an exposition promtool accepts', async () => {
    const { collector, context } = collectorFor(
      configFile({
        checks: [
          { name: 'good', command: ['true'], timeoutSeconds: 5 },
          { name: 'bad', command: ['false'], timeoutSeconds: 5 },
        ],
      }),
    );
    await diagnose(collector);
    await diagnose(collector, { checks: ['good'] });
    const text = await new CollectorSet([collector], context.registry, context.logger).scrape();
    expect(seriesValue(text, 'steadfast_diagnose_runs_total{check="good",result="passed"}')).toBe(2);
    expect(seriesValue(text, 'steadfast_diagnose_runs_total{check="bad",result="failed"}')).toBe(1);
    expect(seriesValue(text, 'steadfast_diagnose_runs_total{check="bad",result="passed"}')).toBeUndefined();
    expect(seriesValue(text, 'steadfast_diagnose_last_duration_seconds{check="bad"}')).toBeGreaterThan(0);
    expect(seriesValue(text, 'steadfast_diagnose_running')).toBe(0);
    expect(seriesValue(text, 'steadfast_collector_success{collector="diagnose"}')).toBe(1);
    const lint = await promtoolCheckMetrics(text);
    expect(lint.output).toBe('');
    expect(lint.code).toBe(0);
  });
});
