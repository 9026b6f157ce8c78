import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { afterAll, describe, expect, it } from 'vitest';
import { DryRunBackend } from '../../actuators/dry-run.js';
import { AuditLog } from '../../core/audit.js';
import { silentLogger } from '../../core/log.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { gpuCollectorFactory } from '../../agent/collectors/gpu/collector.js';
import { XID_STATE_FILE_FLAG, kernelLogCollectorFactory } from '../../agent/collectors/kernel-log/collector.js';
import { post, startController, testConfig } from '../support/controller.js';
import { testRedis } from '../support/redis.js';

const run = promisify(execFile);
const BIN = join(import.meta.dirname, '..', '..', 'bin', 'steadfast.js');
const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'realworld');

describe('steadfast resume', () => {
  const store = testRedis();
  const work = mkdtempSync(join(tmpdir(), 'steadfast-resume-'));
  const agents: Agent[] = [];
  afterAll(async () => {
    await Promise.all(agents.map((agent) => agent.close()));
    rmSync(work, { recursive: true, force: true });
    await store.cleanup();
  });

  /** A real agent for `node` reading a captured nvidia-smi document and the given kernel log. */
  async function agentFor(node: string, kmsg: string): Promise<string> {
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
      collectors: [gpuCollectorFactory, kernelLogCollectorFactory],
      settings: { [XID_STATE_FILE_FLAG]: join(work, `${node}-xid.json`) },
      logger: silentLogger(),
    });
    agents.push(agent);
    return `http://127.0.0.1:${(await agent.start()).port}`;
  }

  /** `steadfast resume` with a config naming the agents' URLs. */
  async function resume(agentUrls: Record<string, string>, ...args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
    const config = join(work, 'config.yaml');
    writeFileSync(config, JSON.stringify({ redis: { url: store.url, prefix: store.prefix }, agents: { urls: agentUrls } }));
    return run(process.execPath, [BIN, 'resume', ...args, '--config', config], { env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' } }).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (error: { code: number; stdout: string; stderr: string }) => ({ code: error.code, stdout: error.stdout, stderr: error.stderr }),
    );
  }

  it('returns the node to service and lets the next fault on it drain it again', async () => {
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    const backend = new DryRunBackend(store.redis, store.keys);
    const drains = async (): Promise<number> =>
      (await controller.audit.read({ node: 'node-7', type: 'action' })).filter((entry) => entry.data.state === 'running').length;
    const waitForDrains = async (count: number): Promise<void> => {
      for (let i = 0; i < 200 && (await drains()) < count; i += 1) await sleep(50);
    };
    // The step records that it is draining before the backend is asked: wait for the backend's record too.
    const drainedNodes = async (): Promise<string[]> => {
      for (let i = 0; i < 200 && Object.keys(await backend.recorded()).length === 0; i += 1) await sleep(50);
      return Object.keys(await backend.recorded());
    };
    try {
      const fault = (time: string): Record<string, unknown> => ({ kind: 'xid', node: 'node-7', gpu: '0000:18:00', xid: 48, message: 'DBE', time });
      await post(`${url}/api/v1/signals`, fault(new Date(Date.now() - 3600_000).toISOString()));
      await waitForDrains(1);
      expect(await drainedNodes()).toEqual(['node-7']);

      const healthyLog = join(work, 'kern.log');
      writeFileSync(healthyLog, '[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n');
      const { code, stdout, stderr } = await resume({ 'node-7': await agentFor('node-7', healthyLog) }, 'node-7', '--reason', 'GPU replaced');
      expect(code, stderr).toBe(0);
      expect(stdout).toMatch(/^node-7: resumed through dry-run \(was drained \(dry-run\)\), its checks passed; decision d-[0-9a-f]+ closed\n$/);
      expect(await backend.recorded()).toEqual({});
      const audit = await controller.audit.read({ node: 'node-7', type: 'action' });
      expect(audit.at(-1)?.summary).toBe('resume node-7: done (GPU replaced; was drained (dry-run))');

      // A fault after the resume: a new one (the resume closed those before it).
      await post(`${url}/api/v1/signals`, fault(new Date().toISOString()));
      await waitForDrains(2);
      expect(await drains()).toBe(2);
      expect(await drainedNodes()).toEqual(['node-7']);
    } finally {
      await controller.close();
    }
  });

  it('leaves a node that fails its checks drained, says why and audits the refusal; --force resumes it, recorded as forced', async () => {
    const { controller, url } = await startController(testConfig(store.url, store.prefix));
    const backend = new DryRunBackend(store.redis, store.keys);
    try {
      await post(`${url}/api/v1/signals`, {
        kind: 'xid',
        node: 'node-9',
        gpu: '0000:18:00',
        xid: 79,
        message: 'fallen off the bus',
        time: new Date().toISOString(),
      });
      for (let i = 0; i < 200 && !Object.keys(await backend.recorded()).includes('node-9'); i += 1) await sleep(50);
      // Its agent still counts a fatal Xid since boot: the repair did not happen.
      const agents = { 'node-9': await agentFor('node-9', join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt')) };
      const refused = await resume(agents, 'node-9', '--reason', 'looks fine');
      expect(refused.code).toBe(1);
      expect(refused.stderr).toMatch(/node-9 failed its checks and stays out of service: .*fatal Xid 79 seen.*--force/);
      expect(Object.keys(await backend.recorded())).toContain('node-9');
      const refusal = (await controller.audit.read({ node: 'node-9', type: 'action' })).at(-1);
      expect(refusal?.summary).toMatch(/^resume node-9: refused \(its checks failed: .*fatal Xid 79 seen/);
      expect(refusal?.actor).toEqual({ role: 'operator' });

      // An agent that cannot be reached is no pass either.
      const unreachable = await resume({ 'node-9': 'http://127.0.0.1:9' }, 'node-9');
      expect(unreachable.code).toBe(1);
      expect(unreachable.stderr).toMatch(/could not be reached/);

      const forced = await resume(agents, 'node-9', '--force', '--reason', 'vendor says fine');
      expect(forced.code, forced.stderr).toBe(0);
      expect(forced.stdout).toMatch(/^node-9: resumed through dry-run .*, without its checks/);
      expect(Object.keys(await backend.recorded())).not.toContain('node-9');
      const done = (await controller.audit.read({ node: 'node-9', type: 'action' })).at(-1);
      expect(done?.summary).toMatch(/^resume node-9: done \(vendor says fine; was .*; without its checks \(--force\)\)$/);
      expect(done?.data).toMatchObject({ state: 'done', forced: true });
    } finally {
      await controller.close();
    }
  });

  it('refuses to return a node someone else drained, naming their reason; --force lifts their drain too and the audit says so', async () => {
    const backend = new DryRunBackend(store.redis, store.keys);
    await backend.drain('node-11', 'admin: fan replacement');
    const agents = { 'node-11': await agentFor('node-11', join(work, 'node-11-kmsg-absent')) };
    const refused = await resume(agents, 'node-11', '--reason', 'GPU reset done');
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      /node-11 is out of service by someone else \("admin: fan replacement"\), not only by steadfast; it stays as it is\. Give --force/,
    );
    expect((await backend.nodeState('node-11')).reason).toBe('admin: fan replacement');

    const forced = await resume(agents, 'node-11', '--force', '--reason', 'the administrator asked');
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).toMatch(/^node-11: resumed through dry-run .*; lifted someone else's drain \("admin: fan replacement"\) with --force/);
    expect((await backend.nodeState('node-11')).drained).toBe(false);
    const entries = (await new AuditLog(store.redis, store.keys).read({ node: 'node-11', type: 'action' })).map((entry) => entry.summary);
    expect(entries).toContain('resume node-11: refused (out of service by someone else: "admin: fan replacement"; GPU reset done)');
    expect(entries.at(-1)).toMatch(
      /^resume node-11: done \(the administrator asked; was .*; without its checks \(--force\); lifted someone else's drain \("admin: fan replacement"\) with --force\)$/,
    );
  });
});
