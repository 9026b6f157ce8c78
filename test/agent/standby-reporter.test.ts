import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../core/log.js';
import { createAgent, type Agent } from '../../agent/agent.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../agent/collectors/diagnose.js';
import { StandbyReporter } from '../../agent/standby-reporter.js';

/** A scrape of an agent whose GPUs were read: every collector working. */
const HEALTHY_SCRAPE = 'steadfast_collector_success{collector="gpu"} 1\nsteadfast_gpu_last_poll_timestamp_seconds 1795870000\n';

describe("a warm standby's self-check with the node's own diagnostics", () => {
  const dir = mkdtempSync(join(tmpdir(), 'steadfast-standby-check-'));
  let agent: Agent | undefined;
  let controller: Server | undefined;

  afterEach(async () => {
    await agent?.close();
    controller?.closeAllConnections();
    await new Promise((resolve) => (controller ? controller.close(resolve) : resolve(undefined)));
  });

  /** A stand-in controller that says the node waits for its self-check and keeps what it is told. */
  async function standInController(): Promise<{ url: string; reports: unknown[] }> {
    const reports: unknown[] = [];
    controller = createServer((request, response) => void answer(request, response));
    async function answer(request: IncomingMessage, response: ServerResponse): Promise<void> {
      let body = '';
      for await (const chunk of request) body += String(chunk);
      response.setHeader('content-type', 'application/json');
      if (request.method === 'POST') reports.push(JSON.parse(body));
      response.end(JSON.stringify({ node: 's1', role: 'standby', state: 'self_check' }));
    }
    await new Promise<void>((resolve) => controller?.listen(0, '127.0.0.1', resolve));
    return { url: `http://127.0.0.1:${(controller.address() as AddressInfo).port}`, reports };
  }

  async function agentWith(checks: unknown): Promise<string> {
    const file = join(dir, `checks-${Math.random()}.json`);
    writeFileSync(file, JSON.stringify(checks));
    agent = createAgent({
      node: 's1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent', procfs: '/nonexistent', kmsg: '/nonexistent', nvidiaSmi: '/nonexistent' },
      pollIntervalSeconds: 5,
      collectors: [diagnoseCollectorFactory],
      settings: { [DIAGNOSE_CONFIG_FLAG]: file },
      logger: silentLogger(),
    });
    return `http://127.0.0.1:${(await agent.start()).port}`;
  }

  function reporter(controllerUrl: string, agentUrl: string | undefined): StandbyReporter {
    return new StandbyReporter({
      controllerUrl,
      token: 't',
      node: 's1',
      intervalMs: 60_000,
      scrape: async () => HEALTHY_SCRAPE,
      diagnose: agentUrl
        ? async () => {
            const response = await fetch(`${agentUrl}/api/v1/diagnose`, {
              method: 'POST',
              headers: { 'content-type': 'application/json' },
              body: JSON.stringify({ standby: true }),
            });
            return { status: response.status, body: await response.json() };
          }
        : undefined,
      logger: silentLogger(),
    });
  }

  it('fails the self-check when a burn-in check fails, naming it, and skips checks that need neighbours', async () => {
    const { url, reports } = await standInController();
    const agentUrl = await agentWith({
      checks: [
        { name: 'eud', command: ['sh', '-c', 'echo "GPU 2 memory test failed"; exit 1'], timeoutSeconds: 10 },
        { name: 'all-gather', command: ['sh', '-c', 'exit 1'], timeoutSeconds: 10, standby: false },
      ],
    });
    await reporter(url, agentUrl).poll();
    expect(reports).toHaveLength(1);
    expect(reports[0]).toMatchObject({ ok: false });
    expect((reports[0] as { detail: string }).detail).toMatch(/^diagnostics failed: eud failed \(.*GPU 2 memory test failed/);
    expect((reports[0] as { detail: string }).detail).not.toContain('all-gather');
  });

  it('passes when every standby check passes, and says which ran', async () => {
    const { url, reports } = await standInController();
    const agentUrl = await agentWith({
      checks: [
        { name: 'eud', command: ['true'], timeoutSeconds: 10 },
        { name: 'nccl-all-to-all', command: ['true'], timeoutSeconds: 10 },
      ],
      reference: { command: ['false'], timeoutSeconds: 10 },
    });
    await reporter(url, agentUrl).poll();
    expect(reports).toEqual([{ ok: true, detail: 'all collectors working, every GPU present, no fatal Xid; diagnostics passed: eud, nccl-all-to-all' }]);
  });

  it('falls back to the scrape-based check when the node has no diagnostics', async () => {
    const { url, reports } = await standInController();
    await reporter(url, undefined).poll();
    expect(reports).toEqual([{ ok: true, detail: 'all collectors working, every GPU present, no fatal Xid' }]);
  });

  it('spreads the polls of 500 agents over half to one and a half intervals, so they do not poll in step', () => {
    const delays = Array.from({ length: 500 }, () => reporter('http://127.0.0.1:1', undefined).nextDelayMs());
    expect(Math.min(...delays)).toBeGreaterThanOrEqual(30_000);
    expect(Math.max(...delays)).toBeLessThanOrEqual(90_000);
    // Ten 6-second slices hold 50 each on average; in step, one would hold all 500.
    const slices = new Map<number, number>();
    for (const delay of delays) {
      const slice = Math.min(9, Math.floor((delay - 30_000) / 6000));
      slices.set(slice, (slices.get(slice) ?? 0) + 1);
    }
    expect(slices.size).toBe(10);
    expect(Math.max(...slices.values())).toBeLessThanOrEqual(90);
  });
});
