import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { AuditLog } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { repoRoot } from '../../core/paths.js';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { gpuCollectorFactory } from '../../agent/collectors/gpu/collector.js';
import { XID_STATE_FILE_FLAG, kernelLogCollectorFactory } from '../../agent/collectors/kernel-log/collector.js';
import { validateCollectorFactory } from '../../agent/collectors/validate.js';
import { testRedis } from '../support/redis.js';

const run = promisify(execFile);
const BIN = join(repoRoot(), 'bin', 'steadfast.js');
const FIXTURES = join(repoRoot(), 'test', 'fixtures', 'realworld');

/**
 * `steadfast resume NODE` with `validation.enabled`: a node whose agent's burn computes wrong stays
 * out of service, with the failed check named and the refusal audited; one whose burn passes goes
 * back, and the command prints how long its validation took. Real agents (the shipped burn on the
 * CPU, Debian's python3 with torch), the dry-run backend on the test Redis.
 */
describe('steadfast resume with validation on', () => {
  const store = testRedis();
  const work = mkdtempSync(join(tmpdir(), 'steadfast-resume-validation-'));
  const agents: Agent[] = [];
  afterAll(async () => {
    await Promise.all(agents.map((agent) => agent.close()));
    rmSync(work, { recursive: true, force: true });
    await store.cleanup();
  });

  /** A GPU that computes wrong: the real burn with one element of its third round's result corrupted. */
  const wrongBurn = join(work, 'wrong_burn.py');
  writeFileSync(
    wrongBurn,
    [
      'import json, sys',
      `sys.path.insert(0, ${JSON.stringify(join(repoRoot(), 'clients', 'python'))})`,
      'import steadfast_burn',
      'def corrupt(device, round_, result):',
      '    if round_ == 2:',
      '        result = result.clone(); result[1, 1] += 0.25',
      '    return result',
      'report = steadfast_burn.run_burn(["cpu"], seconds=float(sys.argv[2]), size=64, perturb=corrupt)',
      'print(json.dumps(report)); sys.exit(0 if report["ok"] else 1)',
      '',
    ].join('\n'),
  );

  async function agentFor(node: string, settings: Record<string, string> = {}): Promise<string> {
    const kmsg = join(work, `${node}-kern.log`);
    writeFileSync(kmsg, '[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n');
    const agent = createAgent({
      node,
      listen: { host: '127.0.0.1', port: 0 },
      paths: {
        sysfs: '/nonexistent',
        procfs: '/nonexistent',
        kmsg,
        nvidiaSmiXml: join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'),
        nvidiaSmi: '/nonexistent',
      },
      pollIntervalSeconds: 5,
      collectors: [gpuCollectorFactory, kernelLogCollectorFactory, validateCollectorFactory],
      settings: {
        [XID_STATE_FILE_FLAG]: join(work, `${node}-xid.json`),
        'validate.python': '/usr/bin/python3',
        'validate.burn-seconds': '1',
        'validate.dcgmi': join(work, 'no-dcgmi'),
        ...settings,
      },
      logger: silentLogger(),
    });
    agents.push(agent);
    return `http://127.0.0.1:${(await agent.start()).port}`;
  }

  async function resume(agentUrls: Record<string, string>, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    const config = join(work, 'config.yaml');
    writeFileSync(
      config,
      JSON.stringify({ redis: { url: store.url, prefix: store.prefix }, agents: { urls: agentUrls }, validation: { enabled: true, burnSeconds: 1 } }),
    );
    return run(process.execPath, [BIN, 'resume', ...args, '--config', config], { env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' } }).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (error: { code: number; stdout: string; stderr: string }) => ({ code: error.code, stdout: error.stdout, stderr: error.stderr }),
    );
  }

  it('refuses a node whose burn computes wrong, naming the check, and resumes one whose burn passes, printing its times', async () => {
    const backend = new DryRunBackend(store.redis, store.keys);
    const audit = new AuditLog(store.redis, store.keys);
    await backend.drain('node-bad', 'steadfast: fatal Xid 79');
    await backend.drain('node-good', 'steadfast: fatal Xid 79');
    const urls = { 'node-bad': await agentFor('node-bad', { 'validate.burn-script': wrongBurn }), 'node-good': await agentFor('node-good') };

    const refused = await resume(urls, 'node-bad', '--reason', 'GPU replaced');
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /node-bad stays out of service: validation failed \(burn\): burn failed in [\d.]+ s \(cpu: round 2: checksum off the CPU reference/,
    );
    expect(Object.keys(await backend.recorded())).toContain('node-bad');
    const refusal = (await audit.read({ node: 'node-bad', type: 'action' })).at(-1);
    expect(refusal?.summary).toMatch(/^resume node-bad: refused \(validation failed \(burn\)/);

    const passed = await resume(urls, 'node-good', '--reason', 'GPU replaced');
    expect(passed.code, passed.stderr).toBe(0);
    expect(passed.stdout).toMatch(
      /^node-good: resumed through dry-run \(was drained \(dry-run\)\), its checks passed; validated in [\d.]+ s \(burn passed in [\d.]+ s, dcgm skipped in [\d.]+ s \(DCGM is not installed here: .*\); burn [\d.]+ TFLOPS \(0 peers: too few to compare\)\)\n$/,
    );
    expect(Object.keys(await backend.recorded())).not.toContain('node-good');

    // --force skips the validation too.
    const forced = await resume(urls, 'node-bad', '--force', '--reason', 'vendor says fine');
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).not.toMatch(/validated/);
  }, 120_000);
});
