import type { AuditLog } from '../../core/audit.js';
import type { CheckpointShard } from '../../core/checkpoint.js';
import { CONTROLLER_IDENTITY, type Identity } from '../../core/credentials.js';
import type { JobPolicy, JobSpec } from '../../core/job.js';
import type { Launchers } from '../../core/launcher.js';
import type { LadderStep } from '../../core/ladder.js';
import type { Logger } from '../../core/log.js';
import type { AnalysisJob, LadderEventJob } from '../../core/queues.js';
import type { Keys, Redis } from '../../core/redis.js';
import type { ClusterBackend } from '../backend.js';
import type { SafetyGates } from '../safety.js';
import type { GpuResetter } from '../remedy.js';
import type { RemediationHistory } from '../remediation-history.js';
import type { StandbyPool } from '../standby-pool.js';

/** What the recovery actuator needs of the job registry (the controller's JobStore). */
export interface RecoveryJobs {
  get(job: string): Promise<{ readonly spec: JobSpec; readonly policy: JobPolicy }>;
  replaceNode(job: string, evicted: string, replacement: string): Promise<void>;
  setVersion(job: string, version: string): Promise<void>;
  checkpoints(job: string): Promise<CheckpointShard[]>;
}

/** Judges a restart by training progress (the controller's ProgressWatch): waits for new iterations. */
export interface RestartWatch {
  /** `since`: when the relaunch began; only iterations recorded after it count. */
  watch(job: string, eventId: string, since?: number): Promise<void>;
}

/** When a node evicted again and again leaves every pool (504-GPU report: exclusion history). */
export interface QuarantinePolicy {
  readonly afterEvictions: number;
  readonly windowMs: number;
}

export interface RecoveryActuatorDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly jobs: RecoveryJobs;
  /** The operator's launchers (config `launchers:`), which a job names. */
  readonly launchers: Launchers;
  /** This transition runs for a job in dry-run: the backend records, launches are only described. */
  readonly dryRun?: boolean;
  readonly logger: Logger;
  /** Feeds a step's outcome back into the job's ladder (RecoveryDispatcher.apply). */
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  readonly onPage?: (job: string, reason: string) => void;
  /** Cross-job quarantine; the controller passes its `recovery:` config. */
  readonly quarantine: QuarantinePolicy;
  /** Most of a job's nodes one window may evict, in percent (safety.maxJobEvictionPercent). */
  readonly maxJobEvictionPercent?: number;
  /** The managed standby pool; when it has no candidates, standbys held by hand are used. */
  readonly pool?: StandbyPool;
  /** Judges restarts by training progress; without it, an accepted launch counts as success. */
  readonly progress?: RestartWatch;
  /** Hands diagnostics, replay and stack aggregation to the analysis queue. */
  readonly analyze?: (request: AnalysisJob) => Promise<void>;
  /** GPU resets through the nodes' agents (remedies.gpuReset), for the reset_gpu step; without it that step evicts. */
  readonly gpuReset?: { readonly resetter: GpuResetter; readonly timeoutSeconds: number; readonly history?: RemediationHistory };
}

/** One step of one ladder transition: its identity in the audit is `${transitionId}:${index}`. */
export interface StepAt {
  readonly transitionId: string;
  readonly index: number;
  readonly step: LadderStep;
  /** Who caused the transition; the audit names it as each step's actor. */
  readonly origin?: Identity | undefined;
}

export const stepRef = (at: StepAt): string => `${at.transitionId}:${at.index}`;

/** Why a step stops its transition there (a refusal, or a failure a person must see to); undefined: the transition goes on. */
export type Halt = string | undefined;

export type StepState = 'done' | 'refused' | 'failed';

/** Puts a step's outcome on the audit, once per step, node and state. */
export async function recordStep(deps: RecoveryActuatorDeps, at: StepAt, state: StepState, detail: string, node?: string): Promise<void> {
  const { step } = at;
  await deps.audit.append(
    {
      type: 'action',
      ref: stepRef(at),
      node: node ?? step.nodes?.[0],
      summary: `${step.job}: ${step.verb}${node ? ` ${node}` : ''}: ${state} (${detail})`,
      data: { job: step.job, verb: step.verb, state, detail, backend: deps.backend.name, step },
      actor: at.origin ?? CONTROLLER_IDENTITY,
    },
    `action:${stepRef(at)}:${node ?? ''}:${state}`,
  );
}
