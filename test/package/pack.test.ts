import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The npm package as a user gets it: `npm pack`, then `npm install -g` of the tarball into a
 * throwaway prefix, then the installed `steadfast` binary. Dependencies come from the npm cache
 * that `npm ci` filled (--prefer-offline: the registry only for what the cache lacks).
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'realworld');
const INSTALL_TIMEOUT_MS = 240_000;
const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

let work = '';
let tarball = '';
let files: string[] = [];
let installed = '';

async function npm(args: string[], cwd: string): Promise<string> {
  const { stdout } = await run('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], { cwd, maxBuffer: 64 * 1024 * 1024, timeout: INSTALL_TIMEOUT_MS });
  return stdout;
}

async function steadfast(...args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(installed, args, { env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' }, timeout: 30_000 });
}

beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
  work = mkdtempSync(join(tmpdir(), 'steadfast-pack-'));
  // dist/ is already built (npm test builds it); the prepack script would only build it again.
  await npm(['pack', '--ignore-scripts', '--pack-destination', work], ROOT);
  tarball = join(work, `steadfast-${version}.tgz`);
  files = (await run('tar', ['-tzf', tarball], { maxBuffer: 16 * 1024 * 1024 })).stdout.split('\n').filter(Boolean);
  await npm(['install', '--global', '--prefix', join(work, 'prefix'), '--prefer-offline', tarball], work);
  installed = join(work, 'prefix', 'bin', 'steadfast');
}, INSTALL_TIMEOUT_MS + 60_000);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the npm package', () => {
  it('carries the compiled CLI, the agent\'s bundle, the rule files and the sim fixture, and no tests, sources, maps or benchmarks', () => {
    expect(files).toEqual(expect.arrayContaining(['package/bin/steadfast.js', 'package/dist/cli/main.js', 'package/dist/cli/agent.js', 'package/dist/agent.cjs', 'package/dist/agent.cjs.cache', 'package/rules/gpu.yml', 'package/rules/alertmanager.yml', 'package/sim/fixtures/nvidia-smi-a10g.xml']));
    const unwanted = files.filter((file) => /^package\/(test|bench)\//.test(file) || file.startsWith('package/dist/bench/') || file.endsWith('.map') || (file.endsWith('.ts') && !file.endsWith('.d.ts')));
    expect(unwanted).toEqual([]);
    expect(files.length).toBeLessThan(400);
  });

  it('installs a `steadfast` binary that prints the package version', async () => {
    const { stdout } = await steadfast('--version');
    expect(stdout.trim()).toBe(version);
  });

  it('installs without the test tree', () => {
    const tree = readdirSync(join(work, 'prefix', 'lib', 'node_modules', 'steadfast'));
    expect(tree).toEqual(expect.arrayContaining(['bin', 'dist', 'rules', 'package.json']));
    expect(tree).not.toContain('test');
  });

  it('runs one agent scrape of a fixture node from the installed tree', async () => {
    const { stdout } = await steadfast(
      'agent',
      '--once',
      '--node',
      'fixture-node',
      '--path.kmsg',
      join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'),
      '--nvidia-smi.xml',
      join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'),
      '--xid.state-file',
      join(work, 'xid-state.json'),
    );
    expect(stdout).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
    expect(stdout).toContain('steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"} 1');
    expect(stdout).toContain('steadfast_collector_success{collector="xid"} 1');
  });

  it('documents the controller from the installed tree', async () => {
    const { stdout } = await steadfast('controller', '--help');
    expect(stdout).toContain('Usage: steadfast controller');
    expect(stdout).toContain('--config');
  });
});
