import { execFile } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';

/**
 * A Debian root (scripts/debian-root.sh) that test/package/deb.test.ts installs the packages into:
 * commands run in it through unshare and chroot, and a unit's ExecStart as systemd would run it
 * (its user, groups, capabilities, no new privileges, umask, StateDirectory= and environment),
 * since systemd is not PID 1 there.
 */

const run = promisify(execFile);
const COMMAND_TIMEOUT_MS = 60_000;

export interface Result {
  code: number;
  stdout: string;
  stderr: string;
}

/** A command's exit status and output, whether it succeeded or not. */
export async function settle(promise: Promise<{ stdout: string; stderr: string }>): Promise<Result> {
  try {
    const { stdout, stderr } = await promise;
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code?: number | string; stdout?: string; stderr?: string };
    return { code: typeof failed.code === 'number' ? failed.code : -1, stdout: failed.stdout ?? '', stderr: failed.stderr ?? String(error) };
  }
}

/** A clean environment for commands in the root, as a root shell there would have it. */
const ROOT_ENV = ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'LANG=C.UTF-8', 'HOME=/root', 'DEBIAN_FRONTEND=noninteractive'];

/** `KEY=value` lines as systemd reads an EnvironmentFile= (comments, quotes). */
function parseEnvironmentFile(text: string): Map<string, string> {
  const env = new Map<string, string>();
  for (const line of text.split('\n')) {
    const match = line.trim().match(/^([A-Za-z_][A-Za-z0-9_]*)=(.*)$/);
    if (!match) continue;
    const [, key, raw] = match as unknown as [string, string, string];
    const value = raw.match(/^"(.*)"$/)?.[1] ?? raw.match(/^'(.*)'$/)?.[1] ?? raw;
    env.set(key, value);
  }
  return env;
}

interface Unit {
  readonly service: Map<string, string[]>;
  one(key: string): string;
}

function readUnit(path: string): Unit {
  const service = new Map<string, string[]>();
  let section = '';
  for (const line of readFileSync(path, 'utf8').split('\n')) {
    const header = line.match(/^\[(\w+)\]$/);
    if (header) section = header[1] as string;
    const entry = line.match(/^(\w+)=(.*)$/);
    if (section === 'Service' && entry) service.set(entry[1] as string, [...(service.get(entry[1] as string) ?? []), entry[2] as string]);
  }
  return {
    service,
    one(key) {
      const values = service.get(key);
      if (values?.length !== 1) throw new Error(`${path}: expected one ${key}=, found ${values?.length ?? 0}`);
      return values[0] as string;
    },
  };
}

/** CAP_SYSLOG CAP_SYS_PTRACE → ['syslog', 'sys_ptrace'], as setpriv names them. */
function capabilities(value: string | undefined): string[] {
  return (value ?? '')
    .split(/\s+/)
    .filter(Boolean)
    .map((cap) => cap.replace(/^CAP_/, '').toLowerCase());
}

/** The root at `path`, as root runs commands in it. */
export class DebianRoot {
  constructor(readonly path: string) {}

  /** `argv` inside the root: its own mount and PID namespaces (a /proc of its own), then chroot. */
  args(argv: readonly string[]): string[] {
    return [
      '--mount',
      '--pid',
      '--fork',
      '--kill-child',
      `--mount-proc=${join(this.path, 'proc')}`,
      'chroot',
      this.path,
      '/usr/bin/env',
      '-i',
      ...ROOT_ENV,
      ...argv,
    ];
  }

  run(argv: readonly string[], timeout = COMMAND_TIMEOUT_MS): Promise<Result> {
    return settle(run('unshare', this.args(argv), { timeout, maxBuffer: 64 * 1024 * 1024 }));
  }

  async ok(argv: readonly string[], timeout = COMMAND_TIMEOUT_MS): Promise<string> {
    const result = await this.run(argv, timeout);
    if (result.code !== 0) throw new Error(`${argv.join(' ')} exited ${result.code}: ${result.stderr}${result.stdout}`);
    return result.stdout;
  }

  /** Every path in the root but the kernel's, the devices and /tmp (where the test keeps its files). */
  files(): Set<string> {
    const paths = readdirSync(this.path, { recursive: true, encoding: 'utf8' }).filter((path) => !/^(proc|dev|sys|run|tmp)(\/|$)/.test(path));
    return new Set(paths);
  }

  /**
   * The command systemd would run for `unitPath` in the root: ExecStart with $VAR and ${VAR}
   * expanded from the unit's environment, under setpriv with the unit's user, groups and
   * capabilities, and the unit's umask. Makes the unit's StateDirectory= as systemd does.
   * `command`, when given, runs instead of ExecStart in the same environment and confinement.
   */
  async unitCommand(unitPath: string, command?: readonly string[]): Promise<string[]> {
    const unit = readUnit(join(this.path, unitPath));
    const user = unit.one('User');
    const group = unit.one('Group');
    const passwd = readFileSync(join(this.path, 'etc', 'passwd'), 'utf8')
      .split('\n')
      .find((line) => line.startsWith(`${user}:`));
    if (!passwd) throw new Error(`the root has no user ${user}`);
    const [, , uid, gid, , home, shell] = passwd.split(':') as [string, string, string, string, string, string, string];
    const env = new Map<string, string>([
      ['PATH', '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin'],
      ['LANG', 'C.UTF-8'],
      ['HOME', home],
      ['USER', user],
      ['LOGNAME', user],
      ['SHELL', shell],
    ]);
    for (const state of unit.service.get('StateDirectory') ?? []) {
      const dir = join(this.path, 'var', 'lib', state);
      mkdirSync(dir, { recursive: true });
      await run('chown', [`${uid}:${gid}`, dir]);
      chmodSync(dir, Number.parseInt(unit.service.get('StateDirectoryMode')?.[0] ?? '0755', 8));
      env.set('STATE_DIRECTORY', `/var/lib/${state}`);
    }
    for (const assignment of unit.service.get('Environment') ?? []) {
      const [key, ...value] = assignment.replace(/^"|"$/g, '').split('=');
      env.set(key as string, value.join('='));
    }
    for (const file of unit.service.get('EnvironmentFile') ?? []) {
      const path = join(this.path, file.replace(/^-/, ''));
      if (existsSync(path)) for (const [key, value] of parseEnvironmentFile(readFileSync(path, 'utf8'))) env.set(key, value);
      else if (!file.startsWith('-')) throw new Error(`${unitPath}: EnvironmentFile ${file} is missing`);
    }
    const execStart = unit.one('ExecStart');
    if (/^[-@+!:]/.test(execStart)) throw new Error(`${unitPath}: ExecStart prefixes are not emulated: ${execStart}`);
    const argv = execStart.split(/\s+/).flatMap((word) => {
      const whole = word.match(/^\$([A-Za-z_]\w*)$/);
      if (whole) return (env.get(whole[1] as string) ?? '').split(/\s+/).filter(Boolean);
      return [word.replace(/\$\{([A-Za-z_]\w*)\}/g, (_, name: string) => env.get(name) ?? '')];
    });
    const bounding = capabilities(unit.service.get('CapabilityBoundingSet')?.at(-1));
    const ambient = capabilities(unit.service.get('AmbientCapabilities')?.at(-1));
    const caps = (names: string[]) => ['-all', ...names.map((name) => `+${name}`)].join(',');
    return [
      'setpriv',
      `--reuid=${user}`,
      `--regid=${group}`,
      '--init-groups',
      `--bounding-set=${caps(bounding)}`,
      `--inh-caps=${caps(ambient)}`,
      `--ambient-caps=${caps(ambient)}`,
      ...(unit.service.get('NoNewPrivileges')?.[0] === 'yes' ? ['--no-new-privs'] : []),
      '--',
      '/bin/sh',
      '-c',
      `umask ${unit.service.get('UMask')?.[0] ?? '0022'} && exec "$@"`,
      unitPath,
      '/usr/bin/env',
      '-i',
      ...[...env].map(([key, value]) => `${key}=${value}`),
      ...(command ?? argv),
    ];
  }

  /** Processes whose root directory is the Debian root (none may run while it is purged). */
  processes(): string[] {
    return readdirSync('/proc')
      .filter((pid) => /^\d+$/.test(pid))
      .filter((pid) => {
        try {
          return readlinkSync(`/proc/${pid}/root`) === this.path;
        } catch {
          return false;
        }
      })
      .map((pid) => `${pid} ${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ').trim()}`);
  }
}
