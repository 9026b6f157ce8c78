import { execFile } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../core/config.js';
import { ProcessGroup, freePort, httpOk, waitFor } from '../../sim/processes.js';

/**
 * The Debian package: packaging/debian/build.sh builds it with dpkg-deb; the test reads its
 * control data and file list, unpacks it into a throwaway root (dpkg -x), verifies the systemd
 * units there with systemd-analyze, and runs the unpacked agent until it answers a scrape.
 */

const run = promisify(execFile);
const ROOT = join(import.meta.dirname, '..', '..');
const FIXTURES = join(ROOT, 'test', 'fixtures', 'realworld');
const BUILD_TIMEOUT_MS = 300_000;
const UNITS = ['/lib/systemd/system/steadfast-agent.service', '/lib/systemd/system/steadfast-controller.service'];

let work = '';
let deb = '';
let unpacked = '';
const processes = new ProcessGroup();

beforeAll(async () => {
  if (!existsSync(join(ROOT, 'dist', 'cli', 'main.js'))) throw new Error('dist/ is missing: run `npm run build` (npm test does it)');
  work = mkdtempSync(join(tmpdir(), 'steadfast-deb-'));
  const { stdout } = await run(join(ROOT, 'packaging', 'debian', 'build.sh'), ['--out', work, '--no-build'], { cwd: ROOT, timeout: BUILD_TIMEOUT_MS, maxBuffer: 16 * 1024 * 1024 });
  deb = stdout.trim().split('\n').at(-1) ?? '';
  unpacked = join(work, 'root');
  await run('dpkg', ['-x', deb, unpacked]);
  // systemd-analyze --root needs the units ours refer to (network-online.target, ...): this machine's.
  cpSync('/lib/systemd/system', join(unpacked, 'lib', 'systemd', 'system'), { recursive: true, force: false, errorOnExist: false });
}, BUILD_TIMEOUT_MS + 60_000);

afterAll(async () => {
  await processes.stopAll();
  if (work) rmSync(work, { recursive: true, force: true });
});

describe('the Debian package', () => {
  it('names the package, depends on Node.js 20 or later and keeps /etc/steadfast as conffiles', async () => {
    const control = (await run('dpkg-deb', ['-f', deb])).stdout;
    expect(control).toMatch(/^Package: steadfast$/m);
    expect(control).toMatch(/^Depends: .*nodejs \(>= 20\)/m);
    const conffiles = (await run('dpkg-deb', ['-I', deb, 'conffiles'])).stdout;
    expect(conffiles.split('\n').filter(Boolean).sort()).toEqual(['/etc/steadfast/agent.env', '/etc/steadfast/controller.env', '/etc/steadfast/controller.yaml']);
  });

  it('installs the built tree under /usr/lib/steadfast, a /usr/bin wrapper and both units, and no tests', async () => {
    const listing = (await run('dpkg-deb', ['-c', deb], { maxBuffer: 64 * 1024 * 1024 })).stdout;
    const paths = listing.split('\n').map((line) => line.split(/\s+/).at(5) ?? '').filter(Boolean);
    expect(paths).toEqual(expect.arrayContaining(['./usr/bin/steadfast', './usr/lib/steadfast/bin/steadfast.js', './usr/lib/steadfast/dist/cli/main.js', './usr/lib/steadfast/dist/agent.cjs', './usr/lib/steadfast/dist/agent.cjs.cache', './usr/lib/steadfast/rules/xid.yml', './usr/lib/steadfast/slurm/prolog.sh', ...UNITS.map((unit) => `.${unit}`)]));
    expect(paths.filter((path) => path.startsWith('./usr/lib/steadfast/test/') || path.startsWith('./usr/lib/steadfast/dist/bench/'))).toEqual([]);
    expect(listing).toMatch(/^-rwxr-xr-x root\/root .* \.\/usr\/bin\/steadfast$/m);
  });

  it('ships maintainer scripts that parse and create the steadfast system user', async () => {
    for (const script of ['postinst', 'prerm', 'postrm']) await run('sh', ['-n', join(ROOT, 'packaging', 'debian', script)]);
    const postinst = (await run('dpkg-deb', ['-I', deb, 'postinst'])).stdout;
    expect(postinst).toContain('adduser --system --group');
  });

  it('has systemd units that systemd-analyze verifies without a warning', async () => {
    const { stdout, stderr } = await run('systemd-analyze', ['verify', `--root=${unpacked}`, ...UNITS]);
    expect(`${stdout}${stderr}`).toBe('');
  });

  it('confines both units: systemd rates the agent at most 3.0 and the controller at most 2.0 exposed, the agent holding only CAP_SYSLOG and CAP_SYS_PTRACE', async () => {
    // --threshold is the exposure level times ten; systemd-analyze exits non-zero above it.
    await run('systemd-analyze', ['security', '--offline=true', '--threshold=30', `--root=${unpacked}`, UNITS[0] as string]);
    await run('systemd-analyze', ['security', '--offline=true', '--threshold=20', `--root=${unpacked}`, UNITS[1] as string]);
    const agentUnit = readFileSync(join(unpacked, 'lib', 'systemd', 'system', 'steadfast-agent.service'), 'utf8');
    expect(agentUnit).toMatch(/^CapabilityBoundingSet=CAP_SYSLOG CAP_SYS_PTRACE$/m);
    expect(agentUnit).toMatch(/^User=steadfast$/m);
  });

  it('ships a controller config that the controller accepts', () => {
    const config = loadConfig({ file: join(unpacked, 'etc', 'steadfast', 'controller.yaml'), env: {} });
    expect(config.backend.kind).toBe('dry-run');
    expect(config.controller.auth).toEqual({
      operatorTokenFile: '/etc/steadfast/operator-token',
      readOnlyTokenFile: '/etc/steadfast/read-only-token',
      alertmanagerTokenFile: '/etc/steadfast/alertmanager-token',
      agentSecretFile: '/etc/steadfast/agent-secret',
    });
  });

  it('ships the Slurm prolog, which runs the packaged steadfast check and fails on a fatal Xid', async () => {
    const prolog = join(unpacked, 'usr', 'lib', 'steadfast', 'slurm', 'prolog.sh');
    expect(statSync(prolog).mode & 0o111).toBe(0o111);
    const preflight = (kmsg: string) =>
      run('sh', [prolog, '--xid.state-file', join(work, `prolog-${kmsg.length}.json`)], {
        env: { ...process.env, SLURMD_NODENAME: 'deb-node', STEADFAST_BIN: join(unpacked, 'usr', 'bin', 'steadfast'), STEADFAST_PREFLIGHT_ARGS: `--path.kmsg ${kmsg} --nvidia-smi.xml ${join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml')}`, STEADFAST_LOG_LEVEL: 'silent' },
      }).then(
        () => ({ code: 0, stdout: '' }),
        (error: { code: number; stdout: string }) => ({ code: error.code, stdout: error.stdout }),
      );
    const healthy = join(work, 'healthy-kern.log');
    writeFileSync(healthy, '[    1.000000] Linux version 6.1.0 (debian-kernel@lists.debian.org)\n');
    expect(await preflight(healthy)).toEqual({ code: 0, stdout: '' });
    const fatal = await preflight(join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'));
    expect(fatal.code).toBe(1);
    expect(fatal.stdout).toMatch(/Xid 79/);
  });

  it('runs the unpacked agent through /usr/bin/steadfast, which hands node the flags of STEADFAST_NODE_FLAGS, until it answers a scrape', async () => {
    // The agent sets its own V8 flags; the unit passes none, and an operator's come from agent.env.
    const unit = readFileSync(join(unpacked, 'lib', 'systemd', 'system', 'steadfast-agent.service'), 'utf8');
    expect(unit).not.toMatch(/^Environment="STEADFAST_NODE_FLAGS=/m);
    const nodeFlags = '--max-semi-space-size=2 --stack-size=900';
    const port = await freePort();
    const agent = processes.start(
      'agent',
      join(unpacked, 'usr', 'bin', 'steadfast'),
      ['agent', '--web.listen-address', `127.0.0.1:${port}`, '--node', 'deb-node', '--path.kmsg', join(FIXTURES, 'xid-kernel-logs', 'gpud_xid_lines_h100_gb200.txt'), '--nvidia-smi.xml', join(FIXTURES, 'nvidia-smi-xml', 'telegraf_a10g_515.105.01.xml'), '--xid.state-file', join(work, 'xid-state.json'), '--web.insecure'],
      join(work, 'agent.log'),
      { env: { ...process.env, STEADFAST_LOG_LEVEL: 'warn', STEADFAST_NODE_FLAGS: nodeFlags } },
    );
    const url = `http://127.0.0.1:${port}/metrics`;
    await waitFor('the unpacked agent to serve /metrics', () => httpOk(url), 30_000);
    // The wrapper execs node in its own process, with the operator's flags before the script.
    expect(readFileSync(`/proc/${agent.pid ?? 0}/cmdline`, 'utf8').split('\0').slice(0, 3)).toEqual(['node', ...nodeFlags.split(' ')]);
    const text = await (await fetch(url)).text();
    expect(text).toContain('steadfast_xid_errors_total{pci_bus_id="0000:91:00",xid="79",severity="fatal"} 1');
    expect(text).toContain('steadfast_collector_success{collector="gpu"} 1');
    // The package records the commit it was built from; the agent labels its build info with it.
    const revision = (await run('git', ['rev-parse', 'HEAD'], { cwd: ROOT })).stdout.trim();
    expect(text).toMatch(new RegExp(`^steadfast_build_info\\{[^}]*revision="${revision}"[^}]*\\} 1$`, 'm'));
  });
});
