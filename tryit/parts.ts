import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { stringify } from 'yaml';
import { AGENT_SCRAPE_JOB, CONTROLLER_SCRAPE_JOB } from '../core/scrape.js';
import { freePort, freePorts, httpOk, waitFor, type ProcessGroup } from './processes.js';

/**
 * The real parts (docs/architecture.md): Redis, Prometheus, Alertmanager and slurmctld from
 * Debian packages, each started on loopback with its own directory under `root`.
 */

const run = promisify(execFile);

export interface RedisPart {
  readonly url: string;
  readonly port: number;
  readonly dir: string;
}

/** Redis with AOF fsync on every write, so an acknowledged job survives a Redis restart. */
export async function startRedis(group: ProcessGroup, root: string, name = 'redis', port?: number, extraArgs: readonly string[] = []): Promise<RedisPart> {
  const dir = join(root, name);
  mkdirSync(dir, { recursive: true });
  const chosen = port ?? (await freePort());
  const args = [
    '--port',
    String(chosen),
    '--bind',
    '127.0.0.1',
    '--dir',
    dir,
    '--appendonly',
    'yes',
    '--appendfsync',
    'always',
    '--save',
    '',
    '--daemonize',
    'no',
    '--protected-mode',
    'yes',
    ...extraArgs,
  ];
  group.start(name, 'redis-server', args, join(dir, 'redis.log'));
  await waitFor('redis to answer PING', async () => {
    const { stdout } = await run('redis-cli', ['-p', String(chosen), 'ping']);
    return stdout.trim() === 'PONG';
  });
  return { url: `redis://127.0.0.1:${chosen}`, port: chosen, dir };
}

export interface ScrapeTarget {
  readonly address: string;
  readonly labels: Readonly<Record<string, string>>;
}

export interface PrometheusPart {
  readonly url: string;
  readonly port: number;
  /** Stops Prometheus (SIGTERM, or `signal`) and starts it again on the same port and data. */
  restart(signal?: NodeJS.Signals): Promise<void>;
}

export async function startPrometheus(
  group: ProcessGroup,
  root: string,
  options: {
    targets: readonly ScrapeTarget[];
    ruleFiles: readonly string[];
    alertmanagerAddress: string;
    /** More Alertmanagers to send to as well (an HA pair: Prometheus notifies every one). */
    extraAlertmanagerAddresses?: readonly string[];
    intervalSeconds: number;
    /** The controller's metrics listener, host:port (config controller.metrics), scraped as job CONTROLLER_SCRAPE_JOB. */
    controllerMetricsAddress?: string;
    /** Listen on this port (default: a free one), e.g. when others must know the URL first. */
    port?: number;
  },
): Promise<PrometheusPart> {
  const dir = join(root, 'prometheus');
  mkdirSync(join(dir, 'data'), { recursive: true });
  const port = options.port ?? (await freePort());
  const interval = `${options.intervalSeconds}s`;
  const config = {
    global: { scrape_interval: interval, evaluation_interval: interval, scrape_timeout: interval },
    rule_files: [...options.ruleFiles],
    alerting: { alertmanagers: [{ static_configs: [{ targets: [options.alertmanagerAddress, ...(options.extraAlertmanagerAddresses ?? [])] }] }] },
    scrape_configs: [
      {
        job_name: AGENT_SCRAPE_JOB,
        static_configs: options.targets.map((target) => ({ targets: [target.address], labels: { ...target.labels } })),
      },
      ...(options.controllerMetricsAddress ? [{ job_name: CONTROLLER_SCRAPE_JOB, static_configs: [{ targets: [options.controllerMetricsAddress] }] }] : []),
    ],
  };
  const configFile = join(dir, 'prometheus.yml');
  writeFileSync(configFile, stringify(config));
  const url = `http://127.0.0.1:${port}`;
  const launch = async (): Promise<void> => {
    group.start(
      'prometheus',
      'prometheus',
      [`--config.file=${configFile}`, `--storage.tsdb.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, '--web.enable-lifecycle'],
      join(dir, 'prometheus.log'),
    );
    await waitFor('Prometheus to be ready', () => httpOk(`${url}/-/ready`), 20_000);
  };
  await launch();
  return {
    url,
    port,
    restart: async (signal = 'SIGTERM') => {
      await group.stop('prometheus', 10_000, signal);
      await launch();
    },
  };
}

export interface AlertmanagerPart {
  readonly url: string;
  readonly address: string;
  /** The name its process has in the ProcessGroup (and its directory under the root). */
  readonly name: string;
  /** Its gossip address when it is one of an HA cluster. */
  readonly clusterAddress?: string;
  /** Stops it (SIGTERM, or `signal`) and starts it again on the same ports and data. */
  restart(signal?: NodeJS.Signals): Promise<void>;
}

export interface AlertmanagerOptions {
  /** Process and directory name; default `alertmanager`. */
  readonly name?: string;
  readonly port?: number;
  /**
   * Join an HA cluster: gossip on this loopback port with these peers (`host:port`). Without
   * it, clustering is off (a single Alertmanager).
   */
  readonly cluster?: {
    readonly port: number;
    readonly peers: readonly string[];
    /** How long each later peer waits for an earlier one to notify (Alertmanager's default is 15 s). */
    readonly peerTimeout?: string;
  };
}

export async function startAlertmanager(group: ProcessGroup, root: string, configText: string, options: AlertmanagerOptions = {}): Promise<AlertmanagerPart> {
  const name = options.name ?? 'alertmanager';
  const dir = join(root, name);
  mkdirSync(join(dir, 'data'), { recursive: true });
  const port = options.port ?? (await freePort());
  const configFile = join(dir, 'alertmanager.yml');
  writeFileSync(configFile, configText);
  const cluster = options.cluster;
  const clusterAddress = cluster ? `127.0.0.1:${cluster.port}` : undefined;
  const clusterArgs = cluster
    ? [
        `--cluster.listen-address=${clusterAddress}`,
        `--cluster.advertise-address=${clusterAddress}`,
        ...cluster.peers.map((peer) => `--cluster.peer=${peer}`),
        `--cluster.peer-timeout=${cluster.peerTimeout ?? '15s'}`,
        // Loopback peers find each other at once; do not hold notifications for a minute.
        '--cluster.settle-timeout=5s',
        '--cluster.reconnect-interval=1s',
      ]
    : ['--cluster.listen-address='];
  const url = `http://127.0.0.1:${port}`;
  const launch = async (): Promise<void> => {
    group.start(
      name,
      'prometheus-alertmanager',
      [`--config.file=${configFile}`, `--storage.path=${join(dir, 'data')}`, `--web.listen-address=127.0.0.1:${port}`, ...clusterArgs],
      join(dir, 'alertmanager.log'),
    );
    await waitFor(`${name} to be ready`, () => httpOk(`${url}/-/ready`), 20_000);
  };
  await launch();
  return {
    url,
    address: `127.0.0.1:${port}`,
    name,
    ...(clusterAddress ? { clusterAddress } : {}),
    restart: async (signal = 'SIGTERM') => {
      await group.stop(name, 5000, signal);
      await launch();
    },
  };
}

/**
 * Two Alertmanagers clustered over loopback gossip (`--cluster.listen-address`, `--cluster.peer`),
 * as an HA pair is run: Prometheus sends every alert to both, and the pair's shared notification
 * log lets only one of them notify the receiver. Resolves once each sees the other as a peer.
 */
export async function startAlertmanagerPair(
  group: ProcessGroup,
  root: string,
  configText: string,
  options: {
    /** How long the second waits for the first to notify before it does (default 2 s). */
    readonly peerTimeout?: string;
    /** Names are `<namePrefix>-a` and `<namePrefix>-b` (default `alertmanager`). */
    readonly namePrefix?: string;
  } = {},
): Promise<[AlertmanagerPart, AlertmanagerPart]> {
  const prefix = options.namePrefix ?? 'alertmanager';
  const [gossipA, gossipB] = await freePorts(2);
  const cluster = (own: number, other: number) => ({ port: own, peers: [`127.0.0.1:${other}`], peerTimeout: options.peerTimeout ?? '2s' });
  const [first, second] = await Promise.all([
    startAlertmanager(group, root, configText, { name: `${prefix}-a`, cluster: cluster(gossipA, gossipB) }),
    startAlertmanager(group, root, configText, { name: `${prefix}-b`, cluster: cluster(gossipB, gossipA) }),
  ]);
  for (const part of [first, second]) {
    await waitFor(`${part.name} to see its peer`, async () => (await alertmanagerPeers(part)) === 2, 20_000, 200);
  }
  return [first, second];
}

/** Members of the Alertmanager's cluster as it sees them (itself included), from `/api/v2/status`. */
export async function alertmanagerPeers(part: AlertmanagerPart): Promise<number> {
  const response = await fetch(`${part.url}/api/v2/status`, { signal: AbortSignal.timeout(2000) });
  const body = (await response.json()) as { cluster?: { status?: string; peers?: unknown[] } };
  return body.cluster?.peers?.length ?? 0;
}

export interface SlurmPart {
  /** Path of slurm.conf; Slurm clients need it as SLURM_CONF. */
  readonly conf: string;
  readonly dir: string;
  readonly env: Readonly<Record<string, string>>;
}

/**
 * slurmctld without munge or slurmd: auth/none, and nodes declared CLOUD so they exist without
 * a daemon behind them, yet take DRAIN and RESUME like real ones. JWT is enabled as the
 * alternative authentication so `scontrol token` works and slurmrestd can be put in front.
 */
export async function startSlurm(
  group: ProcessGroup,
  root: string,
  nodes: readonly string[],
  options: { readonly partitions?: Readonly<Record<string, readonly string[]>> } = {},
): Promise<SlurmPart> {
  const dir = join(root, 'slurm');
  mkdirSync(join(dir, 'state'), { recursive: true });
  mkdirSync(join(dir, 'spool'), { recursive: true });
  const [ctldPort, slurmdPort] = await freePorts(2);
  const conf = join(dir, 'slurm.conf');
  const jwtKey = join(dir, 'jwt_hs256.key');
  writeFileSync(jwtKey, randomBytes(32), { mode: 0o600 });
  const lines = [
    'ClusterName=steadfast-sim',
    `SlurmctldHost=${hostname().split('.')[0]}(127.0.0.1)`,
    `SlurmctldPort=${ctldPort}`,
    `SlurmdPort=${slurmdPort}`,
    'AuthType=auth/none',
    'AuthAltTypes=auth/jwt',
    `AuthAltParameters=jwt_key=${jwtKey}`,
    'CredType=cred/none',
    'SlurmUser=root',
    'MailProg=/bin/true',
    // The remedies' reboot rung asks for `scontrol reboot`; nodes without slurmd never carry it out.
    'RebootProgram=/bin/true',
    `StateSaveLocation=${join(dir, 'state')}`,
    `SlurmctldPidFile=${join(dir, 'slurmctld.pid')}`,
    `SlurmctldLogFile=${join(dir, 'slurmctld.log')}`,
    `SlurmdSpoolDir=${join(dir, 'spool')}`,
    'ProctrackType=proctrack/linuxproc',
    'TaskPlugin=task/none',
    'ReturnToService=2',
    'PrivateData=cloud',
    'SelectType=select/cons_tres',
    ...nodes.map((node) => `NodeName=${node} NodeAddr=127.0.0.1 CPUs=1 State=CLOUD`),
    `PartitionName=gpu Nodes=${nodes.join(',')} Default=YES MaxTime=INFINITE State=UP`,
    ...Object.entries(options.partitions ?? {}).map(([name, members]) => `PartitionName=${name} Nodes=${members.join(',')} MaxTime=INFINITE State=UP`),
  ];
  writeFileSync(conf, `${lines.join('\n')}\n`);
  const env = { SLURM_CONF: conf };
  group.start('slurmctld', 'slurmctld', ['-D', '-i', '-f', conf], join(dir, 'slurmctld.out'), { env: { ...process.env, ...env } });
  await waitFor('slurmctld to answer sinfo', async () => {
    const { stdout } = await run('sinfo', ['--noheader', '--Node', '--format=%N'], { env: { ...process.env, ...env } });
    // A node in several partitions is listed once for each.
    return new Set(stdout.split('\n').filter(Boolean)).size === nodes.length;
  });
  return { conf, dir, env };
}

export interface SlurmRestPart {
  readonly url: string;
  readonly user: string;
  /** `scontrol token` output for `user`, as an operator would keep it for a service. */
  readonly tokenFile: string;
}

/**
 * slurmrestd in front of the sim's slurmctld, on loopback with JWT auth. It refuses to run as
 * root, so it drops to `nobody` after binding (which is why the conf must be world-readable),
 * and loads only the Slurm API plugins: the accounting ones need slurmdbd.
 */
export async function startSlurmRest(group: ProcessGroup, slurm: SlurmPart, user = 'root'): Promise<SlurmRestPart> {
  const env = { ...process.env, ...slurm.env };
  chmodSync(slurm.dir, 0o755);
  chmodSync(join(slurm.dir, '..'), 0o755);
  chmodSync(slurm.conf, 0o644);
  const port = await freePort();
  const asNobody = process.getuid?.() === 0 ? ['-u', 'nobody'] : [];
  // `-s list` names what this Slurm ships; the dbv* (accounting) plugins need slurmdbd.
  const listed = await run('slurmrestd', [...asNobody, '-s', 'list'], { env }).catch((error: { stdout?: string; stderr?: string }) => error);
  const plugins = [...`${listed.stdout ?? ''}${listed.stderr ?? ''}`.matchAll(/openapi\/v\d+\.\d+\.\d+/g)].map((match) => match[0]).join(',');
  if (!plugins) throw new Error('slurmrestd lists no openapi/v* plugin');
  group.start(
    'slurmrestd',
    'slurmrestd',
    [...asNobody, '-a', 'rest_auth/jwt', '-s', plugins, '-f', slurm.conf, `127.0.0.1:${port}`],
    join(slurm.dir, 'slurmrestd.log'),
    { env },
  );
  const { stdout } = await run('scontrol', ['token', `username=${user}`, 'lifespan=86400'], { env });
  const tokenFile = join(slurm.dir, 'slurmrestd.token');
  writeFileSync(tokenFile, stdout, { mode: 0o600 });
  const url = `http://127.0.0.1:${port}`;
  await waitFor('slurmrestd to answer', async () => (await fetch(`${url}/openapi/v3`).catch(() => undefined))?.status !== undefined, 20_000);
  return { url, user, tokenFile };
}

/** `sinfo` view of one node: state and reason. */
export async function slurmNode(part: SlurmPart, node: string): Promise<{ state: string; reason: string }> {
  const { stdout } = await run('sinfo', ['--noheader', '--Node', `--nodes=${node}`, '--format=%T|%E'], { env: { ...process.env, ...part.env } });
  const [state = '', reason = ''] = stdout.trim().split('|');
  return { state, reason };
}
