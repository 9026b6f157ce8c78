import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { silentLogger } from '../../../core/log.js';
import { createAgent, type Agent } from '../../../agent/agent.js';
import type { AgentResponse, Collector } from '../../../agent/collector.js';
import type { CollectorSettings } from '../../../agent/flags.js';
import { flightRecorderSource } from '../../../agent/sources/flight-recorder-dumps.js';
import {
  FLIGHT_RECORDER_DIR_FLAG,
  PY_SPY_FLAG,
  STACK_TOOL_FLAG,
  TRACE_PATH,
  createProcessCollector,
  processCollectorFactory,
} from '../../../agent/collectors/process.js';
import { EXPECTED, FIXTURES, REALWORLD, expectMatchesAndLints, scrapeOne, testContext } from '../helpers.js';
import { RANK_PIDS, RANK_WITHOUT_ENVIRON, writeTorchrunProcfs } from '../fake-procfs.js';

const FAKE_PY_SPY = join(FIXTURES, 'exporters', 'fake-py-spy.sh');
const HANGING_PY_SPY = join(FIXTURES, 'exporters', 'hanging-py-spy.sh');
const FLIGHT_RECORDER = join(REALWORLD, 'pytorch-flight-recorder');

let dir: string;
let procfs: string;
const open: Collector[] = [];

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'steadfast-process-'));
  procfs = join(dir, 'proc');
  writeTorchrunProcfs(procfs);
});

afterEach(async () => {
  await Promise.all(open.splice(0).map((collector) => collector.close()));
  rmSync(dir, { recursive: true, force: true });
});

function collectorWith(settings: CollectorSettings, env: Record<string, string> = {}): { collector: Collector; context: ReturnType<typeof testContext> } {
  const context = testContext({ procfs }, 5, settings);
  const collector = createProcessCollector(context, { env });
  open.push(collector);
  return { collector, context };
}

function trace(collector: Collector, body: unknown): Promise<AgentResponse> {
  const route = collector.routes?.find((candidate) => candidate.path === TRACE_PATH && candidate.method === 'POST');
  if (!route) throw new Error('the process collector has no trace route');
  return route.handle({ method: 'POST', path: TRACE_PATH, query: new URLSearchParams(), body });
}

interface DumpBody {
  pid: number;
  role: string;
  rank: number | null;
  ok: boolean;
  dump?: string;
  error?: string;
}

interface FlightRecorderBody {
  name: string;
  sizeBytes: number;
  modifiedAt: string;
  format: string;
  truncated: boolean;
  content?: unknown;
  base64?: string;
}

interface TraceBody {
  node: string;
  capturedAt: string;
  dumps: DumpBody[];
  flightRecorder: FlightRecorderBody[];
  flightRecorderDir: string | null;
  error?: string;
}

function body(response: AgentResponse): TraceBody {
  return response.body as TraceBody;
}

describe('process collector exposition', () => {
  it('exports the torchrun node exactly as the expected file, which promtool accepts', async () => {
    const { collector, context } = collectorWith({});
    const text = await scrapeOne(context, collector);
    expect(text).toContain('steadfast_collector_success{collector="process"} 1');
    expect(text).toContain('steadfast_training_processes{role="rank"} 8');
    expect(text).toContain('steadfast_training_processes{role="dataloader"} 16');
    expect(text).toContain('steadfast_training_process_zombies 1');
    // 8 ranks × (3 600 000 + 120 000) ticks plus 0+100+…+700 at 100 ticks per second.
    expect(text).toContain('steadfast_training_process_cpu_seconds_total{role="rank"} 297628');
    expect(text).toContain(`steadfast_training_process_info{pid="${RANK_WITHOUT_ENVIRON}",role="rank",comm="pt_main_thread"} 1`);
    await expectMatchesAndLints(join(EXPECTED, 'process', 'torchrun-8-ranks.prom'), text);
  });

  it('fails the scrape, without fake zeros, while procfs cannot be read', async () => {
    const context = testContext({ procfs: join(dir, 'missing') });
    const collector = createProcessCollector(context);
    open.push(collector);
    await expect(collector.update()).rejects.toThrow(/ENOENT/);
    expect(await context.registry.metrics()).not.toContain('steadfast_training_process_zombies');
  });

  it('drops the series of processes that have exited at the next scrape', async () => {
    const { collector, context } = collectorWith({});
    await collector.update();
    rmSync(join(procfs, '101'), { recursive: true });
    await collector.update();
    const text = await context.registry.metrics();
    expect(text).toContain('steadfast_training_processes{role="rank"} 7');
    expect(text).not.toContain('pid="101"');
  });
});

describe('POST /api/v1/trace', () => {
  it('dumps every rank with py-spy and reports the one py-spy may not trace as an error of its own', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY });
    const response = await trace(collector, undefined);
    expect(response.status).toBe(200);
    const answer = body(response);
    expect(answer.node).toBe('node-1');
    expect(Number.isNaN(Date.parse(answer.capturedAt))).toBe(false);
    expect(answer.dumps.map((dump) => dump.pid)).toEqual(RANK_PIDS);
    const first = answer.dumps[0]!;
    expect(first).toMatchObject({ pid: 101, role: 'rank', rank: 8, ok: true });
    expect(first.dump).toContain('Process 101: /usr/bin/python3 -u pretrain_gpt.py');
    expect(first.dump).toContain(
      '    broadcast (torch/distributed/distributed_c10d.py:1191)\n    _aggregate_total_loss (deepspeed/runtime/pipe/engine.py:540)',
    );
    expect(answer.dumps.find((dump) => dump.pid === RANK_WITHOUT_ENVIRON)).toEqual({
      pid: RANK_WITHOUT_ENVIRON,
      role: 'rank',
      rank: null,
      ok: false,
      error: 'py-spy exited with status 1: Error: Permission Denied',
    });
    expect(answer.flightRecorder).toEqual([]);
    expect(answer.flightRecorderDir).toBeNull();
  });

  it('dumps only the pids asked for when they belong to the training tree, a dataloader worker included', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY });
    const response = await trace(collector, { pids: [204, 103] });
    expect(response.status).toBe(200);
    expect(body(response).dumps.map(({ pid, role, rank, ok }) => ({ pid, role, rank, ok }))).toEqual([
      { pid: 204, role: 'dataloader', rank: 10, ok: true },
      { pid: 103, role: 'rank', rank: 10, ok: true },
    ]);
  });

  it('refuses pids outside the training tree with 400 naming each of them', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY });
    const response = await trace(collector, { pids: [101, 700, 4242] });
    expect(response.status).toBe(400);
    expect(response.body).toEqual({ error: 'pid 700, pid 4242 are not part of the training process tree on node-1', field: 'pids' });
  });

  it.each([
    [{ timeoutSeconds: 0 }, /timeoutSeconds: .*>=1/],
    [{ timeoutSeconds: 61 }, /timeoutSeconds: .*<=60/],
    [{ pids: ['101'] }, /pids\.0: /],
    [{ pid: 101 }, /pid/],
    [[101], /\(root\)/],
  ])('answers the malformed body %j with 400 naming the field', async (request, message) => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY });
    const response = await trace(collector, request);
    expect(response.status).toBe(400);
    expect((response.body as { error: string }).error).toMatch(message);
  });

  it('answers 503 with how to install py-spy when it is required and missing', async () => {
    const missing = join(dir, 'bin', 'py-spy');
    const { collector } = collectorWith({ [PY_SPY_FLAG]: missing, [STACK_TOOL_FLAG]: 'py-spy' });
    const response = await trace(collector, {});
    expect(response).toEqual({
      status: 503,
      body: { error: `py-spy not found at ${missing}; install it with pip install py-spy, or use --process.stack-tool=faulthandler` },
    });
  });

  it('looks a bare py-spy name up on PATH and answers 503 when it is required and not there', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: 'steadfast-no-such-py-spy', [STACK_TOOL_FLAG]: 'py-spy' });
    const response = await trace(collector, {});
    expect(response.status).toBe(503);
    expect((response.body as { error: string }).error).toBe(
      'py-spy not found at steadfast-no-such-py-spy; install it with pip install py-spy, or use --process.stack-tool=faulthandler',
    );
  });

  it('falls back to faulthandler without py-spy, and signals no pid of a procfs that is not its own pid namespace', async () => {
    // The fake procfs has no `self`: its pids name nothing on this machine, so nothing may be signalled.
    const { collector } = collectorWith({ [PY_SPY_FLAG]: join(dir, 'bin', 'py-spy') });
    const response = await trace(collector, { pids: [101, 204] });
    expect(response.status).toBe(200);
    expect(body(response)).toMatchObject({
      tool: 'faulthandler',
      dumps: [
        { pid: 101, role: 'rank', ok: false, error: expect.stringContaining('cannot tell whether') },
        { pid: 204, role: 'dataloader', ok: false, error: expect.stringContaining('training ranks only') },
      ],
    });
  });

  it('gives up on a py-spy that hangs at the timeout, reports it per pid, and still answers 200 within the deadline', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: HANGING_PY_SPY });
    const started = Date.now();
    const response = await trace(collector, { timeoutSeconds: 1 });
    const elapsed = Date.now() - started;
    expect(response.status).toBe(200);
    expect(elapsed).toBeGreaterThanOrEqual(900);
    // Generous for a loaded CI machine; without the timeout it would take the script's 30 s.
    expect(elapsed).toBeLessThan(5000);
    const dumps = body(response).dumps;
    expect(dumps).toHaveLength(8);
    for (const dump of dumps) {
      // The limit is what is left of the 1 s deadline when that py-spy starts (less on a busy machine).
      expect(dump).toMatchObject({ ok: false, error: expect.stringMatching(/^py-spy did not finish within (1\.0|0\.\d) s and was killed$/) });
    }
  });

  it('answers 409 to a second trace while the first is running, then serves again', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: HANGING_PY_SPY });
    const first = trace(collector, { timeoutSeconds: 1, pids: [101] });
    const second = await trace(collector, { pids: [101] });
    expect(second.status).toBe(409);
    expect((await first).status).toBe(200);
    expect((await trace(collector, { timeoutSeconds: 1, pids: [102] })).status).toBe(200);
  });

  it('lists the flight-recorder files newest first, with JSON parsed and pickles as base64, skipping symlinks', async () => {
    const recorder = join(dir, 'fr');
    mkdirSync(recorder);
    const pickle = join(FLIGHT_RECORDER, 'gpu_error_1st_pickle', '_dump_12');
    const decoded = join(FLIGHT_RECORDER, 'gpu_error_1st_all16ranks_decoded.json');
    copyFileSync(pickle, join(recorder, 'nccl_trace_rank_12'));
    copyFileSync(decoded, join(recorder, 'nccl_trace_rank_all.json'));
    writeFileSync(join(recorder, 'nccl_trace_rank_big'), Buffer.concat([Buffer.from([0x80, 0x02]), Buffer.alloc(1536 * 1024, 0x4b)]));
    symlinkSync('/etc/hostname', join(recorder, 'nccl_trace_rank_99'));
    utimesSync(join(recorder, 'nccl_trace_rank_12'), new Date('2025-03-01T10:00:02Z'), new Date('2025-03-01T10:00:02Z'));
    utimesSync(join(recorder, 'nccl_trace_rank_all.json'), new Date('2025-03-01T10:00:01Z'), new Date('2025-03-01T10:00:01Z'));
    utimesSync(join(recorder, 'nccl_trace_rank_big'), new Date('2025-03-01T10:00:00Z'), new Date('2025-03-01T10:00:00Z'));

    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY, [FLIGHT_RECORDER_DIR_FLAG]: recorder });
    const response = await trace(collector, { pids: [101] });
    expect(response.status).toBe(200);
    const answer = body(response);
    expect(answer.flightRecorderDir).toBe(recorder);
    expect(answer.flightRecorder.map(({ name, format, truncated, sizeBytes, modifiedAt }) => ({ name, format, truncated, sizeBytes, modifiedAt }))).toEqual([
      { name: 'nccl_trace_rank_12', format: 'pickle', truncated: false, sizeBytes: 5500, modifiedAt: '2025-03-01T10:00:02.000Z' },
      { name: 'nccl_trace_rank_all.json', format: 'json', truncated: false, sizeBytes: 268760, modifiedAt: '2025-03-01T10:00:01.000Z' },
      { name: 'nccl_trace_rank_big', format: 'pickle', truncated: true, sizeBytes: 1536 * 1024 + 2, modifiedAt: '2025-03-01T10:00:00.000Z' },
    ]);
    const [small, json, big] = answer.flightRecorder;
    expect(Buffer.from(small!.base64!, 'base64').equals(readFileSync(pickle))).toBe(true);
    expect(json!.content).toEqual(JSON.parse(readFileSync(decoded, 'utf8')));
    expect(Buffer.from(big!.base64!, 'base64')).toHaveLength(1024 * 1024);
  });

  it('reports a flight-recorder directory that is missing without failing the trace', async () => {
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY, [FLIGHT_RECORDER_DIR_FLAG]: join(dir, 'no-fr') });
    const response = await trace(collector, { pids: [101] });
    expect(response.status).toBe(200);
    expect(response.body).toMatchObject({ flightRecorder: [], flightRecorderError: expect.stringContaining('ENOENT') });
  });

  it('finds the dumps through TORCH_NCCL_DEBUG_INFO_TEMP_FILE when no directory flag is given, keeping to its file prefix', async () => {
    expect(flightRecorderSource(undefined, { TORCH_NCCL_DEBUG_INFO_TEMP_FILE: '/tmp/nccl_trace_rank_' })).toEqual({ dir: '/tmp', prefix: 'nccl_trace_rank_' });
    expect(flightRecorderSource('/var/fr', { TORCH_NCCL_DEBUG_INFO_TEMP_FILE: '/tmp/nccl_trace_rank_' })).toEqual({ dir: '/var/fr' });
    expect(flightRecorderSource(undefined, {})).toBeUndefined();

    const recorder = join(dir, 'tmp');
    mkdirSync(recorder);
    copyFileSync(join(FLIGHT_RECORDER, 'gpu_error_1st_pickle', '_dump_0'), join(recorder, 'nccl_trace_rank_0'));
    writeFileSync(join(recorder, 'unrelated.json'), '{"secret": true}');
    const { collector } = collectorWith({ [PY_SPY_FLAG]: FAKE_PY_SPY }, { TORCH_NCCL_DEBUG_INFO_TEMP_FILE: join(recorder, 'nccl_trace_rank_') });
    const answer = body(await trace(collector, { pids: [101] }));
    expect(answer.flightRecorder.map((file) => file.name)).toEqual(['nccl_trace_rank_0']);
  });
});

describe('trace endpoint on the agent', () => {
  let agent: Agent | undefined;
  afterEach(async () => {
    await agent?.close();
    agent = undefined;
  });

  it('serves POST /api/v1/trace over HTTP with the JSON body and status of the route', async () => {
    agent = createAgent({
      node: 'node-7',
      listen: { host: '127.0.0.1', port: 0 },
      paths: { sysfs: '/nonexistent/sys', procfs, kmsg: '/nonexistent/kmsg', nvidiaSmi: '/nonexistent/nvidia-smi' },
      pollIntervalSeconds: 60,
      collectors: [processCollectorFactory],
      settings: { [PY_SPY_FLAG]: FAKE_PY_SPY },
      logger: silentLogger(),
    });
    const { port } = await agent.start();
    const ok = await fetch(`http://127.0.0.1:${port}${TRACE_PATH}`, { method: 'POST', body: JSON.stringify({ pids: [105], timeoutSeconds: 5 }) });
    expect(ok.status).toBe(200);
    expect(await ok.json()).toMatchObject({ node: 'node-7', dumps: [{ pid: 105, role: 'rank', rank: 12, ok: true }] });
    const refused = await fetch(`http://127.0.0.1:${port}${TRACE_PATH}`, { method: 'POST', body: '{"pids":[1]}' });
    expect(refused.status).toBe(400);
    expect(await refused.json()).toEqual({ error: 'pid 1 is not part of the training process tree on node-7', field: 'pids' });
  });
});
