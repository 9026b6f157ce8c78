import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

/**
 * The controller's package and the try-it package as users get them: `npm pack` of the root
 * (the controller with the operator CLI) and scripts/stage-tryit.mjs (demo, lab, simulate, the
 * ETTR plot), installed from their tarballs into two throwaway projects: the controller alone,
 * and the try-it package with the controller it depends on. Dependencies come from the npm cache
 * that `npm ci` filled.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const INSTALL_TIMEOUT_MS = 240_000;
const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;

let work = '';
let controllerOnly = '';
let withTryit = '';

async function npm(args: string[], cwd: string): Promise<string> {
  const { stdout } = await run('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], {
    cwd,
    maxBuffer: 64 * 1024 * 1024,
    timeout: INSTALL_TIMEOUT_MS,
  });
  return stdout;
}

/** A project directory with the tarballs installed into it. */
async function project(name: string, tarballs: string[]): Promise<string> {
  const dir = join(work, name);
  await run('mkdir', ['-p', dir]);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, private: true }));
  await npm(['install', '--prefer-offline', ...tarballs], dir);
  return dir;
}

function steadfastIn(dir: string, args: string[], timeout = 30_000): Promise<{ stdout: string; stderr: string }> {
  return run(join(dir, 'node_modules', '.bin', 'steadfast'), args, {
    cwd: dir,
    env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' },
    timeout,
    maxBuffer: 16 * 1024 * 1024,
  });
}

beforeAll(
  async () => {
    if (!existsSync(join(ROOT, 'dist', 'tryit', 'cli', 'demo.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
    work = mkdtempSync(join(tmpdir(), 'steadfast-tryit-pack-'));
    await npm(['pack', '--ignore-scripts', '--pack-destination', work], ROOT);
    const tryitTarball = (await run(process.execPath, [join(ROOT, 'scripts', 'stage-tryit.mjs'), work])).stdout.trim();
    const tarball = join(work, `steadfast-${version}.tgz`);
    controllerOnly = await project('controller-only', [tarball]);
    withTryit = await project('with-tryit', [tarball, tryitTarball]);
  },
  INSTALL_TIMEOUT_MS * 2 + 60_000,
);

afterAll(() => {
  if (work) rmSync(work, { recursive: true, force: true });
});

describe("the controller's package", () => {
  it('installs none of the try-it tools and none of the plotting libraries', () => {
    const installed = join(controllerOnly, 'node_modules');
    for (const name of ['vega', 'vega-lite', '@resvg/resvg-js', 'steadfast-tryit']) expect(existsSync(join(installed, name)), name).toBe(false);
    expect(existsSync(join(installed, 'steadfast', 'dist', 'tryit'))).toBe(false);
    expect(existsSync(join(installed, 'steadfast', 'dist', 'controller', 'service.js'))).toBe(true);
  });

  it('says where `steadfast demo` comes from instead of failing on a missing module', async () => {
    const failed = await steadfastIn(controllerOnly, ['demo']).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(failed?.code).toBe(2);
    expect(failed?.stderr).toMatch(/^steadfast: steadfast demo is one of the try-it tools.*steadfast-tryit/);
    expect(failed?.stderr).not.toMatch(/\n\s+at /);
  });
});

describe('the try-it package', () => {
  it('runs the demo end to end on the real parts: the fatal Xid drains its node once', async () => {
    const { stdout } = await steadfastIn(withTryit, ['demo', '--grafana-out', join(work, 'grafana')], 180_000);
    expect(stdout).toMatch(/OK: node-\d+ drained exactly once/);
    expect(existsSync(join(work, 'grafana', 'dashboards'))).toBe(true);
  }, 200_000);

  it('draws the ETTR plot with its own plotting libraries', async () => {
    const plot = join(work, 'ettr.png');
    await steadfastIn(withTryit, ['simulate', 'ettr', '--plot', plot], 120_000);
    expect(readFileSync(plot).subarray(1, 4).toString()).toBe('PNG');
  }, 130_000);
});
