import { execFile } from 'node:child_process';
import { appendFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { pino } from 'pino';
import { stringify } from 'yaml';
import type { AuditEntry } from '../../core/audit.js';
import { configSchema, type Config } from '../../core/config.js';
import { launchArgv } from '../../core/job.js';
import type { SlurmLauncher } from '../../core/launcher.js';
import type { Logger } from '../../core/log.js';
import { repoRoot } from '../../core/paths.js';
import { AGENT_SCRAPE_JOB } from '../../core/scrape.js';
import { Controller } from '../../controller/service.js';
import { renderRuleFiles } from '../../rules/build.js';
import { RULE_FILES, renderAlertmanagerConfig } from '../../rules/index.js';
import { DEFAULT_THRESHOLDS } from '../../rules/thresholds.js';
import { startAlertmanager, startPrometheus, startRedis, type AlertmanagerPart, type PrometheusPart, type RedisPart } from '../parts.js';
import { createSimulatedNodes, type SimulatedNode } from '../cluster.js';
import { SimCredentials } from '../credentials.js';
import { ProcessGroup, freePorts, httpOk, waitFor } from '../processes.js';
import { LabError } from './command.js';
import { LAB_AGENT_PORT, LAB_MICROBATCHES_PER_RANK, type ProtectedLabOptions } from './protected-options.js';
import { LAB_DIAGNOSTICS } from './diagnostics.js';
import { labDown, type LabDownReport } from './down.js';
import { labLayout, type LabLayout, type LabNode } from './layout.js';
import { nodeCommand, slurmEnv } from './slurm.js';
import { startRendezvousStore } from './rendezvous-store.js';
import { slowLink } from './network.js';
import { JobLog, jobLogFile, launcherCommand, writeCodeVersion, type TrainingPaths } from './training.js';
import { labUp } from './up.js';

/**
 * The lab under steadfast's protection: `steadfast lab up` (real slurmd nodes in network
 * namespaces, standbys in the reservation) plus the rest of an installation around it — Redis,
 * Prometheus with the rules, Alertmanager, the controller with the Slurm backend on the lab's
 * slurm.conf, and one agent per node started inside that node's namespaces, reading the node's
 * own kernel log file, the training log its node writes and the process tree — and the PyTorch
 * example registered as a training job whose launcher is real sbatch. `steadfast demo --scenario
 * training` and test/lab/ run the scenarios (scenarios.ts) on it.
 */

const run = promisify(execFile);

/** The name of the lab's launcher in the controller's configuration; the job registration names it. */
const LAB_LAUNCHER = 'lab-sbatch';

export class ProtectedLab {
  readonly processes = new ProcessGroup();
  readonly layout: LabLayout;
  readonly paths: TrainingPaths;
  readonly job: string;
  /** Every role's credential, each in its own file under the root; each node's agent token too. */
  readonly credentials: SimCredentials;
  readonly log: JobLog;
  redis!: RedisPart;
  prometheus!: PrometheusPart;
  alertmanager!: AlertmanagerPart;
  controller!: Controller;
  config!: Config;
  controllerUrl = '';
  rendezvous: string | undefined; // the hot-swap rendezvous store's host:port, with options.spares
  /** The simulated GPUs of each node, with options.gpuReset. */
  readonly gpus = new Map<string, SimulatedNode>();
  /** With options.preflight: the node whose link lab up slowed, and when. */
  linkSlowed: { readonly node: string; readonly at: number } | undefined;
  private labStarted = false;
  private stopped = false;
  private readonly logger: Logger;

  private constructor(
    readonly root: string,
    readonly options: ProtectedLabOptions,
  ) {
    this.layout = labLayout({
      dir: join(root, 'lab'),
      nodes: (options.nodes ?? 2) + (options.spares ?? 0),
      standbys: options.standbys ?? 2,
      ...(options.prefix === undefined ? {} : { prefix: options.prefix }),
      ...(options.subnet === undefined ? {} : { subnet: options.subnet }),
    });
    this.job = options.job ?? 'lab-train';
    this.paths = {
      code: join(root, 'code'),
      logs: join(root, 'logs'),
      checkpoints: join(root, 'checkpoints'),
      stacks: join(root, 'stacks'),
      faults: join(root, 'faults'),
    };
    this.credentials = new SimCredentials(root);
    this.log = new JobLog(this.paths.logs, this.job);
    // The controller runs in this process; its log goes to a file under the root unless asked for.
    this.logger = pino(
      { name: 'steadfast-controller', level: 'info' },
      pino.destination(options.verbose ? { fd: 2, sync: true } : { dest: join(root, 'controller.log'), sync: true }),
    );
  }

  /** Makes the lab's directory without starting anything, so the caller can arrange cleanup first. */
  static create(options: ProtectedLabOptions = {}): ProtectedLab {
    return new ProtectedLab(mkdtempSync(join(tmpdir(), 'steadfast-protected-')), options);
  }

  /** The job's own nodes: the compute nodes before the spares. */
  get computeNodes(): LabNode[] {
    return this.layout.nodes.filter((node) => node.role === 'compute').slice(0, this.options.nodes ?? 2);
  }

  /** The hot-swap spares: compute nodes of the allocation after the job's own. */
  get spareNodes(): LabNode[] {
    return this.layout.nodes.filter((node) => node.role === 'compute').slice(this.options.nodes ?? 2);
  }

  get conf(): string {
    return this.layout.conf;
  }

  node(name: string): LabNode {
    const node = this.layout.nodes.find((candidate) => candidate.name === name);
    if (!node) throw new LabError(`no lab node ${name}`);
    return node;
  }

  /** The node's kernel log: the file its agent follows as /dev/kmsg; faults are appended to it. */
  kernelLog(node: string): string {
    return join(this.root, 'nodes', node, 'kern.log');
  }

  agentUrl(node: LabNode): string {
    return `http://${node.address}:${LAB_AGENT_PORT}`;
  }

  private async step<T>(what: string, work: () => Promise<T>): Promise<T> {
    const started = performance.now();
    const result = await work();
    this.options.progress?.(what, (performance.now() - started) / 1000);
    return result;
  }

  /** Starts everything; on failure removes whatever had started and rethrows. */
  async up(): Promise<void> {
    try {
      await this.bringUp();
    } catch (error) {
      await this.down().catch(() => undefined);
      throw error;
    }
  }

  private async bringUp(): Promise<void> {
    const { layout, root } = this;
    for (const dir of Object.values(this.paths)) mkdirSync(dir, { recursive: true });
    for (const node of layout.nodes) {
      mkdirSync(dirname(this.kernelLog(node.name)), { recursive: true });
      writeFileSync(this.kernelLog(node.name), '');
      // Empty until the node is a run's batch host; sbatch appends (--open-mode=append).
      writeFileSync(jobLogFile(this.paths, this.job, node.name), '');
    }
    for (const node of layout.nodes) {
      this.credentials.agentTokenFile(node.name);
      this.credentials.agentWebTokenFile(node.name);
    }
    writeFileSync(join(root, 'diagnostics.yaml'), stringify(LAB_DIAGNOSTICS));

    this.labStarted = true;
    const spares = this.spareNodes.length === 0 ? '' : `, ${this.spareNodes.length} spares`;
    await this.step(
      `lab up: ${this.computeNodes.length} slurmd nodes${spares} and ${layout.nodes.length - this.computeNodes.length - this.spareNodes.length} standbys in network namespaces`,
      () => labUp({ ...layout.options, dir: layout.dir }),
    );
    this.redis = await this.step('Redis up', () => startRedis(this.processes, root));
    if ((this.options.spares ?? 0) > 0) this.rendezvous = await this.step("the ranks' rendezvous store up on the bridge", () => startRendezvousStore(this));

    const [controllerPort, controllerMetricsPort, prometheusPort] = await freePorts(3);
    // On the bridge: the agents' fast path and the ranks' client come from the namespaces.
    this.controllerUrl = `http://${layout.bridgeAddress}:${controllerPort}`;
    this.config = configSchema.parse({
      redis: { url: this.redis.url, prefix: 'steadfast' },
      controller: { host: layout.bridgeAddress, port: controllerPort, metrics: { port: controllerMetricsPort }, auth: this.credentials.auth },
      backend: { kind: 'slurm', slurm: { env: slurmEnv(layout.conf), standbyReservation: layout.options.reservation } },
      // The hot-swap lab's two cases take two nodes out of a 2-node job within the hour.
      safety: { maxDrainsPerWindow: 10, maxJobEvictionPercent: (this.options.spares ?? 0) > 0 ? 100 : 50 },
      // The lab's incidents come a minute apart, not hours: the ladder's waits are scaled down.
      recovery: { retryInitialBackoffSeconds: 5, retryMaxBackoffSeconds: 60, crashAfterEvictionWindowSeconds: 20 },
      progress: { prometheusUrl: `http://127.0.0.1:${prometheusPort}`, timeoutSeconds: 180 },
      agents: {
        urls: Object.fromEntries(layout.nodes.map((node) => [node.name, this.agentUrl(node)])),
        // Each agent's web token is its own, derived from this secret: one leaked token opens one agent.
        secretFile: this.credentials.agentWebSecretFile,
        diagnoseTimeoutSeconds: 120,
      },
      analysis: {
        stackRoundSeconds: 1,
        ...(this.options.failSlow === undefined
          ? {}
          : {
              failSlowIntervalSeconds: this.options.failSlow.intervalSeconds,
              failSlowCostSeconds: this.options.failSlow.costSeconds,
              failSlowThreshold: this.options.failSlow.threshold,
            }),
      },
      // The operator's launcher the job names: real sbatch on the lab's slurm.conf.
      launchers: { [LAB_LAUNCHER]: this.launcher() },
      ...(this.options.gpuReset ? { remedies: { gpuReset: { enabled: true, timeoutSeconds: 30 } } } : {}),
    });
    if (this.options.gpuReset) {
      createSimulatedNodes(join(root, 'gpus'), layout.nodes.length, 8).forEach((gpus, index) => this.gpus.set(layout.nodes[index]?.name ?? '', gpus));
    }
    writeFileSync(join(root, 'controller.yml'), stringify(this.config));
    this.controller = new Controller({ config: this.config, logger: this.logger });
    await this.step(`controller on ${this.controllerUrl}, Slurm backend on the lab's slurm.conf`, () => this.controller.start());

    const alertmanagerConfig = renderAlertmanagerConfig({
      webhookUrl: `${this.controllerUrl}/api/v1/alerts`,
      credentialsFile: this.credentials.alertmanagerTokenFile,
      groupWait: '0s',
      groupInterval: '1s',
    });
    this.alertmanager = await this.step('Alertmanager up, routing to the controller', () => startAlertmanager(this.processes, root, alertmanagerConfig));

    await this.step(`${layout.nodes.length} agents up, each inside its node's namespaces`, async () => {
      for (const node of layout.nodes) this.startAgent(node);
      await Promise.all(layout.nodes.map((node) => waitFor(`the agent of ${node.name}`, () => httpOk(`${this.agentUrl(node)}/healthz`), 60_000, 200)));
    });

    const ruleFiles = await this.ruleFiles();
    this.prometheus = await this.step('Prometheus up with the rules, scraping the agents over the bridge', () =>
      startPrometheus(this.processes, root, {
        targets: layout.nodes.map((node) => ({ address: `${node.address}:${LAB_AGENT_PORT}`, labels: { node: node.name } })),
        ruleFiles,
        alertmanagerAddress: this.alertmanager.address,
        intervalSeconds: 1,
        controllerMetricsAddress: `${layout.bridgeAddress}:${controllerMetricsPort}`,
        port: prometheusPort,
      }),
    );
    await this.step('Prometheus scraping every agent', () =>
      waitFor(
        'Prometheus to scrape every agent',
        async () => {
          const response = await fetch(`${this.prometheus.url}/api/v1/targets?state=active`);
          const body = (await response.json()) as { data: { activeTargets: { health: string; scrapePool: string }[] } };
          const targets = body.data.activeTargets.filter((target) => target.scrapePool === AGENT_SCRAPE_JOB);
          return targets.length === layout.nodes.length && targets.every((target) => target.health === 'up');
        },
        60_000,
        200,
      ),
    );
    const preflight = this.options.preflight;
    if (preflight)
      this.linkSlowed = await this.step(`a node's link slowed to ${preflight.rateMbit} Mbit/s (tc tbf)`, () => slowLink(this.computeNodes, preflight));
    this.log.start();
  }

  /** The shipped rule files, or the rules rendered with the lab's stalled-progress bound. */
  private async ruleFiles(): Promise<readonly string[]> {
    const noProgressSeconds = this.options.noProgressSeconds;
    if (noProgressSeconds === undefined) return RULE_FILES;
    const rendered = await renderRuleFiles({ ...DEFAULT_THRESHOLDS, training: { ...DEFAULT_THRESHOLDS.training, noProgressSeconds } });
    const dir = join(this.root, 'rules');
    mkdirSync(dir, { recursive: true });
    return [...rendered].map(([domain, text]) => {
      const path = join(dir, `${domain}.yml`);
      writeFileSync(path, text);
      return path;
    });
  }

  /** `steadfast agent` as a process of the node: its network, hostname and hosts file. */
  private startAgent(node: LabNode): void {
    const entry = fileURLToPath(import.meta.url).endsWith('.ts')
      ? ['--import', 'tsx', join(repoRoot(), 'cli', 'main.ts')]
      : [join(repoRoot(), 'dist', 'cli', 'main.js')];
    const argv = [
      process.execPath,
      ...entry,
      'agent',
      '--node',
      node.name,
      '--web.listen-address',
      `0.0.0.0:${LAB_AGENT_PORT}`,
      '--path.kmsg',
      this.kernelLog(node.name),
      // No GPU, RDMA or NFS in the lab.
      '--no-collector.gpu',
      '--no-collector.rdma',
      '--no-collector.nfs',
      '--training.log',
      `${this.job}=${jobLogFile(this.paths, this.job, node.name)}`,
      '--collector.diagnose',
      '--diagnose.config',
      join(this.root, 'diagnostics.yaml'),
      '--controller.url',
      this.controllerUrl,
      '--controller.token-file',
      this.credentials.agentTokenFile(node.name),
      '--web.token-file',
      this.credentials.agentWebTokenFile(node.name),
      ...(this.gpus.has(node.name) ? ['--collector.gpu-reset', '--nvidia-smi.path', this.gpus.get(node.name)?.nvidiaSmi ?? ''] : []),
    ];
    const { command, args } = nodeCommand(this.layout, node, argv);
    this.processes.start(`agent-${node.name}`, command, args, join(this.root, 'logs', `agent-${node.name}.log`), { cwd: repoRoot() });
  }

  /** The Slurm launcher the controller is configured with, under LAB_LAUNCHER. */
  launcher(): SlurmLauncher {
    return {
      kind: 'slurm',
      command: launcherCommand(this.paths, {
        job: this.job,
        nodes: this.computeNodes.length,
        checkpointEvery: this.options.checkpointEvery ?? 10,
        stepSleep: this.options.stepSleep ?? 0.02,
        controllerUrl: this.controllerUrl,
        // Each rank reports checkpoints with its own node's agent token (the client fills in {node}).
        tokenFile: join(this.root, 'agent-token-{node}'),
        agentTokenFile: join(this.root, 'agent-web-token-{node}'),
        ...(this.rendezvous === undefined ? {} : { hotSwap: { rendezvous: this.rendezvous } }),
        ...(this.options.preflight === undefined
          ? {}
          : { preflight: { args: ['--threshold', String(this.options.preflight.thresholdSeconds), '--megabytes', '1', '--timeout', '5'] } }),
      }),
    };
  }

  /**
   * Registers the job with the controller (`POST /api/v1/jobs`) on the compute nodes at code
   * version v1, then submits its first run with the same launcher argv the controller will use.
   * Returns the Slurm job id.
   */
  async startTraining(): Promise<string> {
    writeCodeVersion(this.paths, 'v1');
    const nodes = this.computeNodes.map((node) => node.name);
    const launcher = this.launcher();
    // Data-parallel only: one rank per node, each a replica.
    const microbatches = this.options.failSlow === undefined ? {} : { microbatches: { perIteration: nodes.length * LAB_MICROBATCHES_PER_RANK } };
    const spares = this.spareNodes.map((node) => node.name);
    const hotSwap = spares.length === 0 ? {} : { hotSwap: { spares } };
    const registered = await this.api('/api/v1/jobs', {
      name: this.job,
      nodes,
      ranksPerNode: 1,
      topology: { dp: nodes.length },
      launcher: LAB_LAUNCHER,
      codeVersion: 'v1',
      ...microbatches,
      ...hotSwap,
    });
    if (registered.status !== 201) throw new LabError(`registering ${this.job} failed: ${registered.status} ${JSON.stringify(registered.body)}`);
    // A hot-swap job's allocation is its nodes and its spares, as the controller's relaunch gives {nodes}.
    const argv = launchArgv(launcher, { job: this.job, nodes: [...nodes, ...spares], version: 'v1' });
    const { stdout } = await run(argv[0] ?? 'sbatch', argv.slice(1), { env: { ...process.env, ...slurmEnv(this.conf) }, timeout: 30_000 });
    return stdout.trim().split(';')[0] ?? '';
  }

  /** A controller API call with the token. */
  async api(path: string, body?: unknown): Promise<{ status: number; body: Record<string, unknown> }> {
    const response = await fetch(`${this.controllerUrl}${path}`, {
      method: body === undefined ? 'GET' : 'POST',
      headers: { authorization: `Bearer ${this.credentials.operator}`, 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(10_000),
    });
    return { status: response.status, body: (await response.json()) as Record<string, unknown> };
  }

  /**
   * A kernel log line as the NVIDIA driver prints it, in the rsyslog format of /var/log/kern.log,
   * appended to the node's kernel log. Returns when it was written.
   */
  injectXid(node: string, xid = 79, message = 'GPU has fallen off the bus.', pciBusId = '0000:3a:00', pid?: number): number {
    const now = new Date();
    const owner = pid === undefined ? "pid='<unknown>', name=<unknown>" : `pid=${pid}, name=python3`;
    appendFileSync(this.kernelLog(node), `${now.toISOString()} ${node} kernel: NVRM: Xid (PCI:${pciBusId}): ${xid}, ${owner}, ${message}\n`);
    return now.getTime();
  }

  /** The controller's log file, unless it goes to stderr (options.verbose). */
  get controllerLogPath(): string | undefined {
    return this.options.verbose ? undefined : join(this.root, 'controller.log');
  }

  async audit(): Promise<AuditEntry[]> {
    return this.controller.audit.read({ limit: 10_000 });
  }

  async jobRecord(): Promise<{ state: string; nodes: string[]; version: string }> {
    const record = await this.controller.jobs.get(this.job);
    return { state: record.state, nodes: record.spec.nodes, version: record.spec.codeVersion };
  }

  /** A Slurm command against the lab's slurm.conf; its stdout. */
  private async slurm(command: string, args: string[]): Promise<string> {
    return (await run(command, args, { env: { ...process.env, ...slurmEnv(this.conf) }, timeout: 10_000 })).stdout;
  }

  /** `scontrol show job` of one Slurm job (the lab keeps finished jobs for MinJobAge, 300 s). */
  async slurmJob(id: string): Promise<{ state: string; nodes: string; exitCode: string }> {
    const stdout = await this.slurm('scontrol', ['show', 'job', '--oneliner', id]);
    return {
      state: /\bJobState=(\S+)/.exec(stdout)?.[1] ?? '',
      nodes: / NodeList=(\S+)/.exec(stdout)?.[1] ?? '',
      exitCode: /\bExitCode=(\S+)/.exec(stdout)?.[1] ?? '',
    };
  }

  /** Ids of the job's Slurm runs still queued, running or completing. */
  async queued(): Promise<string[]> {
    const stdout = await this.slurm('squeue', ['--noheader', `--name=${this.job}`, '--format=%A']);
    return stdout
      .split('\n')
      .map((line) => line.trim())
      .filter(Boolean);
  }

  /** Drains a node by hand, as an administrator would (`scontrol update … State=DRAIN Reason=…`). */
  async adminDrain(node: string, reason: string): Promise<void> {
    await this.slurm('scontrol', ['update', `NodeName=${node}`, 'State=DRAIN', `Reason=${reason}`]);
  }

  async sinfo(node: string): Promise<{ state: string; reason: string }> {
    const stdout = await this.slurm('sinfo', ['--noheader', '--Node', `--nodes=${node}`, '--format=%T|%E']);
    const [state = '', reason = ''] = (stdout.trim().split('\n')[0] ?? '').split('|');
    return { state, reason };
  }

  /**
   * Stops everything: the controller first (so it relaunches nothing while the lab goes), then
   * `lab down` (cancels the jobs, stops the slurmds, kills whatever is left in the namespaces —
   * the agents too — and removes namespaces, veths and bridge), then the parts. Safe to call twice.
   */
  async down(): Promise<LabDownReport | undefined> {
    if (this.stopped) return undefined;
    this.stopped = true;
    this.log.stop();
    let report: LabDownReport | undefined;
    try {
      await this.controller?.close().catch(() => undefined);
      if (this.labStarted) report = await labDown({ dir: this.layout.dir, prefix: this.layout.options.prefix });
    } finally {
      await this.processes.stopAll();
      if (!this.options.keepDir) rmSync(this.root, { recursive: true, force: true });
    }
    return report;
  }
}
