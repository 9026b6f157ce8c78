import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { aggregateStacks } from '../../../analyzers/stacks/aggregate.js';
import { silentLogger } from '../../../core/log.js';
import { Topology } from '../../../core/topology.js';
import { AgentDirectory, traceNodes } from '../../../controller/agents.js';
import { createAgent, type Agent } from '../../../agent/agent.js';
import type { AgentResponse, Collector } from '../../../agent/collector.js';
import type { CollectorSettings } from '../../../agent/flags.js';
import {
  PY_SPY_FLAG,
  STACK_DIR_FLAG,
  STACK_TOOL_FLAG,
  TRACE_PATH,
  createProcessCollector,
  processCollectorFactory,
} from '../../../agent/collectors/process.js';
import { gpuCollectorFactory } from '../../../agent/collectors/gpu/collector.js';
import { NVIDIA_SMI_XML, testContext, waitFor } from '../helpers.js';
import { alive, startRank, stopRanks, type PythonRank, type RankMode } from '../python-ranks.js';

/**
 * POST /api/v1/trace without py-spy: the ranks' own faulthandler, signalled through the real
 * /proc, in real Python processes registered with the Python client.
 */

const NO_PY_SPY = '/nonexistent/steadfast-test/py-spy';
const TOKEN = 'trace-test-token-0123456789';

let dir: string;
const ranks: PythonRank[] = [];
const collectors: Collector[] = [];
const ownAgents: Agent[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-trace-fh-'));
});

afterEach(async () => {
  await Promise.all(collectors.splice(0).map((collector) => collector.close()));
  await Promise.all(ownAgents.splice(0).map((agent) => agent.close()));
  await stopRanks(ranks);
  rmSync(dir, { recursive: true, force: true });
});

async function rank(mode: RankMode, rankNumber: number, options: { worker?: boolean } = {}): Promise<PythonRank> {
  const started = await startRank(mode, { RANK: String(rankNumber), STEADFAST_STACK_DIR: dir }, options);
  ranks.push(started);
  return started;
}

function collector(settings: CollectorSettings): Collector {
  const made = createProcessCollector(testContext({ procfs: '/proc' }, 5, settings));
  collectors.push(made);
  return made;
}

function trace(target: Collector, body: unknown): Promise<AgentResponse> {
  const route = target.routes?.find((candidate) => candidate.path === TRACE_PATH);
  if (!route) throw new Error('no trace route');
  return route.handle({ method: 'POST', path: TRACE_PATH, query: new URLSearchParams(), body });
}

interface Answer {
  tool: string;
  dumps: Array<{ pid: number; role: string; rank: number | null; ok: boolean; dump?: string; error?: string }>;
}

describe('POST /api/v1/trace with faulthandler', () => {
  it('falls back to faulthandler when py-spy is absent, and signals ranks only, never a forked worker', async () => {
    const python = await rank('collective', 5, { worker: true });
    const worker = python.worker ?? 0;
    const response = await trace(collector({ [PY_SPY_FLAG]: NO_PY_SPY }), { pids: [python.pid, worker], timeoutSeconds: 5 });
    expect(response.status).toBe(200);
    const answer = response.body as Answer;
    expect(answer.tool).toBe('faulthandler');
    expect(answer.dumps[0]).toMatchObject({ pid: python.pid, role: 'rank', rank: 5, ok: true, dump: expect.stringContaining(' in all_reduce\n') });
    expect(answer.dumps[1]).toEqual({
      pid: worker,
      role: 'dataloader',
      rank: 5,
      ok: false,
      error: 'not signalled: faulthandler dumps are taken of training ranks only, not of a dataloader',
    });
    // The worker shares the rank's file: one dump in it, the rank's.
    expect(readFileSync(python.file ?? '', 'utf8').match(/in all_reduce\n/g)).toHaveLength(1);
    expect(alive(worker)).toBe(true);
  });

  it('uses faulthandler when told to, even with py-spy at hand, and looks in --process.stack-dir when given', async () => {
    const python = await rank('dataloader', 2);
    const answer = (await trace(collector({ [PY_SPY_FLAG]: '/bin/true', [STACK_TOOL_FLAG]: 'faulthandler', [STACK_DIR_FLAG]: dir }), { pids: [python.pid] }))
      .body as Answer;
    expect(answer.tool).toBe('faulthandler');
    expect(answer.dumps[0]).toMatchObject({ ok: true, dump: expect.stringContaining(' in next_batch\n') });
  });

  it('answers 503 when py-spy is required and missing, or the tool is unknown', async () => {
    const python = await rank('collective', 0);
    const required = await trace(collector({ [PY_SPY_FLAG]: NO_PY_SPY, [STACK_TOOL_FLAG]: 'py-spy' }), { pids: [python.pid] });
    expect(required).toEqual({
      status: 503,
      body: { error: `py-spy not found at ${NO_PY_SPY}; install it with pip install py-spy, or use --process.stack-tool=faulthandler` },
    });
    const unknown = await trace(collector({ [STACK_TOOL_FLAG]: 'gdb' }), { pids: [python.pid] });
    expect(unknown).toEqual({ status: 503, body: { error: '--process.stack-tool must be one of auto, py-spy, faulthandler' } });
  });
});

describe('a rank started with no rank variables', () => {
  it('is found by the GPU nvidia-smi lists it on, traced with faulthandler, and shown with its GPU', async () => {
    // `python3 train.py` by hand: no RANK, LOCAL_RANK or SLURM_PROCID.
    const python = await startRank('collective', { STEADFAST_STACK_DIR: dir });
    ranks.push(python);
    expect(
      readFileSync(`/proc/${python.pid}/environ`, 'utf8')
        .split('\0')
        .filter((entry) => /^(RANK|LOCAL_RANK|SLURM_PROCID)=/.test(entry)),
    ).toEqual([]);
    // A stand-in nvidia-smi answering with a real capture (a Tesla T4 with a Python compute
    // process, pid 5762) in which that process is this one.
    const xml = join(dir, 'nvidia-smi.xml');
    writeFileSync(xml, readFileSync(join(NVIDIA_SMI_XML, 'telegraf_tesla-t4_515.105.01.xml'), 'utf8').replace('<pid>5762</pid>', `<pid>${python.pid}</pid>`));
    const smi = join(dir, 'nvidia-smi');
    writeFileSync(smi, `#!/bin/sh\n[ "$1" = "-q" ] && [ "$2" = "-x" ] && exec cat ${xml}\nexit 2\n`, { mode: 0o755 });
    const agent = createAgent({
      node: 'node-1',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs: '/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: smi },
      pollIntervalSeconds: 60,
      collectors: [gpuCollectorFactory, processCollectorFactory],
      settings: { [PY_SPY_FLAG]: NO_PY_SPY },
      apiToken: TOKEN,
      logger: silentLogger(),
    });
    ownAgents.push(agent);
    const { port } = await agent.start();
    const scrape = async (): Promise<string> => (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    await waitFor(async () => (await scrape()).includes(`pid="${python.pid}",type="C"`));
    const text = await scrape();
    expect(text).toContain(
      `steadfast_gpu_process_info{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-d37e67a5-91dd-3774-a5cb-99096249601a",pid="${python.pid}",type="C",name="python"} 1`,
    );
    expect(text).toMatch(new RegExp(`^steadfast_training_process_info\\{pid="${python.pid}",role="rank",comm="python3",gpu="0"\\} 1$`, 'm'));
    const response = await fetch(`http://127.0.0.1:${port}${TRACE_PATH}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' },
      body: JSON.stringify({ pids: [python.pid], timeoutSeconds: 5 }),
    });
    expect(response.status).toBe(200);
    const answer = (await response.json()) as Answer & { dumps: Array<{ gpus?: unknown }> };
    expect(answer.tool).toBe('faulthandler');
    expect(answer.dumps[0]).toMatchObject({
      pid: python.pid,
      role: 'rank',
      rank: null,
      ok: true,
      gpus: [{ gpu: '0', pciBusId: '0000:00:1e', uuid: 'GPU-d37e67a5-91dd-3774-a5cb-99096249601a' }],
    });
    expect(answer.dumps[0]?.dump).toContain(' in all_reduce\n');
  });
});

describe('stack aggregation from faulthandler dumps taken through the agent', () => {
  const agents: Agent[] = [];
  afterEach(async () => {
    await Promise.all(agents.splice(0).map((agent) => agent.close()));
  });

  async function agentOf(node: string): Promise<string> {
    const agent = createAgent({
      node,
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs: '/proc', kmsg: '/nonexistent/kmsg', nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: [processCollectorFactory],
      settings: { [PY_SPY_FLAG]: NO_PY_SPY },
      apiToken: TOKEN,
      logger: silentLogger(),
    });
    agents.push(agent);
    const { port } = await agent.start();
    return `http://127.0.0.1:${port}`;
  }

  it('traces real ranks on two agents over HTTP as the controller does, and groups the one stuck elsewhere apart', async () => {
    // Two nodes of two ranks each; rank 3 waits on its data queue while the others are in a collective.
    const started = await Promise.all([rank('collective', 0), rank('collective', 1), rank('collective', 2), rank('dataloader', 3)]);
    const urls = { 'gpu-node-07': await agentOf('gpu-node-07'), 'gpu-node-08': await agentOf('gpu-node-08') };
    const directory = new AgentDirectory(
      { urlTemplate: 'http://{node}:9401', urls, token: TOKEN, traceTimeoutSeconds: 10, diagnoseTimeoutSeconds: 60 },
      async () => true,
    );
    // Both agents read this machine's /proc: each is given its node's ranks, as it would find them alone there.
    const pidsOf = new Map([
      [urls['gpu-node-07'], started.slice(0, 2).map((python) => python.pid)],
      [urls['gpu-node-08'], started.slice(2).map((python) => python.pid)],
    ]);
    const perNode: typeof fetch = (input, init) => {
      const pids = pidsOf.get(String(input).replace(TRACE_PATH, ''));
      return fetch(input, { ...init, body: JSON.stringify({ ...(JSON.parse(String(init?.body)) as object), pids }) });
    };
    const traces = await traceNodes(directory, ['gpu-node-07', 'gpu-node-08'], perNode);
    expect(traces.map((trace) => ({ node: trace.node, error: trace.error, ranks: [...trace.byRank.keys()].sort() }))).toEqual([
      { node: 'gpu-node-07', error: undefined, ranks: [0, 1] },
      { node: 'gpu-node-08', error: undefined, ranks: [2, 3] },
    ]);

    const byRank = new Map(traces.flatMap((trace) => [...trace.byRank]));
    const topology = Topology.from({ nodes: ['gpu-node-07', 'gpu-node-08'], ranksPerNode: 2, tp: 1, pp: 1, dp: 4, order: 'tp-pp-dp' });
    const result = aggregateStacks(byRank, topology);
    expect(
      result.groups.map((group) => ({ ranks: group.ranks, healthy: group.healthy, top: group.frames.find((frame) => frame.includes('faulthandler-rank.py')) })),
    ).toEqual([
      { ranks: [0, 1, 2], healthy: true, top: 'all_reduce (fixtures/exporters/faulthandler-rank.py)' },
      { ranks: [3], healthy: false, top: 'next_batch (fixtures/exporters/faulthandler-rank.py)' },
    ]);
    expect(result.outlierRanks).toEqual([3]);
    expect(result.evict).toEqual(['gpu-node-08']);
    expect(result.missingRanks).toEqual([]);
    for (const python of started) expect(alive(python.pid)).toBe(true);
  });
});
