import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import autocannon from 'autocannon';
import { Queue } from 'bullmq';
import { configSchema } from '../core/config.js';
import { QUEUE_NAMES } from '../core/queues.js';
import { Keys, workerConnection } from '../core/redis.js';
import { ControllerProcess } from '../tryit/controller-process.js';
import { startRedis } from '../tryit/parts.js';
import { ProcessGroup, freePort } from '../tryit/processes.js';

/**
 * Intake under load: single-alert Alertmanager webhooks sent as fast as CONNECTIONS keep-alive
 * connections allow for SECONDS (autocannon, each request a different alert), against the controller process (dry-run backend, its policy
 * worker running) and a Redis of its own with the sim's durable settings (AOF, fsync always),
 * all on loopback. Reports webhooks/s accepted, the rate the policy worker processed them at,
 * p50/p99 latency, signals lost (a 202 whose signal the policy worker never audited), controller CPU seconds per
 * 1,000 alerts and Redis bytes per alert. The load generator shares the machine with both.
 */

const SECONDS = Number(process.env.STEADFAST_BENCH_LOAD_SECONDS ?? 10);
const CONNECTIONS = Number(process.env.STEADFAST_BENCH_LOAD_CONNECTIONS ?? 64);
/** Intake and workers in separate controller processes (`--no-workers` / `--no-http`). */
const SPLIT = process.env.STEADFAST_BENCH_LOAD_SPLIT === '1';
const TOKEN = 'bench-token-0123456789abcdef';
const PREFIX = 'bench';
/** How long the policy worker may take to catch up after the load stops before signals count as unprocessed. */
const DRAIN_TIMEOUT_MS = 60_000;
/** Set to a directory to have the controller write a CPU profile there (node --cpu-prof) when it stops. */
const PROFILE_DIR = process.env.STEADFAST_BENCH_PROFILE_DIR;

/** One firing alert about one node, told apart from every other by its index. */
function webhookBody(index: number, startsAt: string): string {
  const node = `gpu-${index % 4096}`;
  return JSON.stringify({
    version: '4',
    groupKey: `{}:{alertname="SteadfastRdmaPortErrors", node="${node}"}`,
    status: 'firing',
    receiver: 'steadfast-controller',
    groupLabels: { alertname: 'SteadfastRdmaPortErrors', node },
    commonLabels: {},
    commonAnnotations: {},
    externalURL: 'http://alertmanager:9093',
    alerts: [
      {
        status: 'firing',
        labels: { alertname: 'SteadfastRdmaPortErrors', node, device: 'mlx5_0', port: '1', severity: 'warning', domain: 'network' },
        annotations: {
          summary: 'RDMA port errors',
          description: `mlx5_0 port 1 on ${node} counts symbol errors.`,
          runbook_url: 'https://example.com/runbooks/rdma',
        },
        startsAt,
        endsAt: '0001-01-01T00:00:00Z',
        generatorURL: 'http://prometheus:9090/graph?g0.expr=rate%28steadfast_rdma_port_errors_total%5B5m%5D%29+%3E+0',
        fingerprint: index.toString(16).padStart(16, '0'),
      },
    ],
  });
}

interface LoadResult {
  /** Status → count, every answer. */
  readonly statuses: Map<number, number>;
  /** The signal ids every 202 named. */
  readonly ids: string[];
  readonly seconds: number;
  /** Latency percentiles of every answer (autocannon's histogram), ms. */
  readonly p50: number;
  readonly p99: number;
  /** CPU milliseconds the generator itself spent per request. */
  readonly generatorCpuMs: number;
}

/**
 * Sends single-alert webhooks for `seconds` over CONNECTIONS keep-alive connections with
 * autocannon (each request a different alert), keeping every answer's status and signal ids.
 */
async function load(port: number, seconds: number, nextIndex: () => number, startsAt: string): Promise<LoadResult> {
  const statuses = new Map<number, number>();
  const ids: string[] = [];
  const cpuBefore = process.cpuUsage();
  const started = performance.now();
  const result = await autocannon({
    url: `http://127.0.0.1:${port}`,
    connections: CONNECTIONS,
    duration: seconds,
    requests: [
      {
        method: 'POST',
        path: '/api/v1/alerts',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
        setupRequest: (request) => ({ ...request, body: webhookBody(nextIndex(), startsAt) }),
        onResponse: (status, body) => {
          statuses.set(status, (statuses.get(status) ?? 0) + 1);
          if (status === 202) ids.push(...((JSON.parse(body) as { ids?: string[] }).ids ?? []));
        },
      },
    ],
  });
  const elapsed = (performance.now() - started) / 1000;
  const cpu = process.cpuUsage(cpuBefore);
  const answered = [...statuses.values()].reduce((sum, count) => sum + count, 0);
  return {
    statuses,
    ids,
    seconds: elapsed,
    p50: result.latency.p50,
    p99: result.latency.p99,
    generatorCpuMs: (cpu.user + cpu.system) / 1000 / Math.max(1, answered),
  };
}

async function redisUsedMemory(redis: ReturnType<typeof workerConnection>): Promise<number> {
  const info = await redis.info('memory');
  return Number(/^used_memory:(\d+)/m.exec(info)?.[1] ?? Number.NaN);
}

/** CPU seconds the Redis server has used (user + system), from INFO cpu. */
async function redisCpuSeconds(redis: ReturnType<typeof workerConnection>): Promise<number> {
  const info = await redis.info('cpu');
  const field = (name: string): number => Number(new RegExp(`^${name}:([\\d.]+)`, 'm').exec(info)?.[1] ?? Number.NaN);
  return field('used_cpu_user') + field('used_cpu_sys');
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-intake-'));
  const group = new ProcessGroup();
  try {
    const redisPart = await startRedis(group, root);
    const config = configSchema.parse({
      redis: { url: redisPart.url, prefix: PREFIX },
      // Every sender shares 127.0.0.1 here: the per-client limits would see one client.
      controller: {
        port: await freePort(),
        metrics: { port: 0 },
        auth: { alertmanagerToken: TOKEN },
        rateLimit: { requestsPerSecond: 0 },
        connections: { maxPerClient: 0 },
      },
      backend: { kind: 'dry-run' },
    });
    const nodeArgs = PROFILE_DIR === undefined ? [] : ['--cpu-prof', `--cpu-prof-dir=${PROFILE_DIR}`];
    // The compiled controller, as installed: tsx's loader is not what a user runs.
    // SPLIT: the intake in one process (--no-workers), the workers in another (--no-http), as a
    // deployment with spare cores would run them; otherwise one process does both.
    const controller = new ControllerProcess(group, { name: 'controller', dir: root, config, nodeArgs, compiled: true, workers: !SPLIT });
    await controller.start();
    const workerProcess = SPLIT ? new ControllerProcess(group, { name: 'workers', dir: root, config, nodeArgs, compiled: true, http: false }) : undefined;
    await workerProcess?.start();
    const controllerCpu = (): number => controller.cpuSeconds() + (workerProcess?.cpuSeconds() ?? 0);
    const redis = workerConnection(redisPart.url);
    const signals = new Queue(QUEUE_NAMES.signals, { connection: redis, prefix: PREFIX });
    const port = config.controller.port;
    let next = 0;
    const nextIndex = (): number => next++;
    const startsAt = new Date().toISOString();

    // A short warm-up (JIT, connections), not counted.
    await load(port, 2, nextIndex, startsAt);
    await waitForProcessed(signals);

    const memoryBefore = await redisUsedMemory(redis);
    const cpuBefore = controllerCpu();
    const intakeCpuBefore = controller.cpuSeconds();
    const redisCpuBefore = await redisCpuSeconds(redis);
    const loadBefore = loadavg()[0] ?? 0;
    const started = performance.now();
    const sent = await load(port, SECONDS, nextIndex, startsAt);
    const accepted = sent.statuses.get(202) ?? 0;
    const answered = [...sent.statuses.values()].reduce((sum, count) => sum + count, 0);
    const processedAll = await waitForProcessed(signals);
    const processSeconds = (performance.now() - started) / 1000;
    const cpuSeconds = controllerCpu() - cpuBefore;
    const intakeCpu = controller.cpuSeconds() - intakeCpuBefore;
    const redisCpu = (await redisCpuSeconds(redis)) - redisCpuBefore;
    const loadAfter = loadavg()[0] ?? 0;
    const memoryAfter = await redisUsedMemory(redis);

    // Every 202's signal must have been acted on: the policy worker audits each one it takes.
    const ids = sent.ids;
    const written = new Keys(PREFIX).auditWritten;
    let lost = 0;
    for (let start = 0; start < ids.length; start += 1000) {
      const scores = (await redis.call('ZMSCORE', written, ...ids.slice(start, start + 1000).map((id) => `signal:${id}`))) as (string | null)[];
      lost += scores.filter((score) => score === null).length;
    }

    process.stdout.write(
      `\nIntake load: single-alert webhooks over ${CONNECTIONS} keep-alive connections for ${SECONDS} s (${SPLIT ? 'intake and workers in two controller processes' : 'one controller process, intake and policy worker'}, dry-run backend; Redis AOF fsync always; loopback)\n`,
    );
    process.stdout.write(
      `machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}; load average ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after\n\n`,
    );
    process.stdout.write('| figure | value |\n|---|---|\n');
    process.stdout.write(
      `| webhooks accepted (202) | ${accepted} of ${answered} answered (${[...sent.statuses].map(([status, count]) => `${status}×${count}`).join(', ')}) |\n`,
    );
    process.stdout.write(`| accepted per second | ${(accepted / sent.seconds).toFixed(0)} |\n`);
    process.stdout.write(
      `| processed per second (policy worker, until the last accepted was done) | ${processedAll ? (accepted / processSeconds).toFixed(0) : `not all processed within ${DRAIN_TIMEOUT_MS / 1000} s`} |\n`,
    );
    process.stdout.write(`| latency p50 / p99 (ms, every answer) | ${sent.p50.toFixed(1)} / ${sent.p99.toFixed(1)} |\n`);
    process.stdout.write(`| lost (202 whose signal was never acted on) | ${lost} |\n`);
    process.stdout.write(`| controller CPU seconds per 1,000 alerts (intake and policy) | ${((cpuSeconds / accepted) * 1000).toFixed(3)} |\n`);
    if (workerProcess)
      process.stdout.write(`| of which the intake process (HTTP, validation, the write to Redis) | ${((intakeCpu / accepted) * 1000).toFixed(3)} |\n`);
    process.stdout.write(`| Redis CPU seconds per 1,000 alerts | ${((redisCpu / accepted) * 1000).toFixed(3)} |\n`);
    process.stdout.write(`| load generator CPU seconds per 1,000 requests (autocannon, same machine) | ${sent.generatorCpuMs.toFixed(3)} |\n`);
    process.stdout.write(`| Redis bytes per alert (job, completed record, audit entry) | ${((memoryAfter - memoryBefore) / accepted).toFixed(0)} |\n`);
    await signals.close();
    redis.disconnect();
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

/** Waits until the policy worker has taken every stored signal job; false on timeout. */
async function waitForProcessed(signals: Queue): Promise<boolean> {
  const deadline = Date.now() + DRAIN_TIMEOUT_MS;
  while (Date.now() < deadline) {
    const counts = await signals.getJobCounts('waiting', 'active', 'delayed', 'prioritized');
    if (Object.values(counts).every((count) => count === 0)) return true;
    await sleep(50);
  }
  return false;
}

main().catch((error: unknown) => {
  process.stderr.write(`bench: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exitCode = 1;
});
