import { execFile, spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { once } from 'node:events';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml, stringify } from 'yaml';
import type { Controller } from '../../controller/service.js';
import { sdCommand } from '../../cli/sd.js';
import { rulesCommand } from '../../cli/rules.js';
import { slurmNode, startSlurm, type SlurmPart } from '../../tryit/parts.js';
import { ProcessGroup } from '../../tryit/processes.js';
import { runCli } from '../support/cli.js';
import { ALERTMANAGER_TOKEN, post, startController, testConfig, xidAlertPayload } from '../support/controller.js';
import { testRedis } from '../support/redis.js';
import { until } from '../support/until.js';

const run = promisify(execFile);
const ROOT = resolve(import.meta.dirname, '..', '..');
const PROMTOOL = process.env.PROMTOOL ?? 'promtool';

/** The shipped scrape config with its paths pointed into `dir`; returns the copy's path. */
function scrapeConfigCopy(shipped: string, dir: string, rulesDir: string, targets?: string): string {
  const config = parseYaml(readFileSync(join(ROOT, 'deploy', 'prometheus', shipped), 'utf8')) as {
    rule_files: string[];
    scrape_configs: Array<{ file_sd_configs?: Array<{ files: string[] }>; kubernetes_sd_configs?: unknown; static_configs?: unknown }>;
  };
  config.rule_files = [join(rulesDir, '*.yml')];
  for (const job of config.scrape_configs) {
    for (const sd of job.file_sd_configs ?? []) sd.files = [targets ?? ''];
    // Debian's promtool is built without Kubernetes discovery; the rest of the job (its
    // relabelling above all) is checked with a static target in its place.
    if (job.kubernetes_sd_configs) {
      delete job.kubernetes_sd_configs;
      job.static_configs = [{ targets: ['127.0.0.1:9401'] }];
    }
  }
  const path = join(dir, shipped);
  writeFileSync(path, stringify(config));
  return path;
}

/**
 * `steadfast sd slurm` against a real slurmctld whose nodes all sit at 127.0.0.1 (as nodes behind
 * one address, or scraped by IP, would): each target keeps its Slurm name as `node`, Prometheus
 * accepts the file and the shipped scrape configs, and an alert from such a target drains the node
 * its `node` label names, not whatever the address resolves to.
 */
describe('Prometheus file_sd targets from the Slurm node list', () => {
  const group = new ProcessGroup();
  const root = mkdtempSync(join(tmpdir(), 'steadfast-sd-slurm-'));
  const store = testRedis();
  let slurm: SlurmPart;
  let controller: Controller;
  let url: string;
  const targets = join(root, 'targets.json');
  const rulesDir = join(root, 'rules');

  beforeAll(async () => {
    slurm = await startSlurm(group, root, ['gpu-b2', 'gpu-b1']);
    ({ controller, url } = await startController(testConfig(store.url, store.prefix, { backend: { kind: 'slurm', slurm: { env: slurm.env } } })));
    expect((await runCli(rulesCommand(), ['--out', rulesDir])).exitCode).toBe(0);
  });
  afterAll(async () => {
    await controller.close();
    await store.cleanup();
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  });

  it('writes one target per Slurm node at its NodeAddr, labelled with the node name, sorted by name', async () => {
    const result = await runCli(sdCommand(), ['slurm', '--out', targets, '--slurm-conf', slurm.conf, '--port', '9411']);
    expect(result.stderr).toBe('');
    expect(result.exitCode).toBe(0);
    expect(JSON.parse(readFileSync(targets, 'utf8'))).toEqual([
      { targets: ['127.0.0.1:9411'], labels: { node: 'gpu-b1' } },
      { targets: ['127.0.0.1:9411'], labels: { node: 'gpu-b2' } },
    ]);
  });

  it('leaves the targets file as it was when sinfo fails, and says why', async () => {
    const before = readFileSync(targets, 'utf8');
    const result = await runCli(sdCommand(), ['slurm', '--out', targets, '--sinfo', join(root, 'no-such-sinfo')]);
    expect(result.exitCode).toBe(1);
    expect(result.stderr).toContain('no-such-sinfo failed');
    expect(readFileSync(targets, 'utf8')).toBe(before);
  });

  it('with --interval keeps the file current (here: restores it after it was removed) until SIGTERM, then exits 0', async () => {
    if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
    const kept = join(root, 'kept.json');
    const child = spawn(process.execPath, [join(ROOT, 'bin', 'steadfast.js'), 'sd', 'slurm', '--out', kept, '--slurm-conf', slurm.conf, '--interval', '1s'], {
      stdio: 'ignore',
    });
    const exited = once(child, 'exit');
    try {
      await until('the first targets file', async () => existsSync(kept), Boolean);
      const first = readFileSync(kept, 'utf8');
      unlinkSync(kept);
      await until('the targets file written again', async () => existsSync(kept), Boolean);
      expect(readFileSync(kept, 'utf8')).toBe(first);
    } finally {
      child.kill('SIGTERM');
    }
    expect(await exited).toEqual([0, null]);
  });

  it('refuses an interval that is no duration, naming the flag', async () => {
    const result = await runCli(sdCommand(), ['slurm', '--out', targets, '--interval', 'often']);
    expect(result.exitCode).toBe(2);
    expect(result.stderr).toContain("option '--interval <duration>' argument 'often' is invalid");
  });

  it('passes promtool check config: the Slurm scrape config with these targets, and the jobs and relabelling of the Kubernetes one', async () => {
    for (const config of [scrapeConfigCopy('slurm.yml', root, rulesDir, targets), scrapeConfigCopy('kubernetes.yml', root, rulesDir)]) {
      const { stdout } = await run(PROMTOOL, ['check', 'config', config]);
      expect(stdout).toContain('SUCCESS');
    }
  });

  it('drains the node named by the `node` label of an alert about a target scraped by IP address', async () => {
    const [first] = JSON.parse(readFileSync(targets, 'utf8')) as Array<{ targets: string[]; labels: { node: string } }>;
    const payload = xidAlertPayload();
    const alerts = payload.alerts as Array<{ labels: Record<string, string> }>;
    alerts[0] = { ...alerts[0], labels: { ...alerts[0]?.labels, node: first?.labels.node ?? '', instance: first?.targets[0] ?? '', job: 'steadfast-agent' } };
    expect((await post(`${url}/api/v1/alerts`, payload, ALERTMANAGER_TOKEN)).status).toBe(202);
    const drained = await until(
      'gpu-b1 drained',
      () => slurmNode(slurm, 'gpu-b1'),
      (node) => node.state.startsWith('drain'),
    );
    expect(drained.reason).toContain('Xid 79');
    expect((await slurmNode(slurm, 'gpu-b2')).state).toBe('idle~');
  });
});
