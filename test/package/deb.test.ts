import { execFile, type ChildProcess } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../core/config.js';
import { startRedis } from '../../tryit/parts.js';
import { StandInNvml } from '../../tryit/nvml/stand-in.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../tryit/processes.js';
import { DebianRoot, settle, type Result } from './debian-root.js';

/**
 * The Debian packages as an operator gets them. packaging/debian/build.sh builds steadfast-agent
 * and steadfast; lintian checks both; they are installed with `apt install ./x.deb` into a Debian
 * trixie root whose Node.js is Debian's (scripts/debian-root.sh, cached as a tarball in the temp
 * area). systemd is not PID 1 there, so each unit's ExecStart is run the way systemd would run it:
 * as its User= and Group=, with its capabilities, no new privileges, its umask, its
 * StateDirectory= made, and its Environment= and EnvironmentFile= read (test/package/debian-root.ts).
 * The installed agent reads a stand-in libnvidia-ml.so.1 (tryit/nvml/stand-in.c, built on this
 * machine with cc; it needs only glibc) through koffi. Then `apt purge` of both must leave the root
 * as it was but for the system user and the package manager's own records.
 */

const run = promisify(execFile);
const REPO = join(import.meta.dirname, '..', '..');
const FIXTURES = join(REPO, 'test', 'fixtures', 'realworld');
const SUITE = 'trixie';
/** Installed before the packages, so that apt resolves their Depends and Recommends offline. */
const ROOT_PACKAGES = ['nodejs', 'adduser', 'redis-server'];
const BUILD_TIMEOUT_MS = 300_000;
const ROOT_TIMEOUT_MS = 600_000;
/** The bundle (about 1 MB) and koffi with its one binary (about 1.3 MB). */
const AGENT_MAX_INSTALLED_KIB = 3 * 1024;
/** koffi's binary for this machine's glibc, the one native object either package keeps of koffi's. */
const KOFFI_BINARY = `node_modules/@koromix/koffi-linux-${process.arch}/linux_${process.arch}/koffi.node`;
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
/** Node.js flags an operator sets in agent.env (STEADFAST_NODE_FLAGS); the agent sets its own V8 flags besides. */
const NODE_FLAGS = '--max-semi-space-size=2 --stack-size=900';
const UNIT_DIR = '/usr/lib/systemd/system';
const AGENT_UNIT = `${UNIT_DIR}/steadfast-agent.service`;
const CONTROLLER_UNIT = `${UNIT_DIR}/steadfast-controller.service`;
/**
 * Where a purge may leave new files: the package manager's records, the kept user's backups, and
 * systemd's runtime markers that the system's own tools write under /run (trixie's util-linux
 * writes run/systemd/systemd-units-load where no systemd runs), a tmpfs emptied at every boot.
 */
const BOOKKEEPING = [
  /^(var\/)?run\/systemd\//,
  /^var\/lib\/dpkg\//,
  /^var\/lib\/apt\//,
  /^var\/log\//,
  /^var\/cache\/apt\//,
  /^var\/cache\/debconf\//,
  /^var\/cache\/ldconfig\//,
  /^etc\/(passwd|group|shadow|gshadow|subuid|subgid)-$/,
];

let work = '';
let root = '';
let unpacked = '';
let agentDeb = '';
let controllerDeb = '';
let filesBefore = new Set<string>();
let installLog = '';
const processes = new ProcessGroup();

let debian: DebianRoot;
const inRootArgs = (argv: readonly string[]): string[] => debian.args(argv);
const inRoot = (argv: readonly string[], timeout?: number): Promise<Result> => debian.run(argv, timeout);
const inRootOk = (argv: readonly string[], timeout?: number): Promise<string> => debian.ok(argv, timeout);
const rootFiles = (): Set<string> => debian.files();
const unitCommand = (unitPath: string, command?: readonly string[]): Promise<string[]> => debian.unitCommand(unitPath, command);
const processesInRoot = (): string[] => debian.processes();

const units = new Map<string, ChildProcess>();

/** Starts what a unit runs, in the root, as a child of this test. */
async function startUnit(name: string, unitPath: string): Promise<ChildProcess> {
  const child = processes.start(name, 'unshare', inRootArgs(await unitCommand(unitPath)), join(work, `${name}.log`));
  units.set(name, child);
  return child;
}

/** The pid, as this machine sees it, of the process a started unit runs (PID 1 of its namespace). */
function unitPid(child: ChildProcess): number {
  const children = readFileSync(`/proc/${child.pid}/task/${child.pid}/children`, 'utf8').trim().split(/\s+/);
  return Number(children[0]);
}

/**
 * Stops a started unit. setpriv's change of user clears the parent-death signal that unshare's
 * --kill-child set, so the unit's process, PID 1 of its namespace, is killed itself; the
 * namespace, and unshare with it, end.
 */
async function stopUnit(name: string): Promise<void> {
  const child = units.get(name);
  units.delete(name);
  if (!child || child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  try {
    process.kill(unitPid(child), 'SIGKILL');
  } catch {
    // Gone already, or never started: unshare is stopped below either way.
  }
  await Promise.race([exited, new Promise((resolve) => setTimeout(resolve, 5_000))]);
  await processes.stop(name, 0, 'SIGKILL');
}

/** Replaces `KEY=...` in one of the root's env files, as an operator edits a conffile. */
function setEnvironment(file: string, key: string, value: string): void {
  const path = join(root, file);
  const lines = readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => !line.startsWith(`${key}=`));
  writeFileSync(path, `${lines.join('\n').trimEnd()}\n${key}="${value}"\n`);
}

function rootRead(path: string): string {
  return readFileSync(join(root, path), 'utf8');
}

/** What the agent started from its unit must show: a scrape of the fixtures, its confinement, its token. */
async function checkAgent(agent: ChildProcess, port: number): Promise<void> {
  const url = `http://127.0.0.1:${port}`;
  await waitFor(
    'the installed agent to serve /metrics',
    () => httpOk(`${url}/metrics`),
    30_000,
    100,
    async () => readFileSync(join(work, 'agent.log'), 'utf8'),
  );
  const text = await (await fetch(`${url}/metrics`)).text();
  expect(text).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
  expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
  // The package records the commit it was built from; the agent labels its build info with it.
  const revision = rootRead('usr/lib/steadfast-agent/REVISION').trim();
  await run('git', ['cat-file', '-e', `${revision}^{commit}`], { cwd: REPO });
  expect(text).toMatch(new RegExp(`^steadfast_build_info\\{[^}]*revision="${revision}"[^}]*\\} 1$`, 'm'));

  // What ran is what the unit describes: user steadfast, CAP_SYSLOG and CAP_SYS_PTRACE only.
  const status = readFileSync(`/proc/${unitPid(agent)}/status`, 'utf8');
  const uid = (await inRootOk(['id', '-u', 'steadfast'])).trim();
  const [CAP_SYS_PTRACE, CAP_SYSLOG] = [19n, 34n];
  const capMask = ((1n << CAP_SYSLOG) | (1n << CAP_SYS_PTRACE)).toString(16).padStart(16, '0');
  expect(status).toMatch(new RegExp(`^Uid:\\s+${uid}\\s+${uid}\\s`, 'm'));
  expect(status).toMatch(new RegExp(`^CapEff:\\s+${capMask}$`, 'm'));
  expect(status).toMatch(new RegExp(`^CapBnd:\\s+${capMask}$`, 'm'));
  expect(status).toMatch(/^NoNewPrivs:\s+1$/m);

  const post = (token?: string) =>
    fetch(`${url}/api/v1/training`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(token ? { authorization: `Bearer ${token}` } : {}) },
      body: '{}',
    });
  expect((await post()).status).toBe(401);
  expect((await post('not-the-token')).status).toBe(401);
  expect([400, 422]).toContain((await post(rootRead('etc/steadfast/agent-web-token'))).status);
}

beforeAll(
  async () => {
    if (!existsSync(join(REPO, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
    work = mkdtempSync(join(tmpdir(), 'steadfast-deb-'));
    root = join(work, 'root');
    debian = new DebianRoot(root);
    const building = run(join(REPO, 'packaging', 'debian', 'build.sh'), ['--out', join(work, 'debs'), '--no-build'], {
      cwd: REPO,
      timeout: BUILD_TIMEOUT_MS,
      maxBuffer: 16 * 1024 * 1024,
    });
    // The root is made (or unpacked from its cached tarball) while the packages build.
    const rooting = run(join(REPO, 'scripts', 'debian-root.sh'), [SUITE, root, ...ROOT_PACKAGES], { timeout: ROOT_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 });
    const [{ stdout }] = await Promise.all([building, rooting]);
    [agentDeb, controllerDeb] = stdout.trim().split('\n').slice(-2) as [string, string];
    unpacked = join(work, 'unpacked');
    for (const deb of [agentDeb, controllerDeb]) await run('dpkg', ['-x', deb, unpacked]);

    filesBefore = rootFiles();
    mkdirSync(join(root, 'tmp', 'debs'), { recursive: true });
    mkdirSync(join(root, 'tmp', 'fixtures'), { recursive: true });
    for (const deb of [agentDeb, controllerDeb]) copyFileSync(deb, join(root, 'tmp', 'debs', deb.split('/').at(-1) as string));
    copyFileSync(join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'), join(root, 'tmp', 'fixtures', 'fatal-kern.log'));
    copyFileSync(join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'), join(root, 'tmp', 'fixtures', 'nvidia-smi.xml'));
    writeFileSync(join(root, 'tmp', 'fixtures', 'healthy-kern.log'), '[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n');
    for (const dir of ['debs', 'fixtures']) {
      chmodSync(join(root, 'tmp', dir), 0o755);
      for (const file of readdirSync(join(root, 'tmp', dir))) chmodSync(join(root, 'tmp', dir, file), 0o644);
    }
    // As an operator does: the agent's package on a node, the controller's beside it here.
    for (const deb of [agentDeb, controllerDeb]) {
      const installed = await inRoot(['apt', 'install', '--yes', `/tmp/debs/${deb.split('/').at(-1)}`], 180_000);
      if (installed.code !== 0) throw new Error(`apt install ${deb} exited ${installed.code}: ${installed.stderr}${installed.stdout}`);
      installLog += `${installed.stdout}${installed.stderr}`;
    }
  },
  BUILD_TIMEOUT_MS + ROOT_TIMEOUT_MS + 240_000,
);

afterAll(async () => {
  for (const name of [...units.keys()]) await stopUnit(name);
  await processes.stopAll();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the Debian packages', () => {
  it("builds steadfast-agent and steadfast for this architecture (both carry koffi's binary), both on Node.js 20.10 or later, with no file in both", async () => {
    const agent = (await run('dpkg-deb', ['-f', agentDeb])).stdout;
    const arch = (await run('dpkg', ['--print-architecture'])).stdout.trim();
    expect(agent).toMatch(/^Package: steadfast-agent$/m);
    expect(agent).toMatch(new RegExp(`^Architecture: ${arch}$`, 'm'));
    expect(agent).toMatch(/^Depends: nodejs \(>= 20\.10\), adduser, libc6 /m);
    const controller = (await run('dpkg-deb', ['-f', controllerDeb])).stdout;
    expect(controller).toMatch(/^Package: steadfast$/m);
    expect(controller).toMatch(new RegExp(`^Architecture: ${arch}$`, 'm'));
    expect(controller).toMatch(/^Depends: nodejs \(>= 20\.10\), adduser, libc6 /m);
    // A controller host is seldom a GPU node: the agent is only suggested.
    expect(controller).toMatch(/^Suggests: .*steadfast-agent/m);
    expect(controller).not.toMatch(/^(Depends|Recommends): .*steadfast-agent/m);
    expect(agent).toMatch(/^Maintainer: steadfast maintainers <maintainers@steadfast\.dev>$/m);

    const conffiles = async (deb: string) => (await run('dpkg-deb', ['-I', deb, 'conffiles'])).stdout.split('\n').filter(Boolean).sort();
    expect(await conffiles(agentDeb)).toEqual(['/etc/steadfast/agent.env']);
    expect(await conffiles(controllerDeb)).toEqual(['/etc/steadfast/controller.env', '/etc/steadfast/controller.yaml']);

    const files = async (deb: string) =>
      (await run('dpkg-deb', ['-c', deb], { maxBuffer: 64 * 1024 * 1024 })).stdout
        .split('\n')
        .filter((line) => line.startsWith('-') || line.startsWith('l'))
        .map((line) => line.split(/\s+/).at(5) as string);
    const agentFiles = await files(agentDeb);
    const controllerFiles = await files(controllerDeb);
    expect(agentFiles.filter((path) => controllerFiles.includes(path))).toEqual([]);
    expect(agentFiles).toEqual(
      expect.arrayContaining([
        './usr/bin/steadfast-agent',
        './usr/lib/steadfast-agent/bin/steadfast-agent.cjs',
        './usr/lib/steadfast-agent/dist/agent.cjs',
        './usr/lib/steadfast-agent/slurm/prolog.sh',
        `.${AGENT_UNIT}`,
        './usr/share/doc/steadfast-agent/copyright',
        './usr/share/doc/steadfast-agent/changelog.Debian.gz',
        './usr/share/man/man1/steadfast-agent.1.gz',
      ]),
    );
    expect(controllerFiles).toEqual(
      expect.arrayContaining([
        './usr/bin/steadfast',
        './usr/lib/steadfast/bin/steadfast.js',
        './usr/lib/steadfast/dist/cli/main.js',
        './usr/lib/steadfast/rules/xid.yml',
        `.${CONTROLLER_UNIT}`,
        './usr/share/doc/steadfast/copyright',
        './usr/share/man/man1/steadfast.1.gz',
      ]),
    );
    // No shipped V8 code cache (each node makes its own), no tests, no source maps, no units in /lib.
    expect(
      [...agentFiles, ...controllerFiles].filter((path) => /\.cache$|\.map$|^\.\/lib\/|\/dist\/bench\/|^\.\/usr\/lib\/steadfast\/test\//.test(path)),
    ).toEqual([]);
  });

  it("keeps the agent package at most 3 MB installed, its one native object koffi's glibc build for this architecture, stripped; the controller keeps the same of koffi's", async () => {
    const installedKib = Number((await run('dpkg-deb', ['-f', agentDeb, 'Installed-Size'])).stdout.trim());
    expect(installedKib).toBeGreaterThan(0);
    expect(installedKib).toBeLessThanOrEqual(AGENT_MAX_INSTALLED_KIB);
    const natives = async (deb: string) =>
      (await run('dpkg-deb', ['-c', deb], { maxBuffer: 64 * 1024 * 1024 })).stdout
        .split('\n')
        .map((line) => line.split(/\s+/).at(5) ?? '')
        .filter((path) => /\.(node|so|bare)$|musl|darwin|win32/.test(path));
    expect(await natives(agentDeb)).toEqual([`./usr/lib/steadfast-agent/${KOFFI_BINARY}`]);
    expect((await natives(controllerDeb)).filter((path) => path.includes('koffi'))).toEqual([`./usr/lib/steadfast/${KOFFI_BINARY}`]);
    expect((await run('readelf', ['-S', join(unpacked, 'usr', 'lib', 'steadfast-agent', KOFFI_BINARY)])).stdout).not.toMatch(/\.symtab|\.comment/);
    // koffi's MIT licence, in the copyright file's paragraph for its files.
    const copyright = readFileSync(join(unpacked, 'usr', 'share', 'doc', 'steadfast-agent', 'copyright'), 'utf8');
    expect(copyright).toMatch(/^Files: usr\/lib\/steadfast-agent\/node_modules\/koffi\/\*\nCopyright: [^\n]*Niels Martignène[^\n]*\nLicense: Expat$/m);
    expect(copyright).toMatch(/^License: Expat\n Permission is hereby granted/m);
  });

  it('passes lintian with no error and no warning that is not overridden, each override justified by a comment', async () => {
    const { stdout, stderr } = await settle(run('lintian', ['--show-overrides', agentDeb, controllerDeb], { timeout: 180_000, maxBuffer: 64 * 1024 * 1024 }));
    const lines = `${stdout}\n${stderr}`.split('\n');
    expect(lines.filter((line) => /^[EW]: /.test(line))).toEqual([]);
    for (const pkg of ['steadfast', 'steadfast-agent']) {
      const overrides = readFileSync(join(REPO, 'packaging', 'debian', pkg, 'lintian-overrides'), 'utf8').split('\n');
      overrides.forEach((line, index) => {
        if (line.startsWith(`${pkg}: `)) expect(overrides[index - 1], `override without a justification: ${line}`).toMatch(/^#/);
      });
    }
  }, 200_000);

  it('has systemd units that systemd-analyze verifies without a warning', async () => {
    // The units refer to this machine's (network-online.target, ...) and to their manual pages.
    const units = join(unpacked, 'usr', 'lib', 'systemd', 'system');
    cpSync('/usr/lib/systemd/system', units, { recursive: true, force: false, errorOnExist: false });
    const { stdout, stderr } = await run('systemd-analyze', ['verify', `--root=${unpacked}`, AGENT_UNIT, CONTROLLER_UNIT], {
      env: { ...process.env, MANPATH: join(unpacked, 'usr', 'share', 'man') },
    });
    expect(`${stdout}${stderr}`).toBe('');
  });

  it('confines both units: systemd rates the agent at most 3.0 and the controller at most 2.0 exposed, the agent holding only CAP_SYSLOG and CAP_SYS_PTRACE', async () => {
    // --threshold is the exposure level times ten; systemd-analyze exits non-zero above it.
    await run('systemd-analyze', ['security', '--offline=true', '--threshold=30', `--root=${unpacked}`, AGENT_UNIT]);
    await run('systemd-analyze', ['security', '--offline=true', '--threshold=20', `--root=${unpacked}`, CONTROLLER_UNIT]);
    const agentUnit = readFileSync(join(unpacked, AGENT_UNIT), 'utf8');
    expect(agentUnit).toMatch(/^CapabilityBoundingSet=CAP_SYSLOG CAP_SYS_PTRACE$/m);
    expect(agentUnit).toMatch(/^User=steadfast$/m);
    expect(agentUnit).toMatch(/^ExecStart=\/usr\/bin\/steadfast-agent \$STEADFAST_AGENT_ARGS$/m);
    // The code cache must stay root's: a CacheDirectory= would hand it to the agent's user.
    expect(agentUnit).not.toMatch(/^CacheDirectory=/m);
    // The agent sets its own V8 flags; the unit passes none, and an operator's come from agent.env.
    expect(agentUnit).not.toMatch(/^Environment="?STEADFAST_NODE_FLAGS=/m);
  });

  it('ships a controller config that the controller accepts, naming the credentials the package makes', () => {
    const config = loadConfig({ file: join(unpacked, 'etc', 'steadfast', 'controller.yaml'), env: {} });
    expect(config.backend.kind).toBe('dry-run');
    expect(config.controller.auth).toEqual({
      operatorTokenFile: '/etc/steadfast/operator-token',
      readOnlyTokenFile: '/etc/steadfast/read-only-token',
      alertmanagerTokenFile: '/etc/steadfast/alertmanager-token',
      agentSecretFile: '/etc/steadfast/agent-secret',
    });
    expect(config.agents.secretFile).toBe('/etc/steadfast/agent-web-secret');
  });

  it('installs with apt into a Debian root with its own Node.js, making the user, the credentials (root:steadfast 0640), and the agent code cache for that Node.js', async () => {
    expect(installLog).toMatch(/Setting up steadfast-agent \(/);
    expect(installLog).toMatch(/Setting up steadfast \(/);
    // The code cache was written: the postinst warns when it cannot.
    expect(installLog).not.toMatch(/steadfast-agent: warning/);
    expect(await inRootOk(['node', '--version'])).toMatch(/^v(2[1-9]|20\.(1\d|[2-9]\d))\./);
    const group = (await inRootOk(['getent', 'group', 'steadfast'])).split(':')[2];
    for (const secret of ['agent-web-token', 'operator-token', 'read-only-token', 'alertmanager-token', 'agent-secret', 'agent-web-secret']) {
      const stats = statSync(join(root, 'etc', 'steadfast', secret));
      expect({ secret, mode: (stats.mode & 0o777).toString(8), uid: stats.uid, gid: String(stats.gid) }).toEqual({ secret, mode: '640', uid: 0, gid: group });
      expect(rootRead(`etc/steadfast/${secret}`)).toMatch(/^[0-9a-f]{64}$/);
    }
    // Enabled for the next boot, as Debian does for a daemon (no systemd runs here to start it).
    // (deb-systemd-helper names the unit by /lib, which is /usr/lib's alias on merged-/usr systems.)
    for (const unit of ['steadfast-agent.service', 'steadfast-controller.service']) {
      expect(readlinkSync(join(root, 'etc', 'systemd', 'system', 'multi-user.target.wants', unit))).toMatch(new RegExp(`^(/usr)?/lib/systemd/system/${unit}$`));
    }
    // The agent, started as its unit starts it, compiles from the cache the postinst wrote.
    const status = await inRootOk(await unitCommand(AGENT_UNIT, ['/usr/bin/steadfast-agent', '--code-cache-status']));
    expect(JSON.parse(status)).toMatchObject({ state: 'used', file: expect.stringMatching(/^\/var\/cache\/steadfast-agent\/agent-.*\.cache$/) });
  });

  it('runs the agent as its unit does, with the options and node flags of agent.env, until it answers a scrape; its POST endpoints take only the generated token', async () => {
    const port = await freePort();
    // The operator's edit of the conffile: this node's name, and the test's kernel log and GPUs.
    setEnvironment(
      'etc/steadfast/agent.env',
      'STEADFAST_AGENT_ARGS',
      `--web.listen-address=127.0.0.1:${port} --web.token-file=/etc/steadfast/agent-web-token --node deb-node --path.kmsg=/tmp/fixtures/fatal-kern.log --nvidia-smi.xml=/tmp/fixtures/nvidia-smi.xml`,
    );
    setEnvironment('etc/steadfast/agent.env', 'STEADFAST_NODE_FLAGS', NODE_FLAGS);
    const agent = await startUnit('agent', AGENT_UNIT);
    try {
      await checkAgent(agent, port);
      // /usr/bin/steadfast-agent execs node in its own process, with the operator's flags first.
      expect(
        readFileSync(`/proc/${unitPid(agent)}/cmdline`, 'utf8')
          .split('\0')
          .slice(0, 4),
      ).toEqual(['node', ...NODE_FLAGS.split(' '), '/usr/lib/steadfast-agent/bin/steadfast-agent.cjs']);
    } finally {
      await stopUnit('agent');
    }
  });

  it('reads the GPUs through NVML with the koffi each package carries: the agent as its unit runs it, and `steadfast agent`', async () => {
    const nvml = await StandInNvml.create(join(root, 'tmp', 'nvml'), NVML_STATE);
    await run('chmod', ['-R', 'a+rX', nvml.dir]);
    const args = [
      '--once',
      '--node',
      'deb-node',
      '--path.kmsg',
      '/tmp/fixtures/fatal-kern.log',
      '--gpu.source',
      'nvml',
      '--gpu.nvml-library',
      '/tmp/nvml/libnvidia-ml.so.1',
    ];
    const agent = await inRootOk(await unitCommand(AGENT_UNIT, ['/usr/bin/steadfast-agent', ...args, '--xid.state-file', '/tmp/nvml-agent-xid.json']));
    const full = await inRootOk(['steadfast', 'agent', ...args, '--xid.state-file', '/tmp/nvml-full-xid.json']);
    for (const text of [agent, full]) {
      expect(text).toContain('steadfast_gpu_temperature_celsius{gpu="0",pci_bus_id="0000:00:06",UUID="GPU-00000000-0000-0000-0000-000000000000"} 37');
      expect(text).toMatch(/^steadfast_gpu_source_info\{source="nvml"\} 1$/m);
    }
  });

  it('runs the controller as its unit does against Redis, answering /healthz and the operator token the package made', async () => {
    const redis = await startRedis(processes, work);
    const [port, metricsPort] = [await freePort(), await freePort()];
    setEnvironment('etc/steadfast/controller.env', 'STEADFAST_REDIS__URL', redis.url);
    setEnvironment('etc/steadfast/controller.env', 'STEADFAST_CONTROLLER__PORT', String(port));
    setEnvironment('etc/steadfast/controller.env', 'STEADFAST_CONTROLLER__METRICS__PORT', String(metricsPort));
    await startUnit('controller', CONTROLLER_UNIT);
    try {
      const url = `http://127.0.0.1:${port}`;
      await waitFor(
        'the installed controller to answer /healthz',
        () => httpOk(`${url}/healthz`),
        30_000,
        100,
        async () => readFileSync(join(work, 'controller.log'), 'utf8'),
      );
      expect((await fetch(`${url}/api/v1/holds`)).status).toBe(401);
      const answer = await fetch(`${url}/api/v1/holds`, { headers: { authorization: `Bearer ${rootRead('etc/steadfast/operator-token')}` } });
      expect(answer.status).toBe(200);
      expect(await httpOk(`http://127.0.0.1:${metricsPort}/metrics`)).toBe(true);
    } finally {
      await stopUnit('controller');
      await processes.stop('redis');
    }
  });

  it('stops the controller with one line naming a credential file that is missing, exit 2, which the unit does not restart', async () => {
    const token = join(root, 'etc', 'steadfast', 'read-only-token');
    const kept = readFileSync(token);
    rmSync(token);
    try {
      const result = await inRoot(await unitCommand(CONTROLLER_UNIT));
      expect(result.code).toBe(2);
      expect(result.stderr.trim()).toMatch(/^steadfast: controller\.auth\.readOnlyTokenFile: cannot read \/etc\/steadfast\/read-only-token: ENOENT[^\n]*$/);
    } finally {
      writeFileSync(token, kept);
      await run('chgrp', ['-h', String(statSync(join(root, 'etc', 'steadfast', 'operator-token')).gid), token]);
      chmodSync(token, 0o640);
    }
    expect(readFileSync(join(unpacked, CONTROLLER_UNIT), 'utf8')).toMatch(/^RestartPreventExitStatus=2$/m);
  });

  it('runs the Slurm prolog with steadfast-agent, or the steadfast that STEADFAST_BIN names: exit 0 on a healthy kernel log, 1 naming Xid 79 on a fatal one', async () => {
    const prolog = '/usr/lib/steadfast-agent/slurm/prolog.sh';
    expect(statSync(join(root, prolog)).mode & 0o777).toBe(0o755);
    const preflight = (kmsg: string, bin?: string) =>
      inRoot([
        'SLURMD_NODENAME=deb-node',
        'STEADFAST_LOG_LEVEL=silent',
        ...(bin ? [`STEADFAST_BIN=${bin}`] : []),
        `STEADFAST_PREFLIGHT_ARGS=--path.kmsg ${kmsg} --nvidia-smi.xml /tmp/fixtures/nvidia-smi.xml`,
        prolog,
        '--xid.state-file',
        `/tmp/prolog-${bin ?? 'default'}-${kmsg.length}.json`,
      ]);
    const healthy = await preflight('/tmp/fixtures/healthy-kern.log');
    expect(healthy.code).toBe(0);
    expect(healthy.stdout).not.toMatch(/Xid/);
    const fatal = await preflight('/tmp/fixtures/fatal-kern.log');
    expect(fatal.code).toBe(1);
    expect(fatal.stdout).toMatch(/Xid 79/);
    const viaFullPackage = await preflight('/tmp/fixtures/fatal-kern.log', 'steadfast');
    expect(viaFullPackage.code).toBe(1);
    expect(viaFullPackage.stdout).toMatch(/Xid 79/);
  });

  it('writes the code cache again when /usr/bin/node changes (the dpkg file trigger)', async () => {
    const cache = join(root, 'var', 'cache', 'steadfast-agent');
    for (const file of readdirSync(cache)) rmSync(join(cache, file));
    await inRootOk(['dpkg-trigger', '--no-await', '/usr/bin/node']);
    expect(await inRootOk(['dpkg', '--triggers-only', '--pending'])).toMatch(/Processing triggers for steadfast-agent/);
    expect(readdirSync(cache)).toEqual([expect.stringMatching(/^agent-v[\d.]+-[0-9a-f]+\.cache$/)]);
    expect(statSync(cache).uid).toBe(0);
    // Made with agent.env's STEADFAST_NODE_FLAGS (set by the agent's test above), as the unit runs the agent.
    expect(rootRead('etc/steadfast/agent.env')).toContain(`STEADFAST_NODE_FLAGS="${NODE_FLAGS}"`);
    expect(JSON.parse(await inRootOk(await unitCommand(AGENT_UNIT, ['/usr/bin/steadfast-agent', '--code-cache-status'])))).toMatchObject({ state: 'used' });
  });

  it('loads every npm dependency of the controller from the installed tree, its stripped native objects included, and carries no try-it tools', async () => {
    const script = [
      "import { readFileSync } from 'node:fs';",
      "import { createRequire } from 'node:module';",
      "const dependencies = Object.keys(JSON.parse(readFileSync('package.json', 'utf8')).dependencies);",
      // A package with no main entry point (only subpaths) is loaded by `steadfast dashboards` below.
      "for (const name of dependencies) await import(name).catch((error) => { if (error.code !== 'ERR_PACKAGE_PATH_NOT_EXPORTED') throw error; });",
      "const msgpackr = createRequire(`${process.cwd()}/node_modules/msgpackr/package.json`)('msgpackr-extract');",
      'console.log(JSON.stringify({ count: dependencies.length, extract: typeof msgpackr.extractStrings }));',
    ].join('\n');
    const result = JSON.parse(await inRootOk(['sh', '-c', 'cd /usr/lib/steadfast && exec node --input-type=module -e "$1"', 'sh', script]));
    expect(result).toMatchObject({ extract: 'function' });
    // The try-it tools and the plotting libraries only they use are the steadfast-tryit package's.
    for (const path of ['node_modules/vega', 'node_modules/vega-lite', 'node_modules/@resvg', 'dist/tryit'])
      expect(existsSync(join(root, 'usr', 'lib', 'steadfast', path)), path).toBe(false);
    expect(result.count).toBeGreaterThan(10);
    await inRootOk(['steadfast', 'dashboards', '--out', '/tmp/dashboards']);
    expect(readdirSync(join(root, 'tmp', 'dashboards', 'dashboards')).length).toBeGreaterThan(0);
  });

  it('purges both packages leaving no file of theirs: /etc/steadfast, the state, the cache and the credentials go; the system user stays', async () => {
    const owned = (await inRootOk(['dpkg', '-L', 'steadfast-agent', 'steadfast'])).split('\n').filter(Boolean);
    expect(owned.length).toBeGreaterThan(100);
    // No process of the root may hold its files while it is purged.
    await waitFor(
      'the processes started in the root to end',
      async () => processesInRoot().length === 0,
      10_000,
      100,
      async () => processesInRoot().join('; '),
    );
    const purge = await inRootOk(['apt', 'purge', '--yes', 'steadfast-agent', 'steadfast'], 120_000);
    expect(purge).toMatch(/Purging configuration files for steadfast-agent/);
    expect(purge).toMatch(/Purging configuration files for steadfast /);
    for (const path of ['etc/steadfast', 'var/lib/steadfast', 'var/cache/steadfast-agent', 'usr/lib/steadfast', 'usr/lib/steadfast-agent'])
      expect(existsSync(join(root, path)), path).toBe(false);
    expect(
      owned.filter((path) => path !== '/.' && !statSync(join(root, path), { throwIfNoEntry: false })?.isDirectory() && existsSync(join(root, path))),
    ).toEqual([]);
    const left = [...rootFiles()].filter((path) => !filesBefore.has(path) && !BOOKKEEPING.some((pattern) => pattern.test(path)));
    expect(left).toEqual([]);
    // Debian's practice: the system user stays, since files elsewhere may still be its.
    expect(await inRootOk(['getent', 'passwd', 'steadfast'])).toMatch(/^steadfast:/);
  }, 150_000);
});
