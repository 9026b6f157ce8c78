import { execFile } from 'node:child_process';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { stringify } from 'yaml';
import { freePort, httpOk, waitFor, type ProcessGroup } from '../../tryit/processes.js';
import type { FleetPlan } from './fleet.js';
import { buildTimelines } from './timeline.js';
import { writeOpenMetrics } from './series.js';

/**
 * The generated fleet in a real Prometheus: OpenMetrics files written in parts, each turned into
 * TSDB blocks by `promtool tsdb create-blocks-from openmetrics` while the next part is written,
 * then Prometheus started on loopback over those blocks (the same Debian binary the tests use).
 */

const run = promisify(execFile);

export interface BackfillFigures {
  readonly samples: number;
  readonly writeSeconds: number;
  readonly backfillSeconds: number;
}

/** Writes and backfills the fleet into `dataDir`; parts of `nodesPerPart` nodes each. */
export async function backfillFleet(plan: FleetPlan, workDir: string, dataDir: string, nodesPerPart = 16): Promise<BackfillFigures> {
  mkdirSync(dataDir, { recursive: true });
  const timelines = buildTimelines(plan);
  const started = performance.now();
  let writing = 0;
  let samples = 0;
  let previous: Promise<unknown> = Promise.resolve();
  for (let first = 0; first < plan.nodes.length; first += nodesPerPart) {
    const file = join(workDir, `part-${first}.om`);
    const writeStart = performance.now();
    samples += await writeOpenMetrics(plan, timelines, plan.nodes.slice(first, first + nodesPerPart), file);
    writing += performance.now() - writeStart;
    // One promtool at a time, beside the writer of the next part. Long blocks: promtool reads
    // its input once per block range.
    await previous;
    previous = run('promtool', ['tsdb', 'create-blocks-from', 'openmetrics', '--max-block-duration=500h', file, dataDir], { maxBuffer: 16 * 1024 * 1024 }).then(
      () => rmSync(file, { force: true }),
    );
  }
  await previous;
  return { samples, writeSeconds: writing / 1000, backfillSeconds: (performance.now() - started) / 1000 };
}

export interface BackfilledPrometheus {
  readonly url: string;
}

/** Prometheus on loopback over an existing TSDB, scraping nothing; ready when it answers /-/ready. */
export async function startPrometheusOn(group: ProcessGroup, dir: string, dataDir: string): Promise<BackfilledPrometheus> {
  const port = await freePort();
  const configFile = join(dir, 'prometheus.yml');
  writeFileSync(configFile, stringify({ global: { scrape_interval: '30s', evaluation_interval: '30s' }, scrape_configs: [] }));
  group.start(
    'prometheus',
    'prometheus',
    [`--config.file=${configFile}`, `--storage.tsdb.path=${dataDir}`, '--storage.tsdb.retention.time=3650d', `--web.listen-address=127.0.0.1:${port}`],
    join(dir, 'prometheus.log'),
  );
  const url = `http://127.0.0.1:${port}`;
  await waitFor('Prometheus to open the backfilled TSDB', () => httpOk(`${url}/-/ready`), 120_000, 250);
  return { url };
}
