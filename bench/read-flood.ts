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
 * What a flood of big reads costs everyone else: /healthz latency while 16 clients with the
 * read-only token ask for 1,000-entry pages of a 20,000-entry audit trail as fast as they are
 * answered, against the same probe with no flood, in the same run; and the controller's RSS
 * (its peak resident set, from /proc) before and after. The controller runs as its own process
 * (the installed CLI over dist/), the probe as another, the clients in this one.
 */

const ENTRIES = Number(process.env.STEADFAST_BENCH_AUDIT_ENTRIES ?? 20_000);
const READERS = 16;
const PROBES = Number(process.env.STEADFAST_BENCH_PROBES ?? 300);
const READ_ONLY = 'bench-read-only-0123456789';

function describe(name: string, latencies: number[]): string {
  return `${name.padEnd(22)} /healthz p50 ${quantile(latencies, 0.5).toFixed(1)} ms  p99 ${quantile(latencies, 0.99).toFixed(1)} ms  max ${Math.max(...latencies).toFixed(1)} ms`;
}

async function main(): Promise<void> {
  const root = mkdtempSync(join(tmpdir(), 'steadfast-bench-reads-'));
  const processes = new ProcessGroup();
  try {
    const redis = await startRedis(processes, root);
    const writer = workerConnection(redis.url);
    const audit = new AuditLog(writer, new Keys('bench'));
    for (let index = 0; index < ENTRIES; index += 1) {
      await audit.append({
        type: 'signal',
        ref: `bench-${index}`,
        node: `node-${index % 64}`,
        summary: `bench entry ${index} ${'x'.repeat(300)}`,
        data: { index },
      });
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
    const controller = new ControllerProcess(processes, { name: 'controller', dir: root, config, workers: false, compiled: true });
    await controller.start();
    const url = controller.url;
    const quiet = await probeHealthz(url, PROBES);
    const rssBefore = controller.peakRssBytes();
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
    const flooded = await probeHealthz(url, PROBES);
    stop = true;
    await Promise.all(readers);
    const rssAfter = controller.peakRssBytes();
    process.stdout.write(
      [
        `read flood: ${READERS} read-only clients asking for 1,000-entry pages of ${ENTRIES} audit entries; ${PROBES} /healthz probes each way`,
        describe('no flood', quiet),
        describe('during the flood', flooded),
        `  ratio (flood / none)  p50 ×${(quantile(flooded, 0.5) / quantile(quiet, 0.5)).toFixed(1)}  p99 ×${(quantile(flooded, 0.99) / quantile(quiet, 0.99)).toFixed(1)}`,
        `  pages served ${served}, answered 429 ${refused}; controller peak RSS ${(rssBefore / 2 ** 20).toFixed(0)} → ${(rssAfter / 2 ** 20).toFixed(0)} MB`,
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
