import { Worker, type Queue } from 'bullmq';
import type { ActionRecord } from '../core/action.js';
import type { AuditLog } from '../core/audit.js';
import type { Config } from '../core/config.js';
import { launchArgv } from '../core/job.js';
import type { Launchers } from '../core/launcher.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import { QUEUE_NAMES, workerTiming, type ActionJob, type AnalysisJob } from '../core/queues.js';
import type { ClusterBackend } from '../actuators/backend.js';
import { createDrainProcessor } from '../actuators/drain.js';
import { WebhookHandOff } from '../actuators/hand-off.js';
import { RemediationHistory } from '../actuators/remediation-history.js';
import { DryRunGpuResetter, createRemedyProcessor } from '../actuators/remedy.js';
import { createRecoveryProcessor } from '../actuators/recovery/index.js';
import { launcherOf } from '../actuators/launcher.js';
import type { SafetyGates } from '../actuators/safety.js';
import type { StandbyPool } from '../actuators/standby-pool.js';
import { AgentGpuResetter, type AgentDirectory } from './agents.js';
import { createAnalysisProcessor, type AnalysisDeps } from '../analyzers/workers/analysis.js';
import type { GrafanaAnnotator } from './grafana.js';
import type { JobStore } from './job-store.js';
import type { LadderConfig } from './policy/ladder/index.js';
import type { ControllerMetrics } from './metrics.js';
import { createPolicyProcessor } from './policy/policy-worker.js';
import type { ProgressWatch } from './progress.js';
import type { RecoveryDispatcher } from './policy/recovery-dispatcher.js';

/** What the controller's workers act with: its connections, stores, gates and watchers. */
export interface WorkerDeps {
  readonly config: Config;
  readonly logger: Logger;
  /** A Redis connection of the worker's own (BullMQ blocks on it). */
  readonly connection: () => Redis;
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly jobs: JobStore;
  readonly dispatcher: RecoveryDispatcher;
  readonly ladder: LadderConfig;
  readonly pool: StandbyPool;
  readonly progress: ProgressWatch | undefined;
  readonly agents: AgentDirectory;
  readonly metrics: ControllerMetrics;
  readonly grafana: GrafanaAnnotator | undefined;
  readonly actionQueue: Queue<ActionJob>;
  readonly analysisQueue: Queue<AnalysisJob>;
}

/**
 * The controller's four BullMQ workers: signals → decisions (policy), drains (actions), the
 * recovery ladder's transitions (recovery) and the analyses it asks for (analysis).
 */
/**
 * The replay command of the launcher a job names, for the analysis worker: a Slurm launcher's
 * `replay` argv with {job}, {nodes} (the group's machines) and {version} filled in and checked
 * (launchArgv); undefined for a launcher without one, or one gone from the configuration.
 */
export function replayCommandOf(launchers: Launchers): AnalysisDeps['replayCommand'] {
  return (spec) => {
    const launcher = launcherOf(launchers, spec);
    if (launcher?.kind !== 'slurm' || !launcher.replay) return undefined;
    const replay = launcher.replay;
    return (machines) => launchArgv(launcher, { job: spec.name, nodes: machines, version: spec.codeVersion }, replay);
  };
}

export function startWorkers(deps: WorkerDeps): Worker[] {
  const { config, logger } = deps;
  // How soon a job held by a dead worker (a killed replica's recovery) goes to a live one.
  const timing = workerTiming(config.queues);
  const history = new RemediationHistory(deps.redis, deps.keys, config.remedies.historyLength);
  const onFinished = (record: ActionRecord): void => {
    deps.metrics.actions.inc({ verb: record.verb, state: record.state, backend: record.backend });
    deps.grafana?.annotate(record);
  };
  // Actions outside any registered job: a refused one pages once per budget window.
  const onPage = (reason: string): void => {
    deps.metrics.humanPages.inc({ training_job: '' });
    logger.warn({ reason }, 'a person is needed');
  };
  const handOffWebhook = config.remedies.handOff.webhookUrl;
  // What the drain and remedy actuators both act through.
  const actuator = { redis: deps.redis, keys: deps.keys, audit: deps.audit, backend: deps.backend, gates: deps.gates, logger };
  // Dry-run swaps the agent's reset for a recorder, as it swaps the backend.
  const resetter = deps.backend.name === 'dry-run' ? new DryRunGpuResetter() : new AgentGpuResetter(deps.agents);
  const remedy = createRemedyProcessor({
    ...actuator,
    history,
    resetter,
    handOff: handOffWebhook === undefined ? undefined : new WebhookHandOff({ url: handOffWebhook, timeoutMs: config.remedies.handOff.timeoutMs, attempts: config.remedies.handOff.attempts }),
    config: config.remedies,
    onRemediation: (node, action, outcome) => deps.metrics.remediations.inc({ node, action, outcome }),
    onFinished,
    onPage,
  });
  const policy = new Worker(
    QUEUE_NAMES.signals,
    createPolicyProcessor({
      redis: deps.redis,
      keys: deps.keys,
      audit: deps.audit,
      actions: deps.actionQueue,
      dedupeSeconds: config.policy.drainDedupeSeconds,
      recovery: { jobs: deps.jobs, dispatcher: deps.dispatcher },
      remedies: { config: config.remedies, history },
    }),
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 32 },
  );
  const recovery = new Worker(
    QUEUE_NAMES.recovery,
    createRecoveryProcessor({
      redis: deps.redis,
      keys: deps.keys,
      audit: deps.audit,
      backend: deps.backend,
      gates: deps.gates,
      jobs: deps.jobs,
      launchers: config.launchers,
      logger,
      feedback: (event) => deps.dispatcher.apply(event),
      // One quarantine rule: the ladder's per job, this one across jobs.
      quarantine: { afterEvictions: deps.ladder.quarantineAfterEvictions, windowMs: deps.ladder.exclusionWindowMs },
      maxJobEvictionPercent: config.safety.maxJobEvictionPercent,
      pool: deps.pool,
      progress: deps.progress,
      // The reset rung for a job's node (the ladder emits it only with remedies.gpuReset on).
      gpuReset: { resetter, timeoutSeconds: config.remedies.gpuReset.timeoutSeconds, history },
      // jobId = the asking step: a redelivered recovery job cannot queue the same analysis twice.
      analyze: async (request) => {
        await deps.analysisQueue.add(request.kind, request, { jobId: `${request.kind}:${request.ref}` });
      },
      onPage: (job, reason) => {
        deps.metrics.humanPages.inc({ training_job: job });
        logger.warn({ job, reason }, 'a person is needed');
      },
    }),
    // One transition at a time per worker keeps a job's steps strictly ordered.
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 1 },
  );
  const drain = new Worker(
    QUEUE_NAMES.actions,
    createDrainProcessor({
      ...actuator,
      onFinished,
      onPage,
      remedy,
    }),
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 4 },
  );
  drain.on('completed', (job) => {
    const faultTime = Date.parse(job.data.decision.faultTime);
    if (Number.isFinite(faultTime)) deps.metrics.signalToAction.observe({ verb: job.data.decision.verb }, (Date.now() - faultTime) / 1000);
  });
  const analysis = new Worker(
    QUEUE_NAMES.analysis,
    createAnalysisProcessor({
      jobs: deps.jobs,
      audit: deps.audit,
      agents: deps.agents,
      replayCommand: replayCommandOf(config.launchers),
      feedback: (event) => deps.dispatcher.apply(event),
      logger,
      stackRounds: config.analysis.stackRounds,
      stackRoundSeconds: config.analysis.stackRoundSeconds,
      replayTimeoutSeconds: config.analysis.replayTimeoutSeconds,
      diagnoseStages: config.analysis.diagnoseStages,
    }),
    // Analyses of different jobs run side by side; each is mostly waiting on agents or replays.
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 4 },
  );
  const workers = [policy, drain, recovery, analysis];
  for (const worker of workers) {
    worker.on('failed', (job, error) => logger.warn({ queue: worker.name, job: job?.id, err: error }, 'job failed'));
    worker.on('error', (error) => logger.warn({ queue: worker.name, err: error }, 'worker error'));
  }
  return workers;
}
