import { mkdtempSync, rmSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { configSchema, type Config } from '../core/config.js';
import { silentLogger } from '../core/log.js';
import { QUEUE_NAMES, SIGNAL_BATCH_MAX } from '../core/queues.js';
import { Keys, workerConnection, type Redis } from '../core/redis.js';
import { Controller } from '../controller/service.js';
import { startRedis } from '../tryit/parts.js';
import { ProcessGroup } from '../tryit/processes.js';
import { RedisHa } from '../tryit/redis-ha.js';
import { quantile } from './stats.js';

/**
 * What durability costs in Redis, on loopback:
 * 1. the intake with and without waiting for a replica (redis.minReplicasAcked 1, Redis WAIT),
 *    one primary and one replica: accepted webhooks per second and latency quantiles, the
 *    same load against the same servers, without first;
 * 2. the bytes one alert leaves in Redis once handled (finished job, audit entry, marker),
 *    from INFO memory before and after N alerts and MEMORY USAGE of each kind of key.
 */

const WEBHOOKS = Number(process.env.STEADFAST_BENCH_WEBHOOKS ?? 2000);
const CONCURRENCY = Number(process.env.STEADFAST_BENCH_CONCURRENCY ?? 16);
const ALERTS_PER_WEBHOOK = 10;
const MEMORY_ALERTS = Number(process.env.STEADFAST_BENCH_MEMORY_ALERTS ?? 5000);
const TOKEN = 'bench-token-0123456789abcdef';

function config(url: string, prefix: string, redis: object = {}): Config {
  return configSchema.parse({
    redis: { url, prefix, ...redis },
    controller: {
      host: '127.0.0.1',
      port: 0,
      metrics: { port: 0 },
      auth: { alertmanagerToken: TOKEN },
      rateLimit: { requestsPerSecond: 0 },
      connections: { maxPerClient: 0 },
    },
    backend: { kind: 'dry-run' },
  });
}

function webhook(serial: number): string {
  const startsAt = new Date(Date.parse('2026-11-21T10:00:00.000Z') + serial).toISOString();
  const alerts = Array.from({ length: ALERTS_PER_WEBHOOK }, (_, gpu) => ({
    status: 'firing',
    labels: {
      alertname: 'SteadfastGpuTemperatureHigh',
      node: `node-${serial % 64}`,
      gpu: String(gpu),
      pci_bus_id: `0000:1${gpu}:00`,
      severity: 'warning',
      domain: 'gpu',
    },
    annotations: { summary: 'A GPU runs hot.', description: `GPU ${gpu} of node-${serial % 64} is above 85 °C for five minutes.` },
    startsAt,
  }));
  return JSON.stringify({ version: '4', status: 'firing', receiver: 'steadfast-controller', alerts });
}

async function send(url: string, body: string): Promise<number> {
  const response = await fetch(`${url}/api/v1/alerts`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
    body,
  });
  await response.arrayBuffer();
  return response.status;
}

interface Load {
  readonly name: string;
  readonly perSecond: number;
  readonly latencies: number[];
  readonly refused: number;
}

async function load(name: string, settings: Config, offset: number): Promise<Load> {
  const controller = new Controller({ config: settings, logger: silentLogger(), workers: false });
  const url = `http://127.0.0.1:${(await controller.start()).port}`;
  const latencies: number[] = [];
  let refused = 0;
  let next = 0;
  const started = performance.now();
  try {
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        for (let serial = next++; serial < WEBHOOKS; serial = next++) {
          const begin = performance.now();
          const status = await send(url, webhook(offset + serial));
          latencies.push(performance.now() - begin);
          if (status !== 202) refused += 1;
        }
      }),
    );
  } finally {
    await controller.close();
  }
  const seconds = (performance.now() - started) / 1000;
  return { name, perSecond: WEBHOOKS / seconds, latencies: latencies.sort((a, b) => a - b), refused };
}

async function usedMemory(redis: Redis): Promise<number> {
  const info = await redis.info('memory');
  return Number(/used_memory:(\d+)/.exec(info)?.[1] ?? Number.NaN);
}

async function keyBytes(redis: Redis, pattern: string): Promise<{ keys: number; bytes: number }> {
  let keys = 0;
  let bytes = 0;
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', pattern, 'COUNT', 1000);
    for (const key of found) {
      keys += 1;
      bytes += (await redis.memory('USAGE', key, 'SAMPLES', '0')) ?? 0;
    }
    cursor = next;
  } while (cursor !== '0');
  return { keys, bytes };
}

async function memoryPerAlert(root: string, group: ProcessGroup): Promise<string[]> {
  const redis = await startRedis(group, root, 'redis-memory');
  const prefix = 'mem';
  const reader = workerConnection(redis.url);
  const controller = new Controller({ config: config(redis.url, prefix, { retentionBudgetMB: 64 * 1024 }), logger: silentLogger() });
  const url = `http://127.0.0.1:${(await controller.start()).port}`;
  try {
    await sleep(500);
    const before = await usedMemory(reader);
    for (let serial = 0; serial < MEMORY_ALERTS / ALERTS_PER_WEBHOOK; serial += 1) {
      if ((await send(url, webhook(serial))) !== 202) throw new Error('a webhook was refused');
    }
    const keys = new Keys(prefix);
    // The policy worker audits every signal it takes: all audited, all done.
    while ((await reader.zcard(keys.auditWritten)) < MEMORY_ALERTS) await sleep(200);
    await sleep(500);
    const after = await usedMemory(reader);
    const jobs = await keyBytes(reader, `${prefix}:${QUEUE_NAMES.signals}:sb-*`);
    const audit = await keyBytes(reader, keys.audit);
    const markers = await keyBytes(reader, keys.auditWritten);
    const events = await keyBytes(reader, `${prefix}:${QUEUE_NAMES.signals}:events`);
    const per = (bytes: number): string => (bytes / MEMORY_ALERTS).toFixed(0);
    return [
      `| used_memory growth (INFO memory) | ${per(after - before)} |`,
      `| finished signal jobs (hashes of up to ${SIGNAL_BATCH_MAX} signals each, MEMORY USAGE) | ${per(jobs.bytes)} |`,
      `| audit entry (stream) | ${per(audit.bytes)} |`,
      `| write-once marker (sorted set) | ${per(markers.bytes)} |`,
      `| queue event stream (BullMQ, capped at ~10,000 events) | ${per(events.bytes)} |`,
    ];
  } finally {
    await controller.close();
    reader.disconnect();
  }
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-redis-'));
  const group = new ProcessGroup();
  try {
    process.stderr.write('bench: starting a primary and a replica …\n');
    const ha = await RedisHa.start(group, root, { replicas: 1, sentinels: 0 });
    const primary = `redis://127.0.0.1:${await ha.primaryPort()}`;
    const without = await load('primary only (minReplicasAcked 0)', config(primary, 'bench-a'), 0);
    const withWait = await load(
      '1 replica confirms (minReplicasAcked 1, WAIT)',
      config(primary, 'bench-b', { minReplicasAcked: 1, replicaAckTimeoutMs: 1000 }),
      WEBHOOKS,
    );
    process.stderr.write(`bench: measuring bytes per alert over ${MEMORY_ALERTS} alerts …\n`);
    const memory = await memoryPerAlert(root, group);
    process.stdout.write(
      `\nIntake with and without replica confirmation: ${WEBHOOKS} webhooks of ${ALERTS_PER_WEBHOOK} alerts, ${CONCURRENCY} senders, loopback\n`,
    );
    process.stdout.write(`machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}\n\n`);
    process.stdout.write('| intake | webhooks/s | p50 ms | p99 ms | refused |\n|---|---|---|---|---|\n');
    for (const run of [without, withWait]) {
      process.stdout.write(
        `| ${run.name} | ${run.perSecond.toFixed(0)} | ${quantile(run.latencies, 0.5).toFixed(1)} | ${quantile(run.latencies, 0.99).toFixed(1)} | ${run.refused} |\n`,
      );
    }
    process.stdout.write(`\nRedis bytes per alert once handled (${MEMORY_ALERTS} alerts)\n\n| what | bytes per alert |\n|---|---|\n${memory.join('\n')}\n`);
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
