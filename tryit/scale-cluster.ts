import { setTimeout as sleep } from 'node:timers/promises';
import type { ClusterBackend } from '../actuators/backend.js';
import { AuditLog, type AuditEntry } from '../core/audit.js';
import { instantQuery } from '../core/prometheus.js';
import { Keys, workerConnection, type Redis } from '../core/redis.js';
import { AGENT_SCRAPE_JOB } from '../core/scrape.js';
import { createBackend } from '../actuators/backend-from-config.js';
import { RULE_FILES, renderAlertmanagerConfig } from '../rules/index.js';
import { ControlPlane, SIM_LAUNCHER } from './control-plane.js';
import { ControllerProcess } from './controller-process.js';
import { SimulatedFleet } from './many-nodes.js';
import { startAlertmanager, startPrometheus, type AlertmanagerPart, type PrometheusPart } from './parts.js';
import { freePorts, timedStep, waitFor, type StepProgress } from './processes.js';

/**
 * A large simulated cluster on the real parts: one SimulatedFleet serving every node's
 * exposition, the real Prometheus scraping each node as a target with the shipped rules, the
 * real Alertmanager, Redis and slurmctld (one CLOUD node per simulated node), and the controller
 * as its own process (`steadfast controller`), its online analyzers reading that Prometheus. The
 * fleet runs in the caller's process, so its cost is not charged to the controller. The scale
 * test and bench/scale.ts measure signal → action latency on it.
 */

const PREFIX = 'scale';

export interface ScaleClusterOptions {
  readonly nodes: number;
  /** Prometheus scrape and rule evaluation interval (default 1 s). */
  readonly intervalSeconds?: number;
  /** Nodes from the end of the list that run one registered training job (default none). */
  readonly jobNodes?: number;
  readonly progress?: StepProgress;
}

export interface InjectionResult {
  readonly node: string;
  readonly path: 'fast' | 'prometheus';
  /** Injection → the drain action recorded done (the backend confirmed the node drained). */
  readonly latencyMs: number | undefined;
  /** Where the first report of the fault that the controller audited came from (the signal's source). */
  readonly firstReportFrom: string | undefined;
}

function streamMs(id: string): number {
  return Number(id.split('-')[0]);
}

export function scaleNodeNames(count: number): string[] {
  const width = String(count).length;
  return Array.from({ length: count }, (_, index) => `sim-${String(index + 1).padStart(width, '0')}`);
}

export class ScaleCluster {
  plane!: ControlPlane;
  /** The controller runs as its own process, as in production: the fleet's load is not its load. */
  controller!: ControllerProcess;
  controllerUrl = '';
  /** The controller's metrics listener. */
  controllerMetricsUrl = '';
  audit!: AuditLog;
  private backend!: ClusterBackend;
  fleet!: SimulatedFleet;
  alertmanager!: AlertmanagerPart;
  prometheus!: PrometheusPart;
  readonly names: string[];
  private redis!: Redis;
  private readonly keys = new Keys(PREFIX);
  private stopped = false;

  private constructor(readonly options: ScaleClusterOptions) {
    this.names = scaleNodeNames(options.nodes);
  }

  static async start(options: ScaleClusterOptions): Promise<ScaleCluster> {
    const cluster = new ScaleCluster(options);
    try {
      await cluster.up();
      return cluster;
    } catch (error) {
      await cluster.stop();
      throw error;
    }
  }

  private step<T>(name: string, work: () => Promise<T>): Promise<T> {
    return timedStep(this.options.progress, name, work);
  }

  private async up(): Promise<void> {
    const interval = this.options.intervalSeconds ?? 1;
    this.plane = await this.step(`Redis and slurmctld with ${this.names.length} CLOUD nodes`, () => ControlPlane.start({ nodes: this.names, ownRedis: true }));
    // Ports first: the controller's analyzers read Prometheus, the fleet's fast path posts to the controller.
    const [controllerPort, controllerMetricsPort, prometheusPort] = await freePorts(3);
    this.controllerUrl = `http://127.0.0.1:${controllerPort}`;
    this.controllerMetricsUrl = `http://127.0.0.1:${controllerMetricsPort}`;
    const jobNodes = this.names.slice(this.names.length - (this.options.jobNodes ?? 0));
    this.redis = workerConnection(this.plane.redisUrl);
    const config = this.plane.controllerConfig(PREFIX, {
      // Every simulated node shares 127.0.0.1, as clients behind a load balancer share its address.
      controller: { port: controllerPort, metrics: { port: controllerMetricsPort }, connections: { maxPerClient: 0 } },
      // With a job: fail-slow and multi-signal detection on it, every 5 s, from this Prometheus.
      ...(jobNodes.length > 0 ? { analysis: { prometheusUrl: `http://127.0.0.1:${prometheusPort}`, detectorIntervalSeconds: 5 } } : {}),
    });
    this.controller = new ControllerProcess(this.plane.processes, { name: 'controller', dir: this.plane.root, config });
    await this.step('controller process (HTTP and workers)', () => this.controller.start());
    this.audit = new AuditLog(this.redis, this.keys);
    this.backend = createBackend(config, this.redis, this.keys);
    this.fleet = new SimulatedFleet({ nodes: this.names, controllerUrl: this.controllerUrl, agentToken: (node) => this.plane.credentials.agentToken(node) });
    await this.fleet.start();

    this.alertmanager = await this.step('Alertmanager', () =>
      startAlertmanager(
        this.plane.processes,
        this.plane.root,
        renderAlertmanagerConfig({
          webhookUrl: `${this.controllerUrl}/api/v1/alerts`,
          credentialsFile: this.plane.credentials.alertmanagerTokenFile,
          groupWait: '0s',
          groupInterval: '1s',
        }),
      ),
    );
    this.prometheus = await this.step(`Prometheus scraping ${this.names.length} node targets`, () =>
      startPrometheus(this.plane.processes, this.plane.root, {
        targets: this.fleet.targets(),
        ruleFiles: RULE_FILES,
        alertmanagerAddress: this.alertmanager.address,
        intervalSeconds: interval,
        controllerMetricsAddress: `127.0.0.1:${controllerMetricsPort}`,
        port: prometheusPort,
      }),
    );
    await this.step('Prometheus scraping every node and connected to Alertmanager', () => this.waitForScrapes());
    // The job last, once the Prometheus its analyzers read is up: registered earlier, its first
    // fail-slow and multi-signal checks would find no Prometheus to ask.
    if (jobNodes.length > 0) await this.registerJob(jobNodes);
  }

  /** One training job over `nodes`, one rank each, whose nodes export training progress. */
  private async registerJob(nodes: readonly string[]): Promise<void> {
    this.fleet.runJob('scale-job', nodes);
    const response = await fetch(`${this.controllerUrl}/api/v1/jobs`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${this.plane.credentials.operator}` },
      body: JSON.stringify({
        name: 'scale-job',
        nodes,
        ranksPerNode: 1,
        topology: { pp: 1, dp: nodes.length, order: 'tp-dp-pp' },
        launcher: SIM_LAUNCHER,
        codeVersion: 'v1',
      }),
    });
    await response.arrayBuffer();
    if (response.status !== 201) throw new Error(`registering the scale job answered ${response.status}`);
  }

  private async waitForScrapes(): Promise<void> {
    await waitFor('Prometheus to scrape every simulated node', async () => (await this.targetHealth()).up === this.names.length, 60_000, 250);
    await waitFor(
      'Prometheus to discover Alertmanager',
      async () => {
        const body = (await (await fetch(`${this.prometheus.url}/api/v1/alertmanagers`)).json()) as { data: { activeAlertmanagers: unknown[] } };
        return body.data.activeAlertmanagers.length > 0;
      },
      30_000,
      200,
    );
  }

  /** Node targets up and down as Prometheus sees them. */
  async targetHealth(): Promise<{ up: number; down: number }> {
    const body = (await (await fetch(`${this.prometheus.url}/api/v1/targets?state=active`)).json()) as {
      data: { activeTargets: { health: string; scrapePool: string }[] };
    };
    const nodes = body.data.activeTargets.filter((target) => target.scrapePool === AGENT_SCRAPE_JOB);
    return { up: nodes.filter((target) => target.health === 'up').length, down: nodes.filter((target) => target.health !== 'up').length };
  }

  /** How long each rule group's last evaluation took, in seconds (Prometheus' rules API). */
  async ruleGroupSeconds(): Promise<number[]> {
    const body = (await (await fetch(`${this.prometheus.url}/api/v1/rules`)).json()) as { data: { groups: { evaluationTime: number }[] } };
    return body.data.groups.map((group) => group.evaluationTime);
  }

  /** Which controller replica holds the online analyzers' lease (undefined: none ran yet). */
  async analysisLeader(): Promise<string | undefined> {
    return (await this.redis.get(this.keys.analysisLeader)) ?? undefined;
  }

  /** One instant query's scalar values (empty when nothing matches). */
  async query(expr: string): Promise<number[]> {
    // Generous: a thousand-node scrape keeps a small Prometheus busy, and nothing here is urgent.
    return (await instantQuery(this.prometheus.url, expr, { timeoutMs: 60_000 })).map((sample) => sample.value);
  }

  /**
   * Injects a fatal Xid on `node`'s GPU `gpuIndex` and waits for the drain to be done. The fast
   * path posts the event straight away; the Prometheus path only raises the counter for the
   * next scrape. Latency is injection → the drain action recorded done (after the backend
   * confirmed the node drained).
   */
  async inject(node: string, gpuIndex: number, path: 'fast' | 'prometheus', timeoutMs = 30_000): Promise<InjectionResult> {
    const cursor = await this.auditCursor();
    const injectedAt = Date.now();
    this.fleet.injectXid(node, gpuIndex, 79, { fastPath: path === 'fast' });
    const deadline = injectedAt + timeoutMs;
    while (Date.now() < deadline) {
      const entries = await this.auditAfter(cursor);
      const done = entries.find((entry) => entry.type === 'action' && entry.node === node && entry.data.state === 'done');
      if (done) {
        const first = entries.find((entry) => entry.type === 'signal' && entry.node === node)?.data.signal as { source?: string } | undefined;
        return { node, path, latencyMs: streamMs(done.id) - injectedAt, firstReportFrom: first?.source };
      }
      await sleep(10);
    }
    return { node, path, latencyMs: undefined, firstReportFrom: undefined };
  }

  /** The newest audit entry's id, to read only what comes after it. */
  private async auditCursor(): Promise<string> {
    const [newest] = await this.redis.xrevrange(this.keys.audit, '+', '-', 'COUNT', 1);
    return newest?.[0] ?? '0-0';
  }

  private auditAfter(cursor: string): Promise<AuditEntry[]> {
    return this.audit.read({ after: cursor, limit: 1000 });
  }

  /**
   * Waits until Prometheus' alert for an injected Xid has reached the controller (so it cannot
   * arrive after a resume and make a second decision), then returns the node to service the way
   * `steadfast resume` does: resumed in Slurm, steadfast's claim on it closed.
   */
  async recycle(node: string, gpuIndex: number, since: number, timeoutMs = 30_000): Promise<boolean> {
    const gpu = this.fleet.pciBusId(gpuIndex);
    const deadline = Date.now() + timeoutMs;
    let alerted = false;
    while (!alerted && Date.now() < deadline) {
      const entries = await this.audit.read({ node, type: 'signal', limit: 50 });
      alerted = entries.some((entry) => {
        const signal = entry.data.signal as { source?: string; kind?: string; gpu?: string } | undefined;
        return streamMs(entry.id) >= since && signal?.source === 'alertmanager' && signal.kind === 'xid' && signal.gpu === gpu;
      });
      if (!alerted) await sleep(50);
    }
    await this.backend.resume(node);
    await this.redis.del(this.keys.nodeDrainClaim(node));
    return alerted;
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    try {
      await this.fleet?.close();
      await this.controller?.stop();
      this.redis?.disconnect();
    } finally {
      await this.plane?.stop();
    }
  }
}
