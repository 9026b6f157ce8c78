import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AuditLog } from '../core/audit.js';
import { configSchema } from '../core/config.js';
import { Keys, workerConnection } from '../core/redis.js';
import { ControllerProcess } from '../tryit/controller-process.js';
import { startRedis } from '../tryit/parts.js';
import { freePorts, ProcessGroup } from '../tryit/processes.js';
import { quantile } from './stats.js';
import { probeHealthz } from './healthz-probe.js';

/**
 * What filtered audit reads cost everyone else: /healthz latency while two read-only clients ask
 * for one node's newest 100 entries (through the audit's index) as fast as they are answered, in
 * 15,000 entries of 64 nodes; beside the same probe with no reads, and while the two clients walk
 * the whole audit in 1,000-entry pages instead, which is what a filtered read cost before the
 * index (it decoded every entry, though it sent only the matches). One run, one controller; it
 * runs compiled under `npm run bench`, from the sources when this file runs under tsx.
 */

const ENTRIES = Number(process.env.STEADFAST_BENCH_AUDIT_ENTRIES ?? 15_000);
const NODES = 64;
const READERS = 2;
const PROBES = Number(process.env.STEADFAST_BENCH_PROBES ?? 300);
const READ_ONLY = 'bench-read-only-0123456789';

async function read(url: string, path: string): Promise<{ entries: { id: string }[] }> {
  const response = await fetch(`${url}${path}`, { headers: { authorization: `Bearer ${READ_ONLY}` } });
  if (response.status === 429) {
    await response.arrayBuffer();
    return { entries: [] };
  }
  if (response.status !== 200) throw new Error(`GET ${path}: ${response.status} ${await response.text()}`);
  return (await response.json()) as { entries: { id: string }[] };
}

/** /healthz latencies while READERS clients each run `once` over and over, and how many times they ran it. */
async function probeDuring(url: string, once: () => Promise<void>): Promise<{ latencies: number[]; reads: number }> {
  let stop = false;
  let reads = 0;
  const readers = Array.from({ length: READERS }, async () => {
    while (!stop) {
      await once();
      reads += 1;
    }
  });
  const latencies = await probeHealthz(url, PROBES);
  stop = true;
  await Promise.all(readers);
  return { latencies, reads };
}

function describe(name: string, latencies: number[], reads?: number): string {
  return `${name.padEnd(34)} /healthz p50 ${quantile(latencies, 0.5).toFixed(1).padStart(6)} ms  p99 ${quantile(latencies, 0.99).toFixed(1).padStart(6)} ms${reads === undefined ? '' : `  (${reads} reads)`}`;
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-audit-filter-'));
  const processes = new ProcessGroup();
  try {
    const redis = await startRedis(processes, root, 'redis', undefined, ['--appendonly', 'no']);
    const writer = workerConnection(redis.url);
    const audit = new AuditLog(writer, new Keys('bench'));
    for (let start = 0; start < ENTRIES; start += 500) {
      await Promise.all(
        Array.from({ length: Math.min(500, ENTRIES - start) }, (_, offset) => {
          const index = start + offset;
          return audit.append({
            type: 'signal',
            ref: `bench-${index}`,
            node: `node-${index % NODES}`,
            summary: `bench entry ${index} ${'x'.repeat(300)}`,
            data: { index },
          });
        }),
      );
    }
    writer.disconnect();
    const [port, metricsPort] = await freePorts(2);
    const config = configSchema.parse({
      redis: { url: redis.url, prefix: 'bench' },
      controller: {
        host: '127.0.0.1',
        port,
        metrics: { port: metricsPort },
        auth: { operatorToken: 'bench-operator-0123456789', readOnlyToken: READ_ONLY },
        rateLimit: { requestsPerSecond: 0 },
      },
      backend: { kind: 'dry-run' },
    });
    const compiled = import.meta.url.includes('/dist/');
    const controller = new ControllerProcess(processes, { name: 'controller', dir: root, config, workers: false, compiled });
    await controller.start();
    const url = controller.url;
    // Once, so that neither measured phase pays for indexing what came before (none here).
    await read(url, '/api/v1/audit?node=node-7&limit=1');
    const quiet = await probeHealthz(url, PROBES);
    const filtered = await probeDuring(url, async () => {
      await read(url, '/api/v1/audit?node=node-7&limit=100');
    });
    const walked = await probeDuring(url, async () => {
      let after = '0-0';
      for (;;) {
        const { entries } = await read(url, `/api/v1/audit?limit=1000&after=${after}`);
        const last = entries.at(-1);
        if (entries.length < 1000 || last === undefined) break;
        after = last.id;
      }
    });
    process.stdout.write(
      [
        `filtered audit reads: ${READERS} read-only clients, ${ENTRIES} entries over ${NODES} nodes, ${PROBES} /healthz probes each (controller ${compiled ? 'compiled' : 'from the sources'})`,
        describe('no reads', quiet),
        describe('node=node-7&limit=100 (index)', filtered.latencies, filtered.reads),
        describe('the whole audit, page by page', walked.latencies, walked.reads),
        '',
      ].join('\n'),
    );
    await controller.stop();
  } finally {
    await processes.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
