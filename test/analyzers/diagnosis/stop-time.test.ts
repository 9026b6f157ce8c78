import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import {
  agentDeadlineSeconds,
  ringNeighbours,
  runStopTimeDiagnostics,
  summarizeDiagnostics,
  type AgentOutcome,
} from '../../../analyzers/diagnosis/stop-time.js';
import { ALL_CHECKS_STAGE, runStagedDiagnostics } from '../../../analyzers/diagnosis/staged.js';
import { AgentDirectory } from '../../../controller/agents.js';
import { configSchema } from '../../../core/config.js';
import { agentTokenFor } from '../../../core/credentials.js';
import type { CheckReport, DiagnoseReport } from '../../../core/diagnostics.js';
import { InputError } from '../../../core/errors.js';
import { silentLogger } from '../../../core/log.js';
import { createAgent, type Agent } from '../../../agent/agent.js';
import { DIAGNOSE_CONFIG_FLAG, diagnoseCollectorFactory } from '../../../agent/collectors/diagnose.js';

const GOOD = 'a'.repeat(64);
const BAD = 'b'.repeat(64);
const TOKEN = 'diagnose-test-token-0123';

function passed(name: string): CheckReport {
  return { name, result: 'passed', ok: true, exitCode: 0, signal: null, seconds: 1, timedOut: false, outputTail: '' };
}

function reportFor(node: string, checks: CheckReport[], referenceHash?: string): AgentOutcome {
  const report: DiagnoseReport = { node, startedAt: '2025-01-01T00:00:00.000Z', seconds: 3, checks, ...(referenceHash === undefined ? {} : { referenceHash }) };
  return { node, kind: 'report', report };
}

describe('summarizeDiagnostics', () => {
  it('evicts the nodes of failed or overrunning checks and the alignment outliers, in node order', () => {
    const summary = summarizeDiagnostics([
      reportFor('n1', [passed('eud')], GOOD),
      reportFor('n2', [{ ...passed('eud'), result: 'failed', ok: false, exitCode: 1, reason: 'exited with status 1: GPU 3 failed' }], GOOD),
      reportFor('n3', [passed('eud')], BAD),
      reportFor('n4', [{ ...passed('eud'), result: 'timed_out', ok: false, timedOut: true, exitCode: null, signal: 'SIGTERM' }], GOOD),
    ]);
    expect(summary.failed).toEqual([
      { node: 'n2', check: 'eud', reason: 'exited with status 1: GPU 3 failed' },
      { node: 'n4', check: 'eud', reason: 'result timed_out' },
    ]);
    expect(summary.alignmentOutliers).toEqual(['n3']);
    expect(summary.evict).toEqual(['n2', 'n3', 'n4']);
    expect(summary.notes).toEqual([]);
  });

  it('evicts nobody on alignment without a strict majority, and says why', () => {
    const summary = summarizeDiagnostics([reportFor('n1', [], GOOD), reportFor('n2', [], BAD)]);
    expect(summary.evict).toEqual([]);
    expect(summary.alignment).toMatchObject({ aligned: false });
    expect(summary.notes[0]).toContain('bit-wise alignment named nobody: no strict majority among 2 reference hashes');
  });

  it('reports incomplete checks and refusals as inconclusive without evicting', () => {
    const summary = summarizeDiagnostics([
      reportFor('n1', [{ ...passed('eud'), result: 'incomplete', ok: false, reason: 'stopped: the agent is shutting down' }]),
      { node: 'n2', kind: 'refused', status: 409, reason: 'agent answered 409: busy' },
    ]);
    expect(summary.inconclusive).toEqual([
      { node: 'n1', check: 'eud', reason: 'stopped: the agent is shutting down' },
      { node: 'n2', reason: 'agent answered 409: busy' },
    ]);
    expect(summary.evict).toEqual([]);
    expect(summary.alignment).toBeNull();
  });

  it('evicts a minority of unreachable nodes, but none when most agents are silent or when told not to', () => {
    const silent = (node: string): AgentOutcome => ({ node, kind: 'unreachable', reason: 'connection refused' });
    expect(summarizeDiagnostics([reportFor('n1', []), reportFor('n2', []), silent('n3')]).evict).toEqual(['n3']);
    const most = summarizeDiagnostics([reportFor('n1', []), silent('n2'), silent('n3')]);
    expect(most.evict).toEqual([]);
    expect(most.unreachable.map((entry) => entry.node)).toEqual(['n2', 'n3']);
    expect(most.notes[0]).toContain("2 of 3 agents did not answer; that many silent agents points at the controller's network");
    const off = summarizeDiagnostics([reportFor('n1', []), reportFor('n2', []), silent('n3')], { evictUnreachable: false });
    expect(off.evict).toEqual([]);
    expect(off.notes[0]).toContain('turned off');
  });

  it('judges alignment against a known-good hash when one is given', () => {
    const summary = summarizeDiagnostics([reportFor('n1', [], BAD), reportFor('n2', [], BAD), reportFor('n3', [], GOOD)], { expectedHash: GOOD });
    expect(summary.evict).toEqual(['n1', 'n2']);
  });
});

describe('diagnosis helpers', () => {
  it('gives each node its ring neighbours, next first, without itself or repeats', () => {
    expect(ringNeighbours('b', 1, ['a', 'b', 'c'])).toEqual(['c', 'a']);
    expect(ringNeighbours('a', 0, ['a', 'b'])).toEqual(['b']);
    expect(ringNeighbours('a', 0, ['a'])).toEqual([]);
  });

  it('asks the agent to finish early enough to answer before the controller gives up', () => {
    expect(agentDeadlineSeconds(600)).toBe(570);
    expect(agentDeadlineSeconds(60)).toBe(50);
    expect(agentDeadlineSeconds(4)).toBe(2);
  });
});

describe('runStopTimeDiagnostics against real agents', () => {
  let dir: string;
  const agents: Agent[] = [];
  const servers: Server[] = [];

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'steadfast-diagnosis-'));
  });

  afterEach(async () => {
    await Promise.all(agents.splice(0).map((agent) => agent.close()));
    for (const server of servers.splice(0)) {
      server.closeAllConnections();
      await new Promise((resolveClose) => server.close(resolveClose));
    }
    rmSync(dir, { recursive: true, force: true });
  });

  /** Starts a real agent with the diagnose collector and the given checks; returns its base URL. */
  async function agentWith(node: string, config: unknown, options: { apiToken?: string; reportsAs?: string } = {}): Promise<string> {
    const file = join(dir, `${node}.json`);
    writeFileSync(file, JSON.stringify(config));
    const agent = createAgent({
      node: options.reportsAs ?? node,
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs: '/nonexistent/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: [diagnoseCollectorFactory],
      settings: { [DIAGNOSE_CONFIG_FLAG]: file },
      apiToken: options.apiToken ?? TOKEN,
      logger: silentLogger(),
    });
    agents.push(agent);
    const { port } = await agent.start();
    return `http://127.0.0.1:${port}`;
  }

  /** An HTTP server that accepts requests and never answers. */
  async function hangingServer(): Promise<string> {
    const server = createServer(() => undefined);
    servers.push(server);
    await new Promise<void>((resolveListen) => server.listen(0, '127.0.0.1', resolveListen));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  /** A loopback port nothing listens on. */
  async function closedPort(): Promise<string> {
    const server = createServer();
    await new Promise<void>((resolveListen) => server.listen(0, '127.0.0.1', resolveListen));
    const { port } = server.address() as AddressInfo;
    await new Promise((resolveClose) => server.close(resolveClose));
    return `http://127.0.0.1:${port}`;
  }

  const healthy = {
    checks: [
      { name: 'eud', command: ['true'], timeoutSeconds: 5 },
      { name: 'peers', command: ['/bin/sh', '-c', 'echo "$STEADFAST_DIAGNOSE_PEERS"'], timeoutSeconds: 5 },
    ],
    reference: { command: ['echo', 'ref'], timeoutSeconds: 5 },
  };

  it('evicts failed, hung, misaligned and unreachable nodes, reports refusals as inconclusive, and never throws for one agent', async () => {
    const urls = new Map<string, string>([
      ['node-a', await agentWith('node-a', healthy)],
      [
        'node-b',
        await agentWith('node-b', { ...healthy, checks: [{ name: 'eud', command: ['/bin/sh', '-c', 'echo "GPU 2: fail"; exit 1'], timeoutSeconds: 5 }] }),
      ],
      ['node-c', await agentWith('node-c', { ...healthy, reference: { command: ['echo', 'ref-corrupted'], timeoutSeconds: 5 } })],
      ['node-d', await agentWith('node-d', { ...healthy, checks: [{ name: 'eud', command: ['sleep', '30'], timeoutSeconds: 1 }] })],
      ['node-e', await agentWith('node-e', healthy)],
      ['node-f', await agentWith('node-f', healthy)],
      ['node-g', await agentWith('node-g', healthy, { apiToken: 'another-token-0123456789' })],
      ['node-h', await agentWith('node-h', healthy, { reportsAs: 'node-z' })],
      ['node-i', await closedPort()],
      ['node-j', await hangingServer()],
    ]);
    const nodes = [...urls.keys(), 'node-k'];
    const agentUrl = (node: string): string => {
      const url = urls.get(node);
      if (url === undefined) throw new Error(`no agent known for ${node}`);
      return url;
    };
    const started = Date.now();
    const result = await runStopTimeDiagnostics(nodes, { agentUrl, token: TOKEN, timeoutSeconds: 4 });
    expect(Date.now() - started).toBeLessThan(8000);

    expect(result.failed).toEqual([
      { node: 'node-b', check: 'eud', reason: 'exited with status 1: GPU 2: fail' },
      { node: 'node-d', check: 'eud', reason: 'did not finish within its time limit of 1 s and was killed' },
    ]);
    expect(result.alignmentOutliers).toEqual(['node-c']);
    expect(result.unreachable.map((entry) => entry.node)).toEqual(['node-i', 'node-j', 'node-k']);
    expect(result.unreachable[1]?.reason).toContain('did not answer within 4 s');
    expect(result.unreachable[2]?.reason).toContain('no agent known for node-k');
    expect(result.inconclusive).toEqual([
      { node: 'node-g', reason: 'agent answered 401: missing or invalid "Authorization: Bearer <token>" header' },
      { node: 'node-h', reason: expect.stringContaining('reports for node node-z, not node-h') },
    ]);
    expect(result.evict).toEqual(['node-b', 'node-c', 'node-d', 'node-i', 'node-j', 'node-k']);
    expect(result.outcomes.map((outcome) => outcome.kind)).toEqual([
      'report',
      'report',
      'report',
      'report',
      'report',
      'report',
      'refused',
      'refused',
      'unreachable',
      'unreachable',
      'unreachable',
    ]);

    // Each agent was told its ring neighbours, next first, for the all-gather.
    const first = result.outcomes[0];
    expect(first?.kind === 'report' ? first.report.checks.find((entry) => entry.name === 'peers')?.outputTail : undefined).toBe('node-b,node-k\n');
  });

  it("reaches each agent with its own node's token from the controller's agents.secretFile, and one node's token opens no other agent", async () => {
    const secretFile = join(dir, 'agent-web-secret');
    writeFileSync(secretFile, `${'s'.repeat(40)}\n`);
    const directory = new AgentDirectory(configSchema.parse({ agents: { secretFile } }).agents, async () => true);
    const urls = new Map<string, string>([
      ['node-a', await agentWith('node-a', healthy, { apiToken: agentTokenFor('s'.repeat(40), 'node-a') })],
      ['node-b', await agentWith('node-b', healthy, { apiToken: agentTokenFor('s'.repeat(40), 'node-b') })],
    ]);
    const agentUrl = (node: string): string => urls.get(node) ?? '';
    const own = await runStopTimeDiagnostics([...urls.keys()], { agentUrl, tokenFor: (node) => directory.tokenFor(node), timeoutSeconds: 10 });
    expect(own.outcomes.map((outcome) => outcome.kind)).toEqual(['report', 'report']);
    // node-a's token, leaked, presented to node-b's agent.
    const leaked = await runStopTimeDiagnostics([...urls.keys()], { agentUrl, tokenFor: () => directory.tokenFor('node-a'), timeoutSeconds: 10 });
    expect(leaked.outcomes.map((outcome) => outcome.kind)).toEqual(['report', 'refused']);
    expect(leaked.inconclusive).toEqual([{ node: 'node-b', reason: expect.stringContaining('agent answered 401') }]);
  });

  it('runs only the checks asked for, with at most `concurrency` agents at once', async () => {
    const nodes = ['node-1', 'node-2', 'node-3', 'node-4'];
    const urls = new Map<string, string>();
    for (const node of nodes)
      urls.set(node, await agentWith(node, { ...healthy, checks: [...healthy.checks, { name: 'nap', command: ['sleep', '0.3'], timeoutSeconds: 5 }] }));
    let inFlight = 0;
    let most = 0;
    const counting: typeof fetch = async (input, init) => {
      inFlight += 1;
      most = Math.max(most, inFlight);
      try {
        return await fetch(input, init);
      } finally {
        inFlight -= 1;
      }
    };
    const result = await runStopTimeDiagnostics(nodes, {
      agentUrl: (node) => urls.get(node)!,
      token: TOKEN,
      timeoutSeconds: 20,
      checks: ['nap'],
      concurrency: 2,
      fetch: counting,
    });
    expect(most).toBe(2);
    expect(result.evict).toEqual([]);
    expect(result.alignment).toBeNull();
    for (const outcome of result.outcomes) {
      expect(outcome.kind === 'report' ? outcome.report.checks.map((entry) => entry.name) : outcome).toEqual(['nap']);
    }
  });

  it('rejects a bad node list or timeout before asking anyone', async () => {
    const options = { agentUrl: () => 'http://127.0.0.1:1', timeoutSeconds: 5 };
    await expect(runStopTimeDiagnostics(['node-1', 'node-1'], options)).rejects.toThrow(InputError);
    await expect(runStopTimeDiagnostics(['bad node'], options)).rejects.toThrow(/nodes\.0/);
    await expect(runStopTimeDiagnostics(['node-1'], { ...options, timeoutSeconds: 0 })).rejects.toThrow(/timeoutSeconds/);
  });
});

describe('runStagedDiagnostics', () => {
  /** A stand-in for every agent: answers per stage from `answer(node, checks)`. */
  type Asked = { node: string; checks: string[] | undefined };
  function fakeAgents(answer: (node: string, checks: string[]) => { status: number; body: unknown }): { fetch: typeof fetch; asked: Asked[] } {
    const asked: Asked[] = [];
    const fake = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
      const node = new URL(String(input)).hostname;
      const { checks } = JSON.parse(String(init?.body)) as { checks?: string[] };
      asked.push({ node, checks });
      const { status, body } = answer(node, checks ?? ['eud', 'all-gather']);
      return new Response(JSON.stringify(body), { status });
    };
    return { fetch: fake as typeof fetch, asked };
  }
  const report = (node: string, checks: string[], failing?: string): DiagnoseReport => ({
    node,
    startedAt: '2025-01-01T00:00:00.000Z',
    seconds: 1,
    checks: checks.map((name) => (name === failing ? { ...passed(name), result: 'failed', ok: false, exitCode: 1 } : passed(name))),
  });
  const stages = [
    { name: 'machine', checks: ['eud'] },
    { name: 'inter-machine', checks: ['all-gather'] },
  ];
  const options = (fake: typeof fetch) => ({ agentUrl: (node: string) => `http://${node}:9401`, timeoutSeconds: 20, fetch: fake });

  it('asks every node for every check in one call when no stages are configured', async () => {
    const agents = fakeAgents((node, checks) => ({ status: 200, body: report(node, checks, node === 'n2' ? 'eud' : undefined) }));
    const result = await runStagedDiagnostics(['n1', 'n2'], [], options(agents.fetch));
    expect(agents.asked).toEqual([
      { node: 'n1', checks: undefined },
      { node: 'n2', checks: undefined },
    ]);
    expect(result).toMatchObject({ evict: ['n2'], skipped: [] });
    expect(result.stages.map((stage) => stage.stage)).toEqual([ALL_CHECKS_STAGE.name]);
  });

  it('stops when no node was cleared, rather than run a multi-machine test on nobody', async () => {
    const agents = fakeAgents(() => ({ status: 409, body: { error: 'busy' } }));
    const result = await runStagedDiagnostics(['n1', 'n2', 'n3'], stages, options(agents.fetch));
    expect(result).toMatchObject({ evict: [], skipped: ['inter-machine'], skipReason: 'no node was cleared by the stage before' });
    expect(result.stages[0]).toMatchObject({ stage: 'machine', cleared: [], dropped: ['n1', 'n2', 'n3'] });
    expect(agents.asked.every((entry) => entry.checks?.[0] === 'eud')).toBe(true);
  });

  it('stops at a stage that evicts a silent node, as it does for a failed check', async () => {
    const agents = fakeAgents((node, checks) => ({ status: 200, body: report(node, checks) }));
    const silent = async (input: string | URL | Request, init?: RequestInit): Promise<Response> => {
      if (new URL(String(input)).hostname === 'n3') throw new TypeError('fetch failed');
      return agents.fetch(input, init);
    };
    const result = await runStagedDiagnostics(['n1', 'n2', 'n3'], stages, options(silent as typeof fetch));
    // One of three silent: evicted as §4.2 over-eviction allows, and the walk stops there.
    expect(result).toMatchObject({ evict: ['n3'], skipped: ['inter-machine'], skipReason: 'stage machine found suspects' });
  });
});
