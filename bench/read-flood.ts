import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { configSchema } from '../core/config.js';
import { silentLogger } from '../core/log.js';
import { Controller } from '../controller/service.js';
import { startRedis } from '../sim/parts.js';
import { ProcessGroup } from '../sim/processes.js';
import { quantile } from './stats.js';

/**
 * What a flood of big reads costs everyone else: /healthz latency while 16 clients with the
 * read-only token ask for 1,000-entry pages of a 20,000-entry audit trail as fast as they are
 * answered, against the same probe with no flood, in the same run; and the controller's RSS
 * before and after.
 */

const ENTRIES = Number(process.env.STEADFAST_BENCH_AUDIT_ENTRIES ?? 20_000);
const READERS = 16;
const PROBES = Number(process.env.STEADFAST_BENCH_PROBES ?? 300);
const READ_ONLY = 'bench-read-only-0123456789';

async function probe(url: string, count: number): Promise<number[]> {
  const latencies: number[] = [];
  for (let index = 0; index < count; index += 1) {
    const started = performance.now();
    const response = await fetch(`${url}/healthz`);
    await response.arrayBuffer();
    latencies.push(performance.now() - started);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return latencies.sort((a, b) => a - b);
}

function describe(name: string, latencies: number[]): string {
  return `${name.padEnd(22)} /healthz p50 ${quantile(latencies, 0.5).toFixed(1)} ms  p99 ${quantile(latencies, 0.99).toFixed(1)} ms  max ${Math.max(...latencies).toFixed(1)} ms`;
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-reads-'));
  const processes = new ProcessGroup();
  try {
    const redis = await startRedis(processes, root);
    const config = configSchema.parse({
      redis: { url: redis.url, prefix: 'bench' },
      controller: { host: '127.0.0.1', port: 0, metrics: { port: 0 }, auth: { operatorToken: 'bench-operator-0123456789', readOnlyToken: READ_ONLY }, rateLimit: { requestsPerSecond: 0 } },
      backend: { kind: 'dry-run' },
    });
    const controller = new Controller({ config, logger: silentLogger(), workers: false });
    const url = `http://127.0.0.1:${(await controller.start()).port}`;
    for (let index = 0; index < ENTRIES; index += 1) {
      await controller.audit.append({ type: 'signal', ref: `bench-${index}`, node: `node-${index % 64}`, summary: `bench entry ${index} ${'x'.repeat(300)}`, data: { index } });
    }
    const quiet = await probe(url, PROBES);
    const rssBefore = process.memoryUsage().rss;
    let stop = false;
    let served = 0;
    let refused = 0;
    const readers = Array.from({ length: READERS }, async () => {
      while (!stop) {
        const response = await fetch(`${url}/api/v1/audit?limit=1000`, { headers: { authorization: `Bearer ${READ_ONLY}` } });
        await response.arrayBuffer();
        if (response.status === 200) served += 1;
        else refused += 1;
        if (response.status === 429) await new Promise((resolve) => setTimeout(resolve, 20));
      }
    });
    const flooded = await probe(url, PROBES);
    stop = true;
    await Promise.all(readers);
    const rssAfter = process.memoryUsage().rss;
    process.stdout.write(
      [
        `read flood: ${READERS} read-only clients asking for 1,000-entry pages of ${ENTRIES} audit entries; ${PROBES} /healthz probes each way`,
        describe('no flood', quiet),
        describe('during the flood', flooded),
        `  ratio (flood / none)  p50 ×${(quantile(flooded, 0.5) / quantile(quiet, 0.5)).toFixed(1)}  p99 ×${(quantile(flooded, 0.99) / quantile(quiet, 0.99)).toFixed(1)}`,
        `  pages served ${served}, answered 429 ${refused}; RSS (this process: bench and controller) ${(rssBefore / 2 ** 20).toFixed(0)} → ${(rssAfter / 2 ** 20).toFixed(0)} MB`,
        '',
      ].join('\n'),
    );
    await controller.close();
  } finally {
    await processes.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
