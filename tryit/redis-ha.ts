import { execFile } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { startRedis, type RedisPart } from './parts.js';
import { freePort, waitFor, type ProcessGroup } from './processes.js';

/**
 * Redis with failover, from Debian's redis-server: one primary, replicas, and sentinels that
 * promote a replica when the primary dies (`redis-server --sentinel`, which is all Debian's
 * redis-sentinel package adds). Everything on loopback, each with its own directory.
 */

const run = promisify(execFile);

export const SENTINEL_GROUP = 'steadfast';

export interface RedisHaOptions {
  readonly replicas?: number;
  readonly sentinels?: number;
  /** How long a primary must be silent before the sentinels call it down. */
  readonly downAfterMs?: number;
  /** The sentinels' failover-timeout: how long one failover attempt may take before another. */
  readonly failoverTimeoutMs?: number;
}

/**
 * Room for a loaded machine: every wait below is this many times what the sentinels' own
 * settings allow for the step, plus a replica's full sync.
 */
const LOAD_ROOM = 3;
const SYNC_MS = 5_000;

export interface RedisServer extends RedisPart {
  readonly name: string;
}

/** What one sentinel says of the group: SENTINEL MASTER's fields. */
async function sentinelView(port: number): Promise<Map<string, string>> {
  const { stdout } = await run('redis-cli', ['-p', String(port), 'sentinel', 'master', SENTINEL_GROUP]);
  const lines = stdout.split('\n');
  const fields = new Map<string, string>();
  for (let index = 0; index + 1 < lines.length; index += 2) fields.set(lines[index] as string, lines[index + 1] as string);
  return fields;
}

export class RedisHa {
  private constructor(
    private readonly group: ProcessGroup,
    private readonly root: string,
    /** Every data node, the first started as the primary. */
    readonly servers: RedisServer[],
    readonly sentinels: { readonly host: string; readonly port: number }[],
    private readonly settings: { readonly downAfterMs: number; readonly failoverTimeoutMs: number },
  ) {}

  /** How long the sentinels may take to call the primary down and promote a replica. */
  get promotionDeadlineMs(): number {
    return LOAD_ROOM * (this.settings.downAfterMs + this.settings.failoverTimeoutMs);
  }

  /** How long a restarted server may take to be made a replica and sync (the sentinels check each server every second). */
  get rejoinDeadlineMs(): number {
    return LOAD_ROOM * (this.settings.failoverTimeoutMs + SYNC_MS);
  }

  static async start(group: ProcessGroup, root: string, options: RedisHaOptions = {}): Promise<RedisHa> {
    const primary = { name: 'redis-0', ...(await startRedis(group, root, 'redis-0')) };
    const servers: RedisServer[] = [primary];
    for (let index = 1; index <= (options.replicas ?? 1); index += 1) {
      const name = `redis-${index}`;
      servers.push({ name, ...(await startRedis(group, root, name, undefined, ['--replicaof', '127.0.0.1', String(primary.port)])) });
    }
    const sentinels: { host: string; port: number }[] = [];
    const count = options.sentinels ?? 3;
    const settings = { downAfterMs: options.downAfterMs ?? 1000, failoverTimeoutMs: options.failoverTimeoutMs ?? 10_000 };
    for (let index = 0; index < count; index += 1) {
      const port = await freePort();
      const dir = join(root, `sentinel-${index}`);
      mkdirSync(dir, { recursive: true });
      const configFile = join(dir, 'sentinel.conf');
      writeFileSync(
        configFile,
        [
          `port ${port}`,
          'bind 127.0.0.1',
          `dir ${dir}`,
          `sentinel monitor ${SENTINEL_GROUP} 127.0.0.1 ${primary.port} ${Math.floor(count / 2) + 1}`,
          `sentinel down-after-milliseconds ${SENTINEL_GROUP} ${settings.downAfterMs}`,
          `sentinel failover-timeout ${SENTINEL_GROUP} ${settings.failoverTimeoutMs}`,
          '',
        ].join('\n'),
      );
      group.start(`sentinel-${index}`, 'redis-server', [configFile, '--sentinel', '--daemonize', 'no'], join(dir, 'sentinel.log'));
      sentinels.push({ host: '127.0.0.1', port });
    }
    const ha = new RedisHa(group, root, servers, sentinels, settings);
    await waitFor(
      'the replicas to be in sync',
      async () => (await ha.syncedReplicas(primary.port)) === servers.length - 1,
      LOAD_ROOM * SYNC_MS,
      100,
      () => ha.describe(),
    );
    // Sentinels find each other through hello messages on the primary, every 2 s.
    await waitFor(
      'the sentinels to know the replicas and each other',
      async () => {
        const views = await Promise.all(sentinels.map(({ port }) => sentinelView(port)));
        return views.every((view) => view.get('num-slaves') === String(servers.length - 1) && view.get('num-other-sentinels') === String(count - 1));
      },
      LOAD_ROOM * (SYNC_MS + 2_000),
      100,
      () => ha.describe(),
    );
    return ha;
  }

  /** The port of the server the sentinels now name primary. */
  async primaryPort(): Promise<number> {
    if (this.sentinels.length === 0) return (this.servers[0] as RedisServer).port;
    const { stdout } = await run('redis-cli', ['-p', String(this.sentinels[0]?.port), 'sentinel', 'get-master-addr-by-name', SENTINEL_GROUP]);
    return Number(stdout.trim().split('\n')[1]);
  }

  /** What the sentinels and the servers say now, for a wait that timed out. */
  async describe(): Promise<string> {
    const parts: string[] = [];
    if (this.sentinels.length > 0) {
      const view = await sentinelView(this.sentinels[0]?.port as number).catch(() => new Map<string, string>());
      parts.push(
        `sentinel-0 names ${view.get('ip') ?? '?'}:${view.get('port') ?? '?'} primary (flags ${view.get('flags') ?? '?'}, ${view.get('num-slaves') ?? '?'} replicas, ${view.get('num-other-sentinels') ?? '?'} other sentinels)`,
      );
    }
    for (const server of this.servers) {
      const running = this.group.isRunning(server.name) ? 'running' : 'not running';
      const info = await run('redis-cli', ['-p', String(server.port), 'info', 'replication']).then(
        ({ stdout }) =>
          stdout
            .split('\n')
            .filter((line) => /^(role|master_link_status|connected_slaves|slave\d+):/.test(line))
            .map((line) => line.trim())
            .join(' '),
        (error: unknown) => `no answer (${error instanceof Error ? error.message.split('\n')[0] : String(error)})`,
      );
      parts.push(`${server.name} on ${server.port}, ${running}: ${info}`);
    }
    return parts.join('; ');
  }

  private async syncedReplicas(port: number): Promise<number> {
    const { stdout } = await run('redis-cli', ['-p', String(port), 'info', 'replication']);
    return stdout.split('\n').filter((line) => /^slave\d+:.*state=online/.test(line)).length;
  }

  /** SIGKILLs every replica of the current primary; `restartReplicas` brings them back. */
  async killReplicas(): Promise<void> {
    const primary = await this.primaryPort();
    for (const server of this.servers) if (server.port !== primary) await this.group.stop(server.name, 0, 'SIGKILL');
  }

  async restartReplicas(timeoutMs = this.rejoinDeadlineMs): Promise<void> {
    const primary = await this.primaryPort();
    for (const server of this.servers) {
      if (server.port !== primary) await startRedis(this.group, this.root, server.name, server.port, ['--replicaof', '127.0.0.1', String(primary)]);
    }
    await waitFor(
      'the replicas to be in sync',
      async () => (await this.syncedReplicas(primary)) === this.servers.length - 1,
      timeoutMs,
      200,
      () => this.describe(),
    );
  }

  /**
   * SIGKILLs the primary, waits for the sentinels to promote a replica, then starts the dead
   * server again on its port and data: the sentinels make it a replica of the new primary. The
   * port stays this process's while the server is down (tryit/ports.ts), so it is there to restart on.
   */
  async failover(): Promise<{ from: number; to: number }> {
    const from = await this.primaryPort();
    const dead = this.servers.find((server) => server.port === from);
    if (!dead) throw new Error(`no server on the primary's port ${from}`);
    await this.group.stop(dead.name, 0, 'SIGKILL');
    let to = from;
    await waitFor(
      'a replica to be promoted',
      async () => {
        to = await this.primaryPort();
        return to !== from;
      },
      this.promotionDeadlineMs,
      200,
      () => this.describe(),
    );
    await startRedis(this.group, this.root, dead.name, dead.port);
    await waitFor(
      'the old primary to rejoin as a replica',
      async () => (await this.syncedReplicas(to)) === this.servers.length - 1,
      this.rejoinDeadlineMs,
      200,
      () => this.describe(),
    );
    return { from, to };
  }
}
