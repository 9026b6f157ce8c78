import { Worker, type Queue } from 'bullmq';
import type { AuditLog } from '../core/audit.js';
import type { Config } from '../core/config.js';
import { launchArgv } from '../core/job.js';
import type { Launchers } from '../core/launcher.js';
import type { Logger } from '../core/log.js';
import type { Keys, Redis } from '../core/redis.js';
import { QUEUE_NAMES, workerTiming, type AnalysisJob, type StepsJob } from '../core/queues.js';
import { retentionFromBudget } from '../core/retention.js';
import type { StepRecord } from '../core/steps.js';
import type { ClusterBackend } from '../actuators/backend.js';
import { WebhookHandOff } from '../actuators/hand-off.js';
import { RemediationHistory } from '../actuators/remediation-history.js';
import { createStepProcessor } from '../actuators/steps/processor.js';
import { launcherOf } from '../actuators/launcher.js';
import type { SafetyGates } from '../actuators/safety.js';
import type { StandbyPool } from '../actuators/standby-pool.js';
import { AgentGpuResetter, type AgentDirectory } from './agents.js';
import { validatorFromConfig } from '../actuators/node-validation.js';
import { createAnalysisProcessor, type AnalysisDeps } from '../analyzers/workers/analysis.js';
import type { GrafanaAnnotator } from './grafana.js';
import type { JobStore } from './job-store.js';
import type { LadderConfig } from './policy/ladder/index.js';
import type { ControllerMetrics } from './metrics.js';
import { NodeDispatcher } from './policy/node-dispatcher.js';
import type { ProfileResolver } from './profile-resolver.js';
import { createPolicyProcessor } from './policy/policy-worker.js';
import { configurationLayers } from '../core/xid-policy.js';
import type { ProgressWatch } from './progress.js';
import type { RecoveryDispatcher } from './policy/recovery-dispatcher.js';
import { SignalRetention, type FinishedState } from './signal-retention.js';

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
  /** The nodes' profiles (config `profiles:`); undefined when none is configured (every node has the global settings). */
  readonly profiles?: ProfileResolver | undefined;
  readonly jobs: JobStore;
  readonly dispatcher: RecoveryDispatcher;
  readonly ladder: LadderConfig;
  readonly pool: StandbyPool;
  readonly progress: ProgressWatch | undefined;
  readonly agents: AgentDirectory;
  readonly metrics: ControllerMetrics;
  readonly grafana: GrafanaAnnotator | undefined;
  readonly stepQueue: Queue<StepsJob>;
  readonly analysisQueue: Queue<AnalysisJob>;
}

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

/**
 * The controller's BullMQ workers: signals → decisions (policy: the node ladder or a job's
 * ladder), the steps both ladders queue (steps), and the analyses a job's steps ask for
 * (analysis). Each is added to `workers` as it starts.
 */
export function startWorkers(deps: WorkerDeps, workers: Worker[] = []): Worker[] {
  const { config, logger } = deps;
  // How soon a job held by a dead worker (a killed replica's recovery) goes to a live one.
  const timing = workerTiming(config.queues);
  const history = new RemediationHistory(deps.redis, deps.keys, config.remedies.historyLength);
  const handOffWebhook = config.remedies.handOff.webhookUrl;
  const profiles = deps.profiles;
  profiles?.logMatches(logger);
  const policy = new Worker(
    QUEUE_NAMES.signals,
    createPolicyProcessor({
      redis: deps.redis,
      keys: deps.keys,
      audit: deps.audit,
      nodes: new NodeDispatcher(deps.redis, deps.keys, deps.audit, deps.stepQueue, config.policy.drainDedupeSeconds, profiles),
      recovery: { jobs: deps.jobs, dispatcher: deps.dispatcher },
      remedies: { config: config.remedies, history },
      ...(profiles
        ? {
            remediesFor: (node: string, global: typeof config.remedies) => profiles.remediesFor(node, global),
            profileXidLayer: (node: string) => profiles.xidLayerFor(node),
          }
        : {}),
      xidPolicy: configurationLayers(config.xidPolicy),
    }),
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 32 },
  );
  // Finished signal jobs are kept within their bytes of the budget, not only by count.
  const keptSignals = new SignalRetention(deps.redis, deps.keys, policy, retentionFromBudget(config.redis.retentionBudgetMB).signalBytes);
  const keep = (jobId: string | undefined, state: FinishedState): void => {
    if (jobId === undefined) return;
    keptSignals
      .finished(jobId, state)
      .catch((error: unknown) => logger.warn({ job: jobId, err: error }, 'could not trim the finished signal jobs to their share of the retention budget'));
  };
  policy.on('completed', (job) => keep(job.id, 'completed'));
  policy.on('failed', (job) => keep(job?.id, 'failed'));
  const steps = new Worker(
    QUEUE_NAMES.steps,
    createStepProcessor({
      redis: deps.redis,
      keys: deps.keys,
      audit: deps.audit,
      backend: deps.backend,
      gates: deps.gates,
      jobs: deps.jobs,
      world: deps.jobs.world,
      launchers: config.launchers,
      logger,
      feedback: (event) => deps.dispatcher.apply(event),
      // One quarantine rule: the ladder's per job, this one across jobs.
      quarantine: { afterEvictions: deps.ladder.quarantineAfterEvictions, windowMs: deps.ladder.exclusionWindowMs },
      maxJobEvictionPercent: config.safety.maxJobEvictionPercent,
      jobHoldMs: timing.lockDuration,
      pool: deps.pool,
      progress: deps.progress,
      // GPU resets through the nodes' agents (a rung only with remedies.gpuReset on).
      resetter: new AgentGpuResetter(deps.agents),
      // A node a step took out is validated before it returns (config validation:, off by default).
      validator: config.validation.enabled ? validatorFromConfig(config.validation, deps.agents, deps.redis, deps.keys) : undefined,
      remedies: config.remedies,
      history,
      profiles,
      onRemediation: (node, action, outcome) => deps.metrics.remediations.inc({ node, action, outcome }),
      handOff:
        handOffWebhook === undefined
          ? undefined
          : new WebhookHandOff({ url: handOffWebhook, timeoutMs: config.remedies.handOff.timeoutMs, attempts: config.remedies.handOff.attempts }),
      onFinished: (record: StepRecord) => {
        deps.metrics.actions.inc({ verb: record.verb, state: record.state, backend: record.backend });
        deps.grafana?.annotate(record);
      },
      // jobId = the asking step: a redelivered transition cannot queue the same analysis twice.
      analyze: async (request) => {
        await deps.analysisQueue.add(request.kind, request, { jobId: `${request.kind}:${request.ref}` });
      },
      onPage: (job, reason) => {
        deps.metrics.humanPages.inc({ training_job: job ?? '' });
        logger.warn({ job, reason }, 'a person is needed');
      },
    }),
    // Transitions of different jobs and nodes side by side, one job's one at a time (the step
    // processor lines them up): room for a node's drain while a job's transitions wait their turn.
    { connection: deps.connection(), prefix: config.redis.prefix, ...timing, concurrency: 8 },
  );
  steps.on('completed', (job) => {
    const data = job.data as Partial<StepsJob> | undefined;
    const faultTime = Date.parse(data?.fault?.time ?? '');
    const verb = data?.steps?.[0]?.verb;
    if (Number.isFinite(faultTime) && verb !== undefined) deps.metrics.signalToAction.observe({ verb }, (Date.now() - faultTime) / 1000);
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
  for (const worker of [policy, steps, analysis]) {
    watch(worker, logger);
    workers.push(worker);
  }
  return workers;
}

function watch(worker: Worker, logger: Logger): void {
  worker.on('failed', (job, error) => logger.warn({ queue: worker.name, job: job?.id, err: error }, 'job failed'));
  worker.on('error', (error) => logger.warn({ queue: worker.name, err: error }, 'worker error'));
}
