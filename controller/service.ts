import { randomUUID } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import type { Server } from 'node:http';
import { Queue, Worker } from 'bullmq';
import { AuditLog } from '../core/audit.js';
import { resolveToken, type Config } from '../core/config.js';
import { resolveCredentials } from '../core/auth-config.js';
import { Credentials } from '../core/credentials.js';
import { errorMessage } from '../core/errors.js';
import { Locks } from '../core/locks.js';
import type { Logger } from '../core/log.js';
import { SIGNAL_BATCH_MAX, retentionFromBudget } from '../core/retention.js';
import { Keys, describeRedis, intakeConnection, redisProbe, requestConnection, workerConnection, type Redis } from '../core/redis.js';
import { QUEUE_NAMES, queueJobOptions, type AnalysisJob, type SignalJob, type StepsJob } from '../core/queues.js';
import type { ClusterBackend } from '../actuators/backend.js';
import { createBackend } from '../actuators/backend-from-config.js';
import { SafetyGates, drainBudget } from '../actuators/safety.js';
import { StandbyPool } from '../actuators/standby-pool.js';
import { replenishStandbys, validationUpkeep } from './standby-upkeep.js';
import { RemediationHistory } from '../actuators/remediation-history.js';
import { SignalIntake } from './intake.js';
import { IntakeBatcher } from './intake-batch.js';
import { GrafanaAnnotator } from './grafana.js';
import { ControllerMetrics } from './metrics.js';
import { JobStore, jobMembers } from './job-store.js';
import { tickJobLadders } from './recovery-tick.js';
import { RecoveryDispatcher } from './policy/recovery-dispatcher.js';
import { ladderConfig, type LadderConfig } from './policy/ladder/index.js';
import { ProgressWatch, TrainingProgressReports } from './progress.js';
import { jobsRouter } from './intake/jobs-api.js';
import { worldRouter } from './intake/world-api.js';
import { operatorRouter, type OperatorRouterDeps } from './intake/operator-api.js';
import { xidPolicyRouter } from './intake/xid-policy-api.js';
import { preflightRouter } from './intake/preflight-api.js';
import { MicrobatchBoard } from './microbatches.js';
import { FailSlowWatch } from '../analyzers/workers/failslow-watch.js';
import { SuspectWatch } from '../analyzers/workers/suspect-watch.js';
import { PrometheusFeatureSource } from '../analyzers/multisignal/source.js';
import { AgentDirectory } from './agents.js';
import { createApp } from './intake/server.js';
import { configuredAgentTokens } from './kubernetes-agents.js';
import { createLimitedServer, listenOn } from '../core/connection-limits.js';
import { metricsHandler } from './intake/metrics-server.js';
import { startWorkers } from './workers.js';
import { profileResolverFor, type ProfileResolver } from './profile-resolver.js';
import { startIntervalTask, type IntervalTask } from './interval-task.js';

/** The safety gates (budget, holds, maintenance windows, leases) on one Redis connection. */
function safetyGates(config: Config, redis: Redis, keys: Keys, backend: ClusterBackend, logger: Logger): SafetyGates {
  const budget = { maxPerWindow: drainBudget(config.safety), windowSeconds: config.safety.windowSeconds };
  const partitions = backend.partitionNodes?.bind(backend);
  return new SafetyGates(redis, keys, budget, config.safety.nodeLeaseSeconds, config.remedies.maintenanceWindows, partitions, logger);
}

export interface ControllerOptions {
  readonly config: Config;
  readonly logger: Logger;
  /** Run the policy and actuator workers in this process (default). */
  readonly workers?: boolean;
  /** Serve HTTP (default). */
  readonly http?: boolean;
}

/** How long close() lets workers and queues finish before it cuts their Redis connections. */
const CLOSE_GRACE_MS = 5000;

/** Whether every promise settled within `ms`. */
async function settledWithin(promises: readonly Promise<unknown>[], ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  try {
    return await Promise.race([Promise.allSettled(promises).then(() => true), late]);
  } finally {
    clearTimeout(timer);
  }
}

/** How often time is fed through every job's recovery ladder. */
const RECOVERY_TICK_MS = 5000;

/**
 * The controller's composition root: every connection, queue, worker and metric is made here
 * and passed down; nothing is module-global.
 */
export class Controller {
  private readonly intakeRedis: Redis;
  /** The API's reads and writes: every command has a deadline (requestConnection). */
  private readonly requestRedis: Redis;
  private readonly workerRedis: Redis;
  private readonly keys: Keys;
  /** The audit stream's length cap, from the retention budget. */
  private readonly auditEntries: number;
  private readonly intake: SignalIntake;
  private readonly stepQueue: Queue<StepsJob>;
  /** The signal queue as the workers' side sees it, for queue-depth metrics. */
  private readonly signalQueue: Queue<SignalJob>;
  private readonly workers: Worker[] = [];
  private readonly workerConnections: Redis[] = [];
  private server: Server | undefined;
  private metricsServer: Server | undefined;
  private closed = false;
  readonly metrics: ControllerMetrics;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  private readonly profiles: ProfileResolver | undefined;
  readonly jobs: JobStore;
  private readonly analysisQueue: Queue<AnalysisJob>;
  private readonly agents: AgentDirectory;
  private readonly validation: ReturnType<typeof validationUpkeep>;
  private readonly failSlow: FailSlowWatch | undefined;
  private readonly suspects: SuspectWatch | undefined;
  /** This replica's identity for the analysis leader lease. */
  private readonly replicaId = randomUUID();
  private readonly dispatcher: RecoveryDispatcher;
  private readonly ladder: LadderConfig;
  private ticker: IntervalTask | undefined;
  private failSlowTicker: IntervalTask | undefined;
  private suspectTicker: IntervalTask | undefined;
  readonly pool: StandbyPool;
  private readonly progress: ProgressWatch | undefined;
  /** Posts finished actions to Grafana when the config has a `grafana` section. */
  readonly grafana: GrafanaAnnotator | undefined;
  /** Who may call the API; read at construction, so a missing credential stops the start. */
  private readonly credentials: Credentials | undefined;

  constructor(private readonly options: ControllerOptions) {
    const { config } = options;
    // Read before any connection opens, so a missing token file leaves nothing to close.
    const grafanaToken = config.grafana ? resolveToken(config.grafana, 'grafana') : undefined;
    this.credentials = (options.http ?? true) ? new Credentials(resolveCredentials(config.controller.auth), configuredAgentTokens(config)) : undefined;
    this.keys = new Keys(config.redis.prefix);
    this.intakeRedis = intakeConnection(config.redis);
    this.requestRedis = requestConnection(config.redis);
    // The policy worker's many small commands (audit appends, job lookups, BullMQ's scripts) leave
    // in one socket write per turn of the event loop instead of one each. Nothing blocking runs on
    // this connection: each BullMQ worker has its own (ownConnection).
    this.workerRedis = workerConnection(config.redis, { enableAutoPipelining: true });
    for (const [name, connection] of [
      ['intake', this.intakeRedis],
      ['request', this.requestRedis],
      ['worker', this.workerRedis],
    ] as const) {
      connection.on('error', (error: Error) => options.logger.warn({ connection: name, err: error }, 'Redis connection error'));
    }
    const retention = retentionFromBudget(config.redis.retentionBudgetMB, config.controller.auditMaxLength);
    const jobOptions = queueJobOptions(retention);
    this.auditEntries = retention.auditEntries;
    this.intake = new SignalIntake(this.intakeRedis, config.redis.prefix, {
      jobOptions: jobOptions.signals,
      replicaAck: { minReplicas: config.redis.minReplicasAcked, timeoutMs: config.redis.replicaAckTimeoutMs },
      replicaMarker: this.keys.intakeReplicaMarker,
      seen: { key: this.keys.intakeSeenSignals, windowSeconds: retention.signals.completed.age, maxIds: retention.signals.completed.count * SIGNAL_BATCH_MAX },
    });
    this.stepQueue = new Queue<StepsJob>(QUEUE_NAMES.steps, {
      connection: this.workerRedis,
      prefix: config.redis.prefix,
      defaultJobOptions: jobOptions.steps,
    });
    this.audit = new AuditLog(this.workerRedis, this.keys, this.auditEntries);
    this.backend = createBackend(config, this.workerRedis, this.keys);
    this.profiles = profileResolverFor(config.profiles, this.backend, options.logger);
    this.gates = safetyGates(config, this.workerRedis, this.keys, this.backend, options.logger);
    this.signalQueue = new Queue<SignalJob>(QUEUE_NAMES.signals, { connection: this.workerRedis, prefix: config.redis.prefix });
    this.jobs = new JobStore(this.workerRedis, this.keys);
    this.analysisQueue = new Queue<AnalysisJob>(QUEUE_NAMES.analysis, {
      connection: this.workerRedis,
      prefix: config.redis.prefix,
      defaultJobOptions: jobOptions.analysis,
    });
    for (const queue of [this.signalQueue, this.stepQueue, this.analysisQueue]) {
      queue.on('error', (error: Error) => options.logger.warn({ queue: queue.name, err: error }, 'queue error'));
    }
    this.agents = new AgentDirectory(config.agents, async (node) => (await this.backend.nodeState(node)).exists);
    this.progress = config.progress.prometheusUrl
      ? new ProgressWatch(this.workerRedis, this.keys, {
          prometheusUrl: config.progress.prometheusUrl,
          timeoutMs: config.progress.timeoutSeconds * 1000,
          nodeLabel: config.analysis.labels.nodeLabel,
          nodesOf: async (job) => jobMembers(await this.jobs.get(job)),
        })
      : undefined;
    this.pool = new StandbyPool(this.workerRedis, this.keys, this.backend, config.standby);
    this.validation = validationUpkeep(config, this.workerRedis, this.keys, this.backend, {
      agents: this.agents,
      audit: this.audit,
      logger: options.logger,
      pool: this.pool,
    });
    this.ladder = ladderConfig(config.recovery);
    this.dispatcher = new RecoveryDispatcher(this.workerRedis, this.keys, this.jobs, this.audit, this.stepQueue, this.ladder);
    const analysisPrometheus = config.analysis.prometheusUrl ?? config.progress.prometheusUrl;
    this.failSlow = analysisPrometheus
      ? new FailSlowWatch({
          redis: this.workerRedis,
          keys: this.keys,
          audit: this.audit,
          board: new MicrobatchBoard(this.workerRedis, this.keys, this.jobs),
          prometheusUrl: analysisPrometheus,
          costSeconds: config.analysis.failSlowCostSeconds,
          threshold: config.analysis.failSlowThreshold,
          dispatch: (event) => this.dispatcher.apply(event),
        })
      : undefined;
    this.suspects = analysisPrometheus
      ? new SuspectWatch({
          source: new PrometheusFeatureSource({
            url: analysisPrometheus,
            agentJob: config.analysis.labels.scrapeJob,
            nodeLabel: config.analysis.labels.nodeLabel,
            trainingJobLabel: config.analysis.labels.trainingJobLabel,
          }),
          enqueue: (signals) => this.intake.enqueue(signals),
        })
      : undefined;
    this.metrics = new ControllerMetrics([this.signalQueue, this.stepQueue], this.jobs, () => this.gates.holds());
    this.grafana =
      config.grafana && grafanaToken !== undefined
        ? new GrafanaAnnotator({
            url: config.grafana.url,
            token: grafanaToken,
            dashboardUid: config.grafana.dashboardUid,
            timeoutMs: config.grafana.timeoutMs,
            failed: this.metrics.grafanaAnnotationsFailed,
            logger: options.logger.child({ component: 'grafana' }),
          })
        : undefined;
  }

  /** Starts the workers and the HTTP servers; resolves with the bound ports (the API's and /metrics'). */
  async start(): Promise<{ port: number; metricsPort: number }> {
    const { config, logger } = this.options;
    await this.waitForRedis();
    if (this.options.workers ?? true) this.startWorkers();
    if (!(this.options.http ?? true)) return { port: 0, metricsPort: 0 };
    const credentials = this.credentials;
    if (!credentials) throw new Error('the controller was made without HTTP; start() cannot serve it');
    // The API answers from a connection whose every command has a deadline: a Redis that is down,
    // or connected but not answering, is a 503 within seconds, not a hang.
    const apiJobs = new JobStore(this.requestRedis, this.keys);
    const batcher = new IntakeBatcher((signals) => this.intake.enqueue(signals));
    const apiAudit = new AuditLog(this.requestRedis, this.keys, this.auditEntries);
    const progressReports = new TrainingProgressReports(this.requestRedis, this.keys);
    const budget = { maxPerWindow: drainBudget(config.safety), windowSeconds: config.safety.windowSeconds };
    const app = createApp({
      credentials,
      bodyLimitBytes: config.controller.bodyLimitBytes,
      inFlightBodyBytes: config.controller.inFlightBodyBytes,
      rateLimit: config.controller.rateLimit,
      enqueue: (signals) => batcher.enqueue(signals),
      recordProgress: (events, receivedAt) => progressReports.record(events, receivedAt),
      audit: apiAudit,
      redisUp: redisProbe(this.intakeRedis),
      metrics: this.metrics,
      logger,
      // On the workers' connection, which waits for Redis: their reads are answered only after a health check, within a deadline (server.ts).
      queues: [this.signalQueue, this.stepQueue, this.analysisQueue],
      routers: [
        jobsRouter({
          jobs: apiJobs,
          backend: this.backend,
          launchers: config.launchers,
          audit: apiAudit,
          dispatcher: this.dispatcher,
          pool: this.pool,
          microbatches: new MicrobatchBoard(this.requestRedis, this.keys, apiJobs),
        }),
        worldRouter({ jobs: apiJobs, dispatcher: this.dispatcher }),
        xidPolicyRouter(config),
        preflightRouter({ jobs: apiJobs, enqueue: (signals) => batcher.enqueue(signals) }),
        operatorRouter(this.operatorDeps(apiAudit, budget)),
      ],
    });
    const onRefused = (address: string, first: boolean): void => {
      this.metrics.requestsRejected.inc({ endpoint: 'connection', reason: 'too_many_connections' });
      if (first) logger.warn({ address, max: config.controller.connections.maxPerClient }, 'refusing connections: too many open from one address');
    };
    const server = createLimitedServer(app, config.controller.connections, onRefused);
    this.server = server;
    const metricsServer = createLimitedServer(metricsHandler(this.metrics.registry, logger), config.controller.connections, onRefused);
    this.metricsServer = metricsServer;
    const metricsHost = config.controller.metrics.host ?? config.controller.host;
    for (const [listener, host, port] of [
      [server, config.controller.host, config.controller.port],
      [metricsServer, metricsHost, config.controller.metrics.port],
    ] as const) {
      try {
        await listenOn(listener, port, host);
      } catch (error) {
        // A controller that cannot listen must not stay up half alive, its workers acting unseen.
        await this.close();
        throw new Error(`cannot listen on ${host}:${port}: ${errorMessage(error)}`, { cause: error });
      }
    }
    const port = (server.address() as AddressInfo).port;
    const metricsPort = (metricsServer.address() as AddressInfo).port;
    logger.info({ host: config.controller.host, port, metricsHost, metricsPort, backend: this.backend.name }, 'controller listening');
    return { port, metricsPort };
  }

  /** What the operator API (pause, holds, remediations) works with, on the request connection. */
  private operatorDeps(audit: AuditLog, budget: { readonly maxPerWindow: number; readonly windowSeconds: number }): OperatorRouterDeps {
    const { config, logger } = this.options;
    const gates = safetyGates(config, this.requestRedis, this.keys, this.backend, logger);
    const history = new RemediationHistory(this.requestRedis, this.keys, config.remedies.historyLength);
    return { gates, audit, holdDefaultSeconds: config.safety.holdDefaultSeconds, holdMaxSeconds: config.safety.holdMaxSeconds, budget, history };
  }

  /** Gives Redis a moment at start-up; if it is down the controller still starts and answers 503. */
  private async waitForRedis(timeoutMs = 5000): Promise<void> {
    const connections = [this.intakeRedis, this.requestRedis].filter((connection) => connection.status !== 'ready');
    if (connections.length === 0) return;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
    const allReady = Promise.all(connections.map((connection) => new Promise<true>((resolve) => connection.once('ready', () => resolve(true))))).then(
      () => true as const,
    );
    const ready = await Promise.race([allReady, late]).finally(() => clearTimeout(timer));
    if (!ready) this.options.logger.warn({ redis: describeRedis(this.options.config.redis) }, 'Redis not reachable yet; intake answers 503 until it is');
  }

  private ownConnection(): Redis {
    const connection = workerConnection(this.options.config.redis);
    connection.on('error', (error: Error) => this.options.logger.warn({ err: error }, 'Redis connection error'));
    this.workerConnections.push(connection);
    return connection;
  }

  private startWorkers(): void {
    const { config, logger } = this.options;
    startWorkers(
      {
        config,
        logger,
        connection: () => this.ownConnection(),
        redis: this.workerRedis,
        keys: this.keys,
        audit: this.audit,
        backend: this.backend,
        gates: this.gates,
        profiles: this.profiles,
        jobs: this.jobs,
        dispatcher: this.dispatcher,
        ladder: this.ladder,
        pool: this.pool,
        progress: this.progress,
        agents: this.agents,
        metrics: this.metrics,
        grafana: this.grafana,
        stepQueue: this.stepQueue,
        analysisQueue: this.analysisQueue,
      },
      this.workers,
    );
    // The ladder holds restarts back (retry backoff) and lazy updates until a deadline: time
    // must pass through it (controller/policy/ladder/, the `tick` event).
    this.ticker = startIntervalTask('recovery tick', RECOVERY_TICK_MS, () => this.tickJobs(), logger);
    if (this.failSlow)
      this.failSlowTicker = startIntervalTask('fail-slow check', config.analysis.failSlowIntervalSeconds * 1000, () => this.tickFailSlow(), logger);
    if (this.suspects)
      this.suspectTicker = startIntervalTask('multi-signal detection', config.analysis.detectorIntervalSeconds * 1000, () => this.tickSuspects(), logger);
  }

  private async tickJobs(): Promise<void> {
    const now = Date.now();
    const records = await tickJobLadders(
      {
        jobs: this.jobs,
        backend: this.backend,
        config: this.options.config,
        audit: this.audit,
        logger: this.options.logger,
        progress: this.progress,
        dispatcher: this.dispatcher,
      },
      now,
    );
    // The analysis lease is renewed every tick; fail-slow checks and multi-signal detection run on
    // their own intervals (tickFailSlow, tickSuspects), so a slow feature read or a watch learning a
    // new job from history never holds a job's recovery tick.
    if (this.failSlow || this.suspects) await this.leadAnalysis();
    await replenishStandbys(
      { gates: this.gates, pool: this.pool, audit: this.audit, backend: this.backend.name, validation: this.validation },
      new Set(records.flatMap((record) => record.spec.nodes)),
      now,
    );
  }

  /** One multi-signal evaluation of every running job, every analysis.detectorIntervalSeconds, by the analysis leader. */
  private async tickSuspects(): Promise<void> {
    if (!this.suspects || !(await this.leadAnalysis())) return;
    const running = (await this.jobs.list()).filter((record) => record.state === 'running').map((record) => record.spec);
    await this.suspects.run(running, Date.now());
  }

  /** One fail-slow check of every running job, every analysis.failSlowIntervalSeconds, by the analysis leader. */
  private async tickFailSlow(): Promise<void> {
    if (!this.failSlow || !(await this.leadAnalysis())) return;
    const now = Date.now();
    for (const record of await this.jobs.list()) {
      if (record.state !== 'running') continue;
      await this.failSlow
        .check(record.spec, now)
        .catch((error: unknown) => this.options.logger.warn({ job: record.spec.name, err: error }, 'fail-slow check failed'));
    }
  }

  /**
   * Whether this replica runs the online analyzers now: a lease in Redis, renewed every tick by
   * its holder and taken over by another replica within a few ticks of the holder's death.
   */
  private async leadAnalysis(): Promise<boolean> {
    return new Locks(this.workerRedis, this.keys).leadAnalysis(this.replicaId, RECOVERY_TICK_MS * 3);
  }

  /** Stops accepting, lets running jobs finish, closes every connection. Safe to call twice. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.ticker?.stop();
    this.failSlowTicker?.stop();
    this.suspectTicker?.stop();
    for (const server of [this.server, this.metricsServer]) {
      if (!server?.listening) continue;
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
    }
    // Running jobs finish within a grace period. With Redis unreachable, closing would wait for it
    // for ever: past the grace period the connections are cut instead, and BullMQ hands any job
    // still held to another worker once its lock expires.
    const workersStopped = await settledWithin(
      this.workers.map((worker) => worker.close()),
      CLOSE_GRACE_MS,
    );
    // Annotations already under way finish (each is bounded by its timeout).
    await this.grafana?.settled();
    const queuesClosed = await settledWithin(
      [this.intake.close(), this.stepQueue.close(), this.signalQueue.close(), this.analysisQueue.close()],
      CLOSE_GRACE_MS,
    );
    if (!workersStopped || !queuesClosed)
      this.options.logger.warn({ graceMs: CLOSE_GRACE_MS }, 'workers or queues did not close in time (is Redis reachable?); cutting their connections');
    for (const connection of [this.intakeRedis, this.requestRedis, this.workerRedis, ...this.workerConnections]) connection.disconnect();
  }
}
