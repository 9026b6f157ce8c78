import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { configSchema, type Config } from '../core/config.js';
import { SimCredentials } from './credentials.js';
import { startRedis, startSlurm, type RedisPart, type SlurmPart } from './parts.js';
import { ProcessGroup } from './processes.js';

/** The launcher a plane's controller is configured with; a job registered there names it. */
export const SIM_LAUNCHER = 'accept';
/**
 * The control plane without the nodes: slurmctld with a list of CLOUD nodes, optionally a
 * Redis of its own, and the controller configuration that points at them. The fault and scale
 * tests put controllers (in this process or as children), Alertmanagers and simulated nodes
 * around it as each needs; the spine's SimEnvironment is the whole installation instead.
 */

const run = promisify(execFile);

export interface ControlPlaneOptions {
  readonly nodes: readonly string[];
  /** Start a Redis of its own (to crash and restart it); otherwise `redisUrl` is used. */
  readonly ownRedis?: boolean;
  readonly redisUrl?: string;
  /** Keep the working directory after stop (logs, configs). */
  readonly keepDir?: boolean;
}

export class ControlPlane {
  readonly processes = new ProcessGroup();
  /** Every role's credential, in files under the plane's directory. */
  readonly credentials: SimCredentials;
  slurm!: SlurmPart;
  redis: RedisPart | undefined;
  redisUrl = '';
  private stopped = false;

  private constructor(
    readonly root: string,
    readonly options: ControlPlaneOptions,
  ) {
    this.credentials = new SimCredentials(root);
  }

  static async start(options: ControlPlaneOptions): Promise<ControlPlane> {
    const plane = new ControlPlane(mkdtempSync(join(tmpdir(), 'steadfast-plane-')), options);
    try {
      if (options.ownRedis) {
        plane.redis = await startRedis(plane.processes, plane.root);
        plane.redisUrl = plane.redis.url;
      } else {
        if (!options.redisUrl) throw new Error('ControlPlane needs ownRedis or a redisUrl');
        plane.redisUrl = options.redisUrl;
      }
      plane.slurm = await startSlurm(plane.processes, plane.root, options.nodes);
      return plane;
    } catch (error) {
      await plane.stop();
      throw error;
    }
  }

  /** SIGKILLs the plane's own Redis and starts it again on the same port and directory (AOF replayed). */
  async crashRedis(downMs = 0): Promise<void> {
    const redis = this.redis;
    if (!redis) throw new Error('this control plane uses a shared Redis; it cannot crash it');
    await this.processes.stop('redis', 0, 'SIGKILL');
    if (downMs > 0) await new Promise((resolve) => setTimeout(resolve, downMs));
    this.redis = await startRedis(this.processes, this.root, 'redis', redis.port);
  }

  /**
   * A controller configuration for this plane: the Slurm backend through scontrol and sinfo,
   * the given key prefix, and whatever the caller overrides (validated like a config file).
   */
  controllerConfig(
    prefix: string,
    overrides: {
      controller?: object;
      safety?: object;
      policy?: object;
      backend?: object;
      analysis?: object;
      progress?: object;
      launchers?: object;
      queues?: object;
    } = {},
  ): Config {
    return configSchema.parse({
      redis: { url: this.redisUrl, prefix },
      controller: { host: '127.0.0.1', port: 0, metrics: { port: 0 }, auth: this.credentials.auth, ...overrides.controller },
      backend: { kind: 'slurm', slurm: { env: { ...this.slurm.env } }, ...overrides.backend },
      safety: { maxDrainsPerWindow: 1000, ...overrides.safety },
      policy: { ...overrides.policy },
      analysis: { ...overrides.analysis },
      progress: { ...overrides.progress },
      queues: { ...overrides.queues },
      // `true` stands in for sbatch: the simulated cluster runs no training of its own.
      launchers: { [SIM_LAUNCHER]: { kind: 'slurm', command: ['true', '{job}', '{nodes}', '{version}'] }, ...overrides.launchers },
    });
  }

  /** Times slurmctld recorded a drain reason for `node`, from its own log: the ground truth. */
  slurmDrains(node: string): number {
    const log = readFileSync(join(this.slurm.dir, 'slurmctld.log'), 'utf8');
    const marker = `update_node: node ${node} reason set to`;
    return log.split('\n').filter((line) => line.includes(marker)).length;
  }

  /** Every node with a drain reason in slurmctld's log, with how many times it was set. */
  slurmDrainCounts(): Map<string, number> {
    const log = readFileSync(join(this.slurm.dir, 'slurmctld.log'), 'utf8');
    const counts = new Map<string, number>();
    for (const match of log.matchAll(/update_node: node (\S+) reason set to/g)) {
      const node = match[1] ?? '';
      counts.set(node, (counts.get(node) ?? 0) + 1);
    }
    return counts;
  }

  /** Nodes sinfo shows drained or draining. */
  async drainedNodes(): Promise<string[]> {
    const { stdout } = await run('sinfo', ['--noheader', '--Node', '--format=%N|%T'], { env: { ...process.env, ...this.slurm.env } });
    return [
      ...new Set(
        stdout
          .split('\n')
          .map((line) => line.trim().split('|'))
          .filter(([, state]) => state !== undefined && /^drain/.test(state))
          .map(([node]) => node ?? ''),
      ),
    ];
  }

  /** Stops everything this plane started. Safe to call twice. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    await this.processes.stopAll();
    if (!this.options.keepDir) rmSync(this.root, { recursive: true, force: true });
  }
}
