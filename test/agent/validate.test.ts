import { execFile } from 'node:child_process';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { repoRoot } from '../../core/paths.js';
import { VALIDATE_PATH, validationReportSchema } from '../../core/validation.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { shippedBurnScript, validateCollectorFactory } from '../../agent/collectors/validate.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../agent/collectors/diagnose.js';
import { DIAGNOSE_PATH } from '../../core/diagnostics.js';
import { StandbyReporter } from '../../agent/standby-reporter.js';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';

const TOKEN = 'validate-agent-token-0123456789abcdef';
/** Debian's Python, where python3-torch is installed. */
const PYTHON = '/usr/bin/python3';

/** A stand-in dcgmi: `discovery -l` answers as nv-hostengine would; `diag -r 2` prints its table and exits with $DIAG_EXIT. */
function fakeDcgmi(dir: string, diag: 'pass' | 'fail'): string {
  const path = join(dir, `dcgmi-${diag}`);
  const row = diag === 'pass' ? '| Memory                    | Pass' : '| Memory                    | Fail - GPU 2: uncorrectable ECC';
  writeFileSync(
    path,
    [
      '#!/bin/sh',
      `echo "$@" >> ${join(dir, `calls-${diag}`)}`,
      'if [ "$1" = discovery ]; then echo "1 GPU found."; exit 0; fi',
      `if [ "$1" = diag ] && [ "$2" = -r ] && [ "$3" = 2 ]; then echo "${row}"; exit ${diag === 'pass' ? 0 : 226}; fi`,
      'exit 2',
      '',
    ].join('\n'),
  );
  chmodSync(path, 0o755);
  return path;
}

/**
 * The agent's validate endpoint with the real burn script on the CPU (Debian's python3 and
 * python3-torch) and DCGM absent or a stand-in dcgmi: what it runs, what it reports, and who may ask.
 */
describe('POST /api/v1/validate on the agent', () => {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-validate-'));
  const agents: Agent[] = [];
  afterAll(async () => {
    await Promise.all(agents.map((agent) => agent.close()));
    rmSync(root, { recursive: true, force: true });
  });

  async function start(settings: Record<string, string>, withDiagnose = false): Promise<string> {
    const agent = createAgent({
      node: 'node-1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: join(root, 'sys'), procfs: join(root, 'proc'), kmsg: join(root, 'kmsg'), nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 1,
      collectors: withDiagnose ? [validateCollectorFactory, diagnoseCollectorFactory] : [validateCollectorFactory],
      settings: { 'validate.python': PYTHON, 'validate.burn-seconds': '1', ...settings },
      apiToken: TOKEN,
      logger: silentLogger(),
    });
    agents.push(agent);
    return `http://127.0.0.1:${(await agent.start()).port}`;
  }

  async function validate(url: string, body: unknown, bearer = TOKEN): Promise<{ status: number; body: Record<string, unknown> }> {
    const response = await fetch(`${url}${VALIDATE_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${bearer}` },
      body: JSON.stringify(body),
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  }

  it('finds the burn script the agent ships', () => {
    expect(shippedBurnScript()).toBe(join(repoRoot(), 'clients', 'python', 'steadfast_burn.py'));
  });

  it('burns the CPU with the shipped script, skips DCGM where it is not installed, and reports each check with its seconds and the throughput', async () => {
    const url = await start({ 'validate.dcgmi': join(root, 'no-such-dcgmi') });
    const answer = await validate(url, {});
    expect(answer.status).toBe(200);
    const report = validationReportSchema.parse(answer.body);
    expect(report.node).toBe('node-1');
    expect(report.ok).toBe(true);
    const [burn, dcgm] = report.checks;
    expect(burn).toMatchObject({ name: 'burn', result: 'passed', ok: true });
    expect(burn!.seconds).toBeGreaterThanOrEqual(1);
    expect(dcgm).toMatchObject({ name: 'dcgm', result: 'skipped', ok: true });
    expect(dcgm!.reason).toContain('DCGM is not installed here');
    expect(report.devices).toHaveLength(1);
    expect(report.devices![0]).toMatchObject({ device: 'cpu', ok: true });
    expect(report.devices![0]!.tflops).toBeGreaterThan(0);
    // dcgm: always on a node without DCGM fails, naming why.
    const always = validationReportSchema.parse((await validate(url, { dcgm: 'always', burnSeconds: 1 })).body);
    expect(always.ok).toBe(false);
    expect(always.checks[1]).toMatchObject({ name: 'dcgm', result: 'failed', ok: false });
    expect(always.checks[1]!.reason).toMatch(/^dcgm: always, but .*no-such-dcgmi not found/);
  }, 60_000);

  it('runs dcgmi diag -r 2 where DCGM answers, and fails the node when a test of it fails', async () => {
    const passing = fakeDcgmi(root, 'pass');
    const failing = fakeDcgmi(root, 'fail');
    const good = validationReportSchema.parse((await validate(await start({ 'validate.dcgmi': passing }), {})).body);
    expect(good.ok).toBe(true);
    expect(good.checks.map((check) => `${check.name} ${check.result}`)).toEqual(['burn passed', 'dcgm passed']);
    const bad = validationReportSchema.parse((await validate(await start({ 'validate.dcgmi': failing }), {})).body);
    expect(bad.ok).toBe(false);
    expect(bad.checks[1]).toMatchObject({ name: 'dcgm', result: 'failed', ok: false });
    expect(bad.checks[1]!.reason).toContain('exited with status 226: | Memory');
    const run = promisify(execFile);
    expect((await run('cat', [join(root, 'calls-fail')])).stdout).toBe('discovery -l\ndiag -r 2\n');
    // dcgm: never does not even probe.
    const never = validationReportSchema.parse((await validate(await start({ 'validate.dcgmi': failing }), { dcgm: 'never' })).body);
    expect(never.checks[1]).toMatchObject({ result: 'skipped', reason: 'not asked for (dcgm: never)' });
    expect((await run('cat', [join(root, 'calls-fail')])).stdout).toBe('discovery -l\ndiag -r 2\n');
  }, 90_000);

  it('fails the burn when the Python cannot run it, with the reason', async () => {
    const url = await start({ 'validate.python': join(root, 'no-python'), 'validate.dcgmi': join(root, 'no-such-dcgmi') });
    const report = validationReportSchema.parse((await validate(url, {})).body);
    expect(report.ok).toBe(false);
    expect(report.checks[0]).toMatchObject({ name: 'burn', result: 'failed', ok: false });
    expect(report.checks[0]!.reason).toContain('no-python');
  });

  it('runs one validation at a time, refuses a request without the token, and takes no command from a request', async () => {
    const url = await start({ 'validate.dcgmi': join(root, 'no-such-dcgmi'), 'validate.burn-seconds': '3' });
    expect((await validate(url, {}, 'wrong-token')).status).toBe(401);
    expect(await validate(url, { command: ['rm', '-rf', '/'] })).toMatchObject({ status: 400 });
    expect(await validate(url, { dcgm: 'sometimes' })).toMatchObject({ status: 400 });
    const first = validate(url, {});
    // Once the first is running (its gauge says so), a second is answered busy at once.
    const deadline = Date.now() + 20_000;
    while (!/^steadfast_validation_running 1$/m.test(await (await fetch(`${url}/metrics`)).text())) {
      if (Date.now() > deadline) throw new Error('the first validation never showed as running');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const second = await validate(url, {});
    expect(second.status).toBe(409);
    expect(second.body.error).toMatch(/already running on node-1/);
    expect((await first).status).toBe(200);
  }, 60_000);

  it('refuses a validation while a stop-time diagnosis holds the GPUs, naming it, and runs it once the diagnosis is done', async () => {
    // A diagnosis whose one check waits until the test lets it finish.
    const release = join(root, 'diagnosis-may-end');
    const config = join(root, 'diagnostics.yaml');
    writeFileSync(
      config,
      JSON.stringify({ checks: [{ name: 'eud', command: ['sh', '-c', `while [ ! -e ${release} ]; do sleep 0.05; done`], timeoutSeconds: 60 }] }),
    );
    const url = await start({ 'validate.dcgmi': join(root, 'no-such-dcgmi'), [DIAGNOSE_CONFIG_FLAG]: config }, true);
    const diagnosis = fetch(`${url}${DIAGNOSE_PATH}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      body: '{}',
    });
    const deadline = Date.now() + 20_000;
    while (!/^steadfast_diagnose_running 1$/m.test(await (await fetch(`${url}/metrics`)).text())) {
      if (Date.now() > deadline) throw new Error('the diagnosis never showed as running');
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const refused = await validate(url, {});
    expect(refused.status).toBe(409);
    expect(refused.body.error).toBe('the GPUs of node-1 are busy with a diagnosis; try again when it has finished');
    writeFileSync(release, '');
    expect((await diagnosis).status).toBe(200);
    expect((await validate(url, {})).status).toBe(200);
  }, 60_000);

  it("makes a warm standby's self-check pass only once its validation passed", async () => {
    const reports: Array<{ ok: boolean; detail: string }> = [];
    const controller: Server = createServer((request, response) => {
      let body = '';
      request.on('data', (chunk: Buffer) => (body += chunk.toString()));
      request.on('end', () => {
        if (request.method === 'POST') reports.push(JSON.parse(body) as { ok: boolean; detail: string });
        response.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ state: 'self_check' }));
      });
    });
    await new Promise<void>((resolve) => controller.listen(0, '127.0.0.1', resolve));
    const controllerUrl = `http://127.0.0.1:${(controller.address() as AddressInfo).port}`;
    const healthy = 'steadfast_collector_success{collector="gpu"} 1\nsteadfast_gpu_last_poll_timestamp_seconds 1795870000\n';
    const standby = (agentUrl: string) =>
      new StandbyReporter({
        controllerUrl,
        token: 't',
        node: 'node-1',
        intervalMs: 60_000,
        scrape: async () => healthy,
        validate: async () => {
          const answer = await validate(agentUrl, {});
          return { status: answer.status, body: answer.body };
        },
        logger: silentLogger(),
      });
    try {
      await standby(await start({ 'validate.dcgmi': join(root, 'no-such-dcgmi') })).poll();
      await standby(await start({ 'validate.python': join(root, 'no-python'), 'validate.dcgmi': join(root, 'no-such-dcgmi') })).poll();
    } finally {
      await new Promise((resolve) => controller.close(resolve));
    }
    expect(reports[0]?.ok).toBe(true);
    expect(reports[0]?.detail).toMatch(/; validation passed: burn passed in [\d.]+ s; dcgm skipped in [\d.]+ s \(DCGM is not installed here/);
    expect(reports[1]?.ok).toBe(false);
    expect(reports[1]?.detail).toMatch(/^validation failed: burn failed in [\d.]+ s \(.*no-python/);
  }, 60_000);
});
