import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AuditEntry } from '../core/audit.js';
import { configSchema, type Config } from '../core/config.js';
import { createLogger, silentLogger, type Logger } from '../core/log.js';
import { AGENT_SCRAPE_JOB } from '../core/scrape.js';
import { Controller } from '../controller/service.js';
import { createAgent, type Agent } from '../agent/agent.js';
import { enabledFactories } from '../agent/index.js';
import { DIAGNOSE_CONFIG_FLAG } from '../agent/collectors/diagnose.js';
import { XID_STATE_FILE_FLAG } from '../agent/collectors/kernel-log/collector.js';
import { GPU_SOURCE_FLAG, NVML_LIBRARY_FLAG } from '../agent/gpu-source.js';
import { RULE_FILES, renderAlertmanagerConfig } from '../rules/index.js';
import { createSimulatedNodes, type SimulatedNode } from './cluster.js';
import { SimCredentials } from './credentials.js';
import {
  startAlertmanager,
  startAlertmanagerPair,
  startPrometheus,
  startRedis,
  startSlurm,
  startSlurmRest,
  type AlertmanagerPart,
  type PrometheusPart,
  type RedisPart,
  type SlurmPart,
} from './parts.js';
import { ProcessGroup, freePorts, timedStep, waitFor, type StepProgress } from './processes.js';

/** The demo controller's launcher, which the demo's job registration names. */
export const DEMO_LAUNCHER = 'demo-echo';
/**
 * A whole steadfast installation on loopback: the real Redis, Prometheus, Alertmanager and
 * slurmctld, the controller with its workers, and one real agent per simulated node. The demo,
 * the end-to-end tests and the latency bench all run on it.
 */

export interface EnvironmentOptions {
  readonly nodes: number;
  readonly gpusPerNode?: number;
  /** Agents send fatal events straight to the controller (on by default). */
  readonly fastPath?: boolean;
  /** Prometheus scrape and rule evaluation interval. */
  readonly intervalSeconds?: number;
  readonly maxDrainsPerWindow?: number;
  /** Most of one job's nodes evicted per window, in percent (default 50). */
  readonly maxJobEvictionPercent?: number;
  /** Called as each part comes up, for progress output. */
  readonly progress?: StepProgress;
  /** Log controller and agents to stderr (default: silent). */
  readonly verbose?: boolean;
  /** Keep the working directory after stop (logs, configs). */
  readonly keepDir?: boolean;
  /** 2: an HA pair of Alertmanagers clustered over gossip, Prometheus sending to both (default 1). */
  readonly alertmanagers?: 1 | 2;
  /** The controller's `remedies:` section (core/remedy-config.ts); absent: every rung off. */
  readonly remedies?: Record<string, unknown>;
  /** `nvml`: each node gets a stand-in NVML library and its agent reads GPUs and Xid events through it (default: captured nvidia-smi XML). */
  readonly gpuSource?: 'nvidia-smi' | 'nvml';
}

export class SimEnvironment {
  readonly processes = new ProcessGroup();
  nodes: SimulatedNode[] = [];
  agents: Agent[] = [];
  redis!: RedisPart;
  slurm!: SlurmPart;
  /** The (first) Alertmanager. */
  alertmanager!: AlertmanagerPart;
  /** Every Alertmanager: one, or the HA pair. */
  alertmanagers: AlertmanagerPart[] = [];
  prometheus!: PrometheusPart;
  controller!: Controller;
  controllerUrl = '';
  config!: Config;
  /** Every role's credential, in files under root. */
  readonly credentials: SimCredentials;
  private readonly logger: Logger;
  private agentPorts: number[] = [];
  private stopped = false;

  private constructor(
    readonly root: string,
    readonly options: EnvironmentOptions,
  ) {
    this.logger = options.verbose ? createLogger('steadfast-sim') : silentLogger();
    this.credentials = new SimCredentials(root);
  }

  /** Makes an environment without starting anything, so a caller can arrange its cleanup first. */
  static create(options: EnvironmentOptions): SimEnvironment {
    return new SimEnvironment(mkdtempSync(join(tmpdir(), 'steadfast-sim-')), options);
  }

  static async start(options: EnvironmentOptions): Promise<SimEnvironment> {
    const env = SimEnvironment.create(options);
    await env.up();
    return env;
  }

  /** Starts every part; on failure stops whatever had started and rethrows. */
  async up(): Promise<void> {
    try {
      await this.bringUp();
    } catch (error) {
      await this.stop();
      throw error;
    }
  }

  private step<T>(name: string, work: () => Promise<T>): Promise<T> {
    return timedStep(this.options.progress, name, work);
  }

  private async bringUp(): Promise<void> {
    const { options, root, processes } = this;
    const interval = options.intervalSeconds ?? 1;
    this.nodes = await this.step(`created ${options.nodes} simulated nodes`, async () => createSimulatedNodes(root, options.nodes, options.gpusPerNode ?? 8));
    if (options.gpuSource === 'nvml') {
      await this.step('an NVML library on every node', () => Promise.all(this.nodes.map((node) => node.useNvml())));
    }
    const names = this.nodes.map((node) => node.name);
    this.redis = await this.step('Redis up (AOF, fsync always)', () => startRedis(processes, root));
    this.slurm = await this.step(`slurmctld up with ${names.length} CLOUD nodes`, () => startSlurm(processes, root, names));
    const slurmRest = await this.step('slurmrestd up in front of it (JWT from scontrol token)', () => startSlurmRest(processes, this.slurm));

    // Agent ports are chosen first so the controller knows where each node's agent listens.
    const [controllerPort = 0, controllerMetricsPort = 0, ...agentPorts] = await freePorts(2 + names.length);
    this.agentPorts = agentPorts;
    this.controllerUrl = `http://127.0.0.1:${controllerPort}`;
    this.config = configSchema.parse({
      redis: { url: this.redis.url, prefix: 'steadfast' },
      controller: { host: '127.0.0.1', port: controllerPort, metrics: { port: controllerMetricsPort }, auth: this.credentials.auth },
      backend: { kind: 'slurm', slurm: { env: { ...this.slurm.env }, rest: { url: slurmRest.url, user: slurmRest.user, tokenFile: slurmRest.tokenFile } } },
      safety: {
        maxDrainsPerWindow: options.maxDrainsPerWindow ?? 4,
        ...(options.maxJobEvictionPercent === undefined ? {} : { maxJobEvictionPercent: options.maxJobEvictionPercent }),
      },
      // Each agent's POST endpoints take only its own node's token, derived from this secret.
      agents: {
        urls: Object.fromEntries(names.map((name, index) => [name, `http://127.0.0.1:${agentPorts[index]}`])),
        diagnoseTimeoutSeconds: 30,
        secretFile: this.credentials.agentWebSecretFile,
      },
      ...(options.remedies === undefined ? {} : { remedies: options.remedies }),
      // Short rounds: the demo should not wait 40 s for stack aggregation.
      analysis: { stackRoundSeconds: 1 },
      // The demo has no real training to submit: its launcher echoes the sbatch it would run.
      launchers: { [DEMO_LAUNCHER]: { kind: 'slurm', command: ['echo', 'sbatch', '--job-name={job}', '--nodelist={nodes}', 'train.sh', '{version}'] } },
    });
    this.controller = new Controller({ config: this.config, logger: this.logger });
    await this.step('controller and workers up', () => this.controller.start());

    const alertmanagerConfig = renderAlertmanagerConfig({
      webhookUrl: `${this.controllerUrl}/api/v1/alerts`,
      credentialsFile: this.credentials.alertmanagerTokenFile,
      groupWait: '0s',
      groupInterval: '1s',
    });
    this.alertmanagers =
      options.alertmanagers === 2
        ? await this.step('Alertmanager HA pair up (gossip on loopback), routing to the controller', () =>
            startAlertmanagerPair(processes, root, alertmanagerConfig),
          )
        : [await this.step('Alertmanager up, routing to the controller', () => startAlertmanager(processes, root, alertmanagerConfig))];
    this.alertmanager = this.alertmanagers[0] as AlertmanagerPart;

    this.agents = await this.step(`${names.length} agents up`, async () => this.nodes.map((node, index) => this.makeAgent(node, agentPorts[index] ?? 0)));
    const addresses = await Promise.all(this.agents.map((agent) => agent.start()));

    this.prometheus = await this.step('Prometheus up with the steadfast rules', () =>
      startPrometheus(processes, root, {
        targets: addresses.map((address, index) => ({ address: `127.0.0.1:${address.port}`, labels: { node: names[index] ?? '' } })),
        ruleFiles: RULE_FILES,
        alertmanagerAddress: this.alertmanager.address,
        extraAlertmanagerAddresses: this.alertmanagers.slice(1).map((part) => part.address),
        intervalSeconds: interval,
        controllerMetricsAddress: `127.0.0.1:${controllerMetricsPort}`,
      }),
    );
    await this.step('Prometheus scraping every agent and connected to Alertmanager', () => this.waitForScrapes());
  }

  /** Prometheus finds its targets and Alertmanager some seconds after start; wait for both. */
  private async waitForScrapes(): Promise<void> {
    await waitFor(
      'Prometheus to scrape every agent',
      async () => {
        const response = await fetch(`${this.prometheus.url}/api/v1/targets?state=active`);
        const body = (await response.json()) as { data: { activeTargets: { health: string; scrapePool: string }[] } };
        const targets = body.data.activeTargets.filter((target) => target.scrapePool === AGENT_SCRAPE_JOB);
        return targets.length === this.agents.length && targets.every((target) => target.health === 'up');
      },
      30_000,
      200,
    );
    await waitFor(
      'Prometheus to discover Alertmanager',
      async () => {
        const response = await fetch(`${this.prometheus.url}/api/v1/alertmanagers`);
        const body = (await response.json()) as { data: { activeAlertmanagers: unknown[] } };
        return body.data.activeAlertmanagers.length >= this.alertmanagers.length;
      },
      30_000,
      200,
    );
  }

  /** The agent of one simulated node, as the environment runs them. */
  private makeAgent(node: SimulatedNode, port: number): Agent {
    const options = this.options;
    return createAgent({
      node: node.name,
      listen: { host: '127.0.0.1', port },
      paths: { sysfs: join(node.dir, 'sys'), procfs: node.procfs, kmsg: node.kmsgPath, nvidiaSmiXml: node.xmlPath, nvidiaSmi: node.nvidiaSmi },
      pollIntervalSeconds: (options.intervalSeconds ?? 1) / 2,
      // Simulated nodes have a kernel log and nvidia-smi output but no /sys or /proc trees
      // of their own yet; collectors without a source would only report failure.
      collectors: enabledFactories({ rdma: false, nfs: false, process: false, diagnose: true, 'gpu-reset': true }),
      settings: {
        [DIAGNOSE_CONFIG_FLAG]: node.diagnosticsConfig,
        [XID_STATE_FILE_FLAG]: node.xidStateFile,
        ...(node.nvml ? { [GPU_SOURCE_FLAG]: 'nvml', [NVML_LIBRARY_FLAG]: node.nvml.library } : {}),
      },
      controllerUrl: (options.fastPath ?? true) ? this.controllerUrl : undefined,
      controllerToken: this.credentials.agentToken(node.name),
      apiToken: readFileSync(this.credentials.agentWebTokenFile(node.name), 'utf8').trim(),
      logger: this.logger.child({ node: node.name }),
    });
  }

  /**
   * Restarts one node's agent on the same port, as a crash or an upgrade would: its in-process
   * counters start over, and what it reported on the fast path stays reported (its xid state
   * file). With `rotateKernelLog` the kernel log is replaced by an empty one first (a reboot, or
   * log rotation), so the Xids seen before are gone for the new agent; `downMs` keeps it stopped
   * that long, so Prometheus misses scrapes in between.
   */
  async restartAgent(name: string, options: { rotateKernelLog?: boolean; downMs?: number } = {}): Promise<void> {
    const index = this.nodes.findIndex((candidate) => candidate.name === name);
    const agent = this.agents[index];
    const node = this.nodes[index];
    if (index < 0 || !agent || !node) throw new Error(`no agent for ${name}`);
    await agent.close();
    if (options.downMs) await new Promise((resolve) => setTimeout(resolve, options.downMs));
    if (options.rotateKernelLog) {
      renameSync(node.kmsgPath, `${node.kmsgPath}.1`);
      writeFileSync(node.kmsgPath, '');
    }
    const restarted = this.makeAgent(node, this.agentPorts[index] ?? 0);
    this.agents[index] = restarted;
    await restarted.start();
  }

  node(name: string): SimulatedNode {
    const node = this.nodes.find((candidate) => candidate.name === name);
    if (!node) throw new Error(`no simulated node ${name}`);
    return node;
  }

  audit(node?: string): Promise<AuditEntry[]> {
    return this.controller.audit.read({ limit: 10_000, node });
  }

  /** Stops everything this environment started. Safe to call twice. */
  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    try {
      await Promise.allSettled(this.agents.map((agent) => agent.close()));
      await this.controller?.close();
    } finally {
      await this.processes.stopAll();
      if (!this.options.keepDir) rmSync(this.root, { recursive: true, force: true });
    }
  }
}
