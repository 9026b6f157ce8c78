import { execFile } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildFixtureNode } from '../../tryit/fixture-node.js';
import { StandInNvml } from '../../tryit/nvml/stand-in.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../tryit/processes.js';

/**
 * The container images: packaging/image/build.sh builds them with buildah into OCI archives.
 * No container runtime can start one here (crun may not set the rlimits it wants), so the test
 * does what a runtime does: reads the archive's index, manifest and config, unpacks the layers
 * in order into a directory, and starts the config's Entrypoint + Cmd there in a chroot, as the
 * config's User, with its Env and WorkingDir. The agent then answers a scrape of a fixture node,
 * and reads a stand-in libnvidia-ml.so.1 (tryit/nvml/stand-in.c, built here with cc; glibc is all
 * it needs) copied into the image's root, through the koffi the image carries, as it reads the
 * driver's library that the NVIDIA container toolkit or a hostPath mounts into a pod.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'realworld');
const BUILD_TIMEOUT_MS = 480_000;
/** chroot(1), by its path here: the image's own PATH is what the command inside it gets. */
const CHROOT = '/usr/sbin/chroot';
/** The agent image, compressed as a registry stores it: Node.js with its libraries (ICU's data is most of it) and the agent. */
const AGENT_IMAGE_MAX_BYTES = 60 * 1024 * 1024;
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

interface Descriptor {
  readonly digest: string;
  readonly size: number;
  readonly mediaType: string;
  readonly annotations?: Record<string, string>;
}
interface ImageConfig {
  readonly config: { User?: string; Entrypoint?: string[]; Cmd?: string[] | null; Env?: string[]; WorkingDir?: string; ExposedPorts?: Record<string, object> };
}
interface Image {
  readonly name: string;
  readonly layers: readonly Descriptor[];
  readonly config: ImageConfig['config'];
  /** The layers unpacked in order: the image's root file system. */
  readonly root: string;
}

function blob(layout: string, digest: string): string {
  const [algorithm, hex] = digest.split(':');
  return join(layout, 'blobs', algorithm ?? '', hex ?? '');
}

/** Opens an OCI archive as a runtime would: its one manifest, config and layers, unpacked into `into`. */
async function openImage(archive: string, into: string): Promise<Image> {
  const layout = `${into}.layout`;
  mkdirSync(layout, { recursive: true });
  await run('tar', ['-xf', archive, '-C', layout]);
  const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as { manifests: Descriptor[] };
  expect(index.manifests).toHaveLength(1);
  const [entry] = index.manifests as [Descriptor];
  const manifest = JSON.parse(readFileSync(blob(layout, entry.digest), 'utf8')) as { config: Descriptor; layers: Descriptor[] };
  const config = JSON.parse(readFileSync(blob(layout, manifest.config.digest), 'utf8')) as ImageConfig;
  mkdirSync(into, { recursive: true });
  for (const layer of manifest.layers) {
    expect(layer.mediaType).toBe('application/vnd.oci.image.layer.v1.tar+gzip');
    await run('tar', ['--numeric-owner', '-xzpf', blob(layout, layer.digest), '-C', into]);
    // A whiteout (.wh.NAME) removes NAME from the layers below; these images have none.
    const { stdout } = await run('find', [into, '-name', '.wh.*']);
    expect(stdout).toBe('');
  }
  return { name: entry.annotations?.['org.opencontainers.image.ref.name'] ?? '', layers: manifest.layers, config: config.config, root: into };
}

/** The config's Entrypoint + Cmd, run in a chroot of the image as its User, with its Env only. */
function imageCommand(image: Image, args: readonly string[]): { command: string; args: string[]; env: NodeJS.ProcessEnv } {
  const user = image.config.User ?? '0:0';
  const [uid = '0', gid = uid] = user.split(':');
  const env = Object.fromEntries((image.config.Env ?? []).map((line) => [line.slice(0, line.indexOf('=')), line.slice(line.indexOf('=') + 1)]));
  // chroot(1) changes to / in the new root; the images' WorkingDir is / as well.
  expect(image.config.WorkingDir ?? '/').toBe('/');
  return { command: CHROOT, args: [`--userspec=${uid}:${gid}`, `--groups=${gid}`, image.root, ...(image.config.Entrypoint ?? []), ...args], env };
}

async function runImage(image: Image, args: readonly string[]): Promise<string> {
  const { command, args: argv, env } = imageCommand(image, args);
  return (await run(command, argv, { env, timeout: 60_000 })).stdout;
}

function megabytes(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`;
}

function treeBytes(dir: string): number {
  let total = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += treeBytes(path);
    else if (entry.isFile()) total += statSync(path).size;
  }
  return total;
}

const processes = new ProcessGroup();
let work = '';
let agent: Image;
let controller: Image;

beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist', 'agent.cjs'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
  if (process.getuid?.() !== 0) throw new Error('the image test needs root (the Debian root, buildah storage, chroot): run npm test as root');
  work = mkdtempSync(join(tmpdir(), 'steadfast-image-test-'));
  const { stdout } = await run(join(ROOT, 'packaging', 'image', 'build.sh'), ['--out', work, '--no-build'], {
    cwd: ROOT,
    timeout: BUILD_TIMEOUT_MS,
    maxBuffer: 16 * 1024 * 1024,
  });
  const archives = stdout.trim().split('\n');
  expect(archives.map((path) => relative(work, path))).toEqual(['steadfast-agent-0.1.0.oci.tar', 'steadfast-controller-0.1.0.oci.tar']);
  agent = await openImage(archives[0] as string, join(work, 'agent'));
  controller = await openImage(archives[1] as string, join(work, 'controller'));
  for (const [image, archive] of [
    [agent, archives[0]],
    [controller, archives[1]],
  ] as const) {
    const compressed = image.layers.reduce((sum, layer) => sum + layer.size, 0);
    process.stdout.write(
      `image ${image.name}: ${megabytes(compressed)} compressed (layers ${image.layers.map((layer) => megabytes(layer.size)).join(' + ')}), ${megabytes(treeBytes(image.root))} unpacked, archive ${megabytes(statSync(archive as string).size)}\n`,
    );
  }
}, BUILD_TIMEOUT_MS + 60_000);

afterAll(async () => {
  await processes.stopAll();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the agent image', () => {
  it('is named steadfast-agent:VERSION, runs the agent-only command as user 65532 and stays small', () => {
    expect(agent.name).toBe('steadfast-agent:0.1.0');
    expect(agent.config.Entrypoint).toEqual(['/usr/bin/node', '/usr/lib/steadfast-agent/bin/steadfast-agent.cjs']);
    expect(agent.config.User).toBe('65532:65532');
    expect(Object.keys(agent.config.ExposedPorts ?? {})).toEqual(['9401/tcp']);
    // Two layers: the Node.js runtime, which the controller image shares, then the agent.
    expect(agent.layers).toHaveLength(2);
    expect(agent.layers[0]?.digest).toBe(controller.layers[0]?.digest);
    expect(agent.layers.reduce((sum, layer) => sum + layer.size, 0)).toBeLessThan(AGENT_IMAGE_MAX_BYTES);
  });

  it('has Node.js from Debian and nothing to run besides it: no shell, no package manager, no coreutils', () => {
    for (const path of [
      'bin/sh',
      'usr/bin/sh',
      'usr/bin/bash',
      'usr/bin/dash',
      'usr/bin/apt',
      'usr/bin/apt-get',
      'usr/bin/dpkg',
      'usr/bin/ls',
      'usr/bin/env',
      'usr/bin/perl',
    ]) {
      expect(existsSync(join(agent.root, path)), path).toBe(false);
    }
    expect(readdirSync(join(agent.root, 'usr', 'bin'))).toEqual(['node']);
    expect(readFileSync(join(agent.root, 'usr', 'share', 'doc', 'nodejs', 'copyright'), 'utf8')).toMatch(/Node\.js|nodejs/i);
  });

  it('carries koffi with its glibc binary for this architecture alone, and reads the GPUs through NVML from a libnvidia-ml.so.1 mounted into it', async () => {
    const modules = join(agent.root, 'usr', 'lib', 'steadfast-agent', 'node_modules');
    const natives = readdirSync(modules, { recursive: true, encoding: 'utf8' }).filter((path) => /\.node$|musl/.test(path));
    expect(natives).toEqual([`@koromix/koffi-linux-${process.arch}/linux_${process.arch}/koffi.node`]);
    expect(existsSync(join(modules, 'koffi', 'LICENSE.txt'))).toBe(true);
    const node = buildFixtureNode(join(agent.root, 'nvml-node'));
    await StandInNvml.create(join(agent.root, 'nvml'), NVML_STATE);
    copyFileSync(join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'), join(agent.root, 'nvml-node', 'kern.log'));
    await run('chmod', ['-R', 'a+rX', join(agent.root, 'nvml'), join(agent.root, 'nvml-node')]);
    const inImage = (path: string): string => `/${relative(agent.root, path)}`;
    const text = await runImage(agent, [
      '--once',
      '--node=image-node',
      `--path.sysfs=${inImage(node.sysfs)}`,
      `--path.procfs=${inImage(node.procfs)}`,
      '--path.kmsg=/nvml-node/kern.log',
      '--xid.state-file=/tmp/nvml-xid-state.json',
      '--gpu.source=nvml',
      '--gpu.nvml-library=/nvml/libnvidia-ml.so.1',
    ]);
    expect(text).toContain('steadfast_gpu_temperature_celsius{gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"} 37');
    expect(text).toMatch(/^steadfast_gpu_source_info\{source="nvml"\} 1$/m);
  });

  it('carries the V8 code cache its own node made for the agent bundle, root-owned and read-only to others, and uses it where unpacked', async () => {
    const version = (await runImage(agent, ['--version'])).trim();
    expect(version).toMatch(/^\d+\.\d+\.\d+/);
    const node = (await run(CHROOT, [agent.root, '/usr/bin/node', '--version'])).stdout.trim();
    expect(node).toMatch(/^v20\./);
    const dir = join(agent.root, 'var', 'cache', 'steadfast-agent');
    const caches = readdirSync(dir);
    expect(caches).toHaveLength(1);
    expect(caches[0]).toMatch(new RegExp(`^agent-${node.replaceAll('.', '\\.')}-[0-9a-f]{32}\\.cache$`));
    const stats = statSync(join(dir, caches[0] as string));
    expect([stats.uid, stats.mode & 0o777]).toEqual([0, 0o644]);
    // V8 takes it where the image is unpacked, a file system other than the build's: the cache's
    // name depends on the node build, not on where its binary lies.
    const status = JSON.parse(await runImage(agent, ['--code-cache-status'])) as { state: string; file: string };
    expect(status).toEqual({ state: 'used', file: `/var/cache/steadfast-agent/${caches[0] as string}` });
  });

  it('runs its entrypoint as user 65532 until the agent answers a scrape of a fixture node', async () => {
    const node = buildFixtureNode(join(agent.root, 'fixture'));
    const inImage = (path: string): string => `/${relative(agent.root, path)}`;
    copyFileSync(join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'), join(agent.root, 'fixture', 'kern.log'));
    await run('chmod', ['-R', 'a+rX', join(agent.root, 'fixture')]);
    const port = await freePort();
    const { command, args, env } = imageCommand(agent, [
      `--web.listen-address=127.0.0.1:${port}`,
      '--node=image-node',
      `--path.sysfs=${inImage(node.sysfs)}`,
      `--path.procfs=${inImage(node.procfs)}`,
      '--path.kmsg=/fixture/kern.log',
      `--nvidia-smi.xml=${inImage(node.nvidiaSmiXml)}`,
      '--xid.state-file=/tmp/xid-state.json',
      '--web.insecure',
    ]);
    const child = processes.start('image-agent', command, args, join(work, 'image-agent.log'), { env: { ...env, STEADFAST_LOG_LEVEL: 'warn' } });
    const url = `http://127.0.0.1:${port}/metrics`;
    await waitFor('the agent in the image to serve /metrics', () => httpOk(url), 30_000);
    const text = await (await fetch(url)).text();
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    expect(text).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
    expect(text).toMatch(/^steadfast_rdma_port_state\{/m);
    // Every one of its ids is the image's user: real, effective, saved and file system.
    const status = readFileSync(`/proc/${child.pid ?? 0}/status`, 'utf8');
    expect(status).toMatch(/^Uid:\t65532\t65532\t65532\t65532$/m);
    expect(status).toMatch(/^Gid:\t65532\t65532\t65532\t65532$/m);
    expect(status).toMatch(/^CapEff:\t0000000000000000$/m);
  }, 60_000);
});

describe('the controller image', () => {
  it('runs the full steadfast command as user 65532, the controller by default', async () => {
    expect(controller.name).toBe('steadfast-controller:0.1.0');
    expect(controller.config.Entrypoint).toEqual(['/usr/bin/node', '/usr/lib/steadfast/bin/steadfast.js']);
    expect(controller.config.Cmd).toEqual(['controller', '--config', '/etc/steadfast/config/config.yaml']);
    expect(controller.config.User).toBe('65532:65532');
    expect(existsSync(join(controller.root, 'usr', 'lib', 'steadfast', 'node_modules', 'bullmq'))).toBe(true);
    expect(existsSync(join(controller.root, 'usr', 'lib', 'steadfast', 'node_modules', 'typescript'))).toBe(false);
    expect(existsSync(join(controller.root, 'bin', 'sh'))).toBe(false);
    expect((await runImage(controller, ['--version'])).trim()).toMatch(/^\d+\.\d+\.\d+/);
    // The controller's config check runs in the image: it loads the controller's code and its dependencies.
    const help = await runImage(controller, ['controller', '--help']);
    expect(help).toMatch(/--config/);
  });
});
