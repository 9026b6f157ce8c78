import type { OwnDrains } from '../own-drains.js';
import type { AuditLog } from '../../core/audit.js';
import { CONTROLLER_IDENTITY, type Identity } from '../../core/credentials.js';
import type { JobPolicy, JobSpec } from '../../core/job.js';
import type { Launchers } from '../../core/launcher.js';
import type { Logger } from '../../core/log.js';
import type { AnalysisJob, LadderEventJob } from '../../core/queues.js';
import type { Keys, Redis } from '../../core/redis.js';
import type { RemedyAction, RemedyOutcome } from '../../core/remedy.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import { profileSuffix, type NodeProfiles } from '../../core/profiles.js';
import { ACTING_VERBS, type Step, type StepRecord, type StepState } from '../../core/steps.js';
import { DoNotRetryError } from '../../core/errors.js';
import type { Locks } from '../../core/locks.js';
import type { ClusterBackend } from '../backend.js';
import type { StepCopies } from '../restore-plan.js';
import type { HandOffNotifier } from '../hand-off.js';
import type { RemediationEntry } from '../../core/remedy.js';
import type { RemediationHistory } from '../remediation-history.js';
import type { GateVerdict, SafetyGates } from '../safety.js';
import type { StandbyPool } from '../standby-pool.js';
import type { GpuResetter } from './gpu-resetter.js';
import type { NodeValidator } from '../node-validation.js';

/**
 * What every step actuator (actuators/steps/<verb>.ts) works with, where a step sits in its
 * transition, and the one way a step's outcome is put on record.
 */

/** What the step actuators need of the job registry (the controller's JobStore). */
export interface StepJobs {
  /** `vacant`: nodes of the spec that left the job with no one in their place. */
  get(job: string): Promise<{ readonly spec: JobSpec; readonly policy: JobPolicy; readonly vacant: readonly string[] }>;
  replaceNode(job: string, evicted: string, replacement: string): Promise<void>;
  /** A hot swap put `spare` in the place of `failed`: the spare joins the job's nodes and leaves its spares. */
  useSpare(job: string, failed: string, spare: string): Promise<void>;
  /** A node becomes one of the job's hot-swap spares (it joins the allocation at the next launch). */
  addSpare(job: string, node: string): Promise<void>;
  /** The node leaves the job with no one in its place (no warm standby was left). */
  vacate(job: string, node: string): Promise<void>;
  setVersion(job: string, version: string): Promise<void>;
  /** The job's kept checkpoint steps, newest first. */
  checkpointSteps(job: string): AsyncIterable<StepCopies>;
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

/** A hot-swap job's world as the step actuators change it (the controller's WorldStore). */
export interface StepWorld {
  /** Opens the swap's epoch for the step `ref` (once): `replaced` maps each failed node to its spare. */
  open(
    spec: JobSpec,
    ref: string,
    replaced: Record<string, string>,
  ): Promise<{ readonly epoch: number; readonly opened: boolean; readonly boundSeconds: number }>;
  /** The job is (re)launched or stopped: its ranks meet in a new steady epoch. */
  relaunched(job: string): Promise<number>;
}

/**
 * What the controller wires the step processor with (processor.ts). The optional capabilities are
 * decided once, when the actuators are built (index.ts): each actuator is given only what it uses.
 */
export interface StepProcessorDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly gates: SafetyGates;
  readonly jobs: StepJobs;
  /** The operator's launchers (config `launchers:`), which a job names. */
  readonly launchers: Launchers;
  readonly logger: Logger;
  /** Feeds a step's outcome back into the job's ladder (RecoveryDispatcher.apply). */
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  /** A person is needed: `job` when it is a job's incident, undefined for a node outside any job. */
  readonly onPage?: (job: string | undefined, reason: string) => void;
  /** Every acting step's outcome once it ends (metrics, Grafana annotations). */
  readonly onFinished?: (record: StepRecord) => void;
  /** Cross-job quarantine; the controller passes its `recovery:` config. */
  readonly quarantine: QuarantinePolicy;
  /** Most of a job's nodes one window may evict, in percent (safety.maxJobEvictionPercent). */
  readonly maxJobEvictionPercent?: number;
  /** Hot-swap jobs' worlds; without it a hot_swap step falls back to stop and relaunch. */
  readonly world?: StepWorld | undefined;
  /** The managed standby pool; when it has no candidates, standbys held by hand are used. */
  readonly pool?: StandbyPool | undefined;
  /** Judges restarts by training progress; without it, an accepted launch counts as success. */
  readonly progress?: RestartWatch | undefined;
  /** Hands diagnostics, replay and stack aggregation to the analysis queue. */
  readonly analyze?: (request: AnalysisJob) => Promise<void>;
  /** GPU resets through the nodes' agents; without it a reset_gpu step evicts (a job) or drains (a node). */
  readonly resetter?: GpuResetter | undefined;
  /** Validates a node before a step returns it to service (config `validation:`); none: validation is off. */
  readonly validator?: NodeValidator | undefined;
  /** The remedies' settings (reset timeout and busy retries, reboot, hand-off): the config's `remedies:`. */
  readonly remedies: RemediesConfig;
  /** Every node's remediation history (reset, drain, reboot, hand-off), which escalation reads. */
  readonly history?: RemediationHistory | undefined;
  /** Counts each remediation by node, action and outcome (steadfast_remediations_total). */
  readonly onRemediation?: (node: string, action: RemedyAction, outcome: RemedyOutcome) => void;
  /** Tells the operator's process that a node needs hands (remedies.handOff.webhookUrl). */
  readonly handOff?: HandOffNotifier | undefined;
  /** Waits between busy-GPU retries; tests pass a fast one. */
  readonly pause?: (ms: number) => Promise<void>;
  /**
   * How long a job's running transition holds the job without renewing it: the queue's lock
   * duration, so that the hold of a controller that died mid-transition has lapsed by the time
   * its stalled transition runs again elsewhere.
   */
  readonly jobHoldMs?: number;
  /**
   * The nodes' profiles (config `profiles:`): a node ladder's transition runs with its node's
   * dry-run and budget, and no acting step touches a node two profiles match. Without it every node
   * has the global settings.
   */
  readonly profiles?: NodeProfiles | undefined;
  /** The profile these actuators serve (set by the step processor): its name goes on every entry they audit. */
  readonly profile?: string | undefined;
}

/** One step of one transition, as its actuator sees it. */
export interface StepAt {
  readonly transitionId: string;
  readonly index: number;
  readonly step: Step;
  /** The registered job the transition is for; undefined for the node ladder's transition of a node outside any job. */
  readonly job: string | undefined;
  /** Who caused the transition; the audit names it as each step's actor. */
  readonly origin?: Identity | undefined;
  /** The delivery of the queue job (0 first), so that each try of a step is audited. */
  readonly attempt: number;
  /** The queue job carrying the transition: the same on every try, another for a copy queued under another id. */
  readonly delivery: string;
}

/**
 * The step's identity in the audit, in backend reasons and in the budget: a node ladder's
 * transition has one step and is known by its decision id; a job's steps by `${transitionId}:${index}`.
 */
export const stepRef = (at: Pick<StepAt, 'transitionId' | 'index' | 'job'>): string =>
  at.job === undefined ? at.transitionId : `${at.transitionId}:${at.index}`;

/**
 * Who holds a node's lease while this step works on it: the same on every try of the step (a try
 * cut short by a Redis or controller restart finds its own lease, not another actuator's), and
 * another for a copy of the transition queued under another job id.
 */
export const leaseHolder = (at: StepAt): string => `${stepRef(at)}:${at.delivery}`;

/** The one node a node step or a GPU reset acts on. */
export function stepNode(at: StepAt): string {
  const node = at.step.nodes?.[0];
  if (node === undefined) throw new DoNotRetryError(`${at.step.verb} step ${stepRef(at)} names no node`);
  return node;
}

/** The job of a step only a job's transition has (stop, evict, restart…). */
export function stepJob(at: StepAt): string {
  if (at.job === undefined) throw new DoNotRetryError(`${at.step.verb} step ${stepRef(at)} belongs to a job's recovery, but its transition names no job`);
  return at.job;
}

/** Why a step stops its transition there (a refusal, or a failure a person must see to); undefined: the transition goes on. */
export type Halt = string | undefined;

/** One actuator, built with what it uses (index.ts): carries out one verb's step. */
export type StepActuator = (at: StepAt) => Promise<Halt>;

/** What putting a step on record needs: the audit, the backend (its name), and who hears each outcome (a no-op when none does). */
export interface StepRecording {
  readonly audit: AuditLog;
  readonly backend: ClusterBackend;
  readonly onFinished: (record: StepRecord) => void;
  /** The node's profile, named in each entry's data and summary; undefined for a node in none (entries as they always were). */
  readonly profile?: string | undefined;
}

/** Pages a person: `job` when it is a job's incident. Built with or without the controller's pager (index.ts). */
export interface Pager {
  page(job: string | undefined, reason: string): void;
  /** Pages about a refusal, once per gate and budget window (SafetyGates.claimPage), and audits the page. */
  pageOnce(at: StepAt, refusal: Extract<GateVerdict, { ok: false }>, page: RefusalPage): Promise<void>;
}

/** The nodes' remediation history as the steps keep it; with no history kept, nothing is kept and nothing read. */
export interface RemedyLog {
  remember(at: StepAt, node: string, action: RemedyAction, outcome: RemedyOutcome, detail: string, marker: string): Promise<void>;
  read(node: string, limit: number): Promise<RemediationEntry[]>;
}

/** What every acting step works with: recording, the gates, the node claims, paging and the remediation history. */
export interface StepBase extends StepRecording {
  readonly gates: SafetyGates;
  readonly locks: Locks;
  /** The nodes steadfast took out itself (own-drains.ts): only those it returns to service. */
  readonly ownDrains?: OwnDrains;
  readonly pager: Pager;
  readonly remedyLog: RemedyLog;
}

export interface RecordOptions {
  /** The node this entry is about, when the step acts on several (each evicted node) or names a different one (the standby). */
  readonly node?: string | undefined;
  /** Further fields for the entry's data. */
  readonly data?: Record<string, unknown>;
  /** Tells apart two entries of one step about the same node in the same state (the audit keeps one per key). */
  readonly part?: string;
}

/**
 * Puts a step's outcome on the audit (once per step, node, state and delivery) and, for an acting
 * step that ended, tells the controller's metrics and annotations.
 */
export async function recordStep(deps: StepRecording, at: StepAt, state: StepState, detail: string, options: RecordOptions = {}): Promise<void> {
  const { step } = at;
  const ref = stepRef(at);
  // A node step always names its node (and GPU); a job's step names the node an entry is about.
  const shown = at.job === undefined ? `${step.nodes?.[0] ?? ''}${step.gpu ? ` GPU ${step.gpu}` : ''}` : (options.node ?? '');
  const node = options.node ?? step.nodes?.[0];
  const record: StepRecord = { ref, verb: step.verb, job: at.job, node, state, detail, backend: deps.backend.name, time: new Date().toISOString() };
  await deps.audit.append(
    {
      type: 'action',
      ref,
      node,
      summary: `${at.job === undefined ? '' : `${at.job}: `}${step.verb}${shown ? ` ${shown}` : ''}: ${state} (${detail})${profileSuffix(deps.profile)}`,
      data: { ...record, step, ...options.data, ...(deps.profile === undefined ? {} : { profile: deps.profile }) },
      actor: at.origin ?? CONTROLLER_IDENTITY,
    },
    `action:${ref}:${options.node ?? ''}:${state}:${at.attempt}${options.part === undefined ? '' : `:${options.part}`}`,
  );
  if (state !== 'running' && ACTING_VERBS.has(step.verb)) deps.onFinished(record);
}

/** Keeps a remediation in the node's history (once per marker) and counts it. */
export async function rememberRemedy(
  deps: Pick<StepBase, 'remedyLog'>,
  at: StepAt,
  node: string,
  action: RemedyAction,
  outcome: RemedyOutcome,
  detail: string,
  marker: string,
): Promise<void> {
  await deps.remedyLog.remember(at, node, action, outcome, detail, marker);
}

/** The remediation history of the controller's nodes, or none (RemedyLog). */
export function remedyLog(history: RemediationHistory | undefined, onRemediation: StepProcessorDeps['onRemediation']): RemedyLog {
  if (history === undefined) return { remember: async () => undefined, read: async () => [] };
  return {
    async remember(at, node, action, outcome, detail, marker) {
      const entry = {
        time: new Date().toISOString(),
        action,
        outcome,
        detail: (at.job === undefined ? detail : `job ${at.job}: ${detail}`).slice(0, 1024),
        decisionId: at.transitionId,
        ...(at.step.gpu ? { gpu: at.step.gpu } : {}),
        ...(at.origin ? { actor: at.origin } : {}),
      };
      if (await history.record(node, entry, `${stepRef(at)}:${marker}`)) onRemediation?.(node, action, outcome);
    },
    read: (node, limit) => history.read(node, limit),
  };
}

/** The remedies the node history counts, by the verb that carries each out. */
export function remedyOf(verb: Step['verb']): RemedyAction | undefined {
  return verb === 'drain' || verb === 'reset_gpu' || verb === 'reboot' || verb === 'hand_off' ? verb : undefined;
}

/** The words a refused step is paged and audited with. */
export interface RefusalPage {
  /** What was refused, e.g. `drain node-3` or `eviction`. */
  readonly what: string;
  readonly node?: string | undefined;
}

/**
 * Puts a refused step on record and pages a person once per gate and budget window (many refusals
 * at once are one incident: a leaf switch down takes a rack's nodes; later ones are only
 * audited). A node step also gives up the node's claim the node dispatcher took for it (core/locks.ts),
 * so that the next fault on the node, once the gate opens, is decided and acted on at once instead
 * of joining a decision that never acted, and notes the refusal in the node's history.
 */
export async function refuseStep(
  deps: StepBase,
  at: StepAt,
  refusal: Extract<GateVerdict, { ok: false }>,
  page: RefusalPage,
  recorded: RecordOptions = {},
): Promise<Halt> {
  await recordStep(deps, at, 'refused', refusal.reason, recorded);
  const node = at.step.nodes?.[0];
  const remedy = remedyOf(at.step.verb);
  if (at.job === undefined && node !== undefined) {
    await deps.locks.releaseNodeClaim(node, at.transitionId);
    if (remedy !== undefined && remedy !== 'drain') await rememberRemedy(deps, at, node, remedy, 'refused', refusal.reason, 'refused');
  }
  await deps.pager.pageOnce(at, refusal, page);
  return refusal.reason;
}

/**
 * The gates a step on one node passes before it acts: pause, the node's holds and maintenance
 * windows, the budget (SafetyGates.admit). A refusal is recorded and paged (refuseStep).
 */
export async function admitNodeStep(
  deps: StepBase,
  at: StepAt,
  node: string,
  what: string,
  recorded: RecordOptions = {},
): Promise<{ readonly ok: true } | { readonly ok: false; readonly halt: Halt }> {
  const admitted = await deps.gates.admit(stepRef(at), [node]);
  if (admitted.ok) return { ok: true };
  return { ok: false, halt: await refuseStep(deps, at, admitted, { what: `${what} ${node}`, node }, recorded) };
}

/** The pager: the controller's, or none (then nothing pages and nothing is audited as a page). */
export function pager(
  onPage: ((job: string | undefined, reason: string) => void) | undefined,
  deps: Pick<StepBase, 'audit' | 'backend' | 'gates' | 'profile'>,
): Pager {
  if (onPage === undefined) return { page: () => undefined, pageOnce: async () => undefined };
  return {
    page: onPage,
    async pageOnce(at, refusal, page) {
      if (!(await deps.gates.claimPage(refusal.gate))) return;
      onPage(at.job, refusal.reason);
      const ref = stepRef(at);
      await deps.audit.append(
        {
          type: 'action',
          ref,
          node: page.node,
          summary: `${at.job === undefined ? '' : `${at.job}: `}page_human: a person is needed: ${page.what} refused (${refusal.reason}); later refusals in this window are audited without paging${profileSuffix(deps.profile)}`,
          data: {
            job: at.job,
            verb: 'page_human',
            state: 'done',
            detail: refusal.reason,
            gate: refusal.gate,
            node: page.node,
            backend: deps.backend.name,
            ...(deps.profile === undefined ? {} : { profile: deps.profile }),
          },
          actor: CONTROLLER_IDENTITY,
        },
        `action:${ref}:page`,
      );
    },
  };
}

/** The warm standbys an eviction or a hot swap takes from: the managed pool, or those the backend holds by hand. */
export interface Standbys {
  /** How many are free, leaving out `unusable`. */
  free(unusable: ReadonlySet<string>): Promise<number>;
  /** Takes one for `job`, active for it once taken; undefined when none is left. */
  take(job: string, unusable: ReadonlySet<string>): Promise<string | undefined>;
}

/** The managed pool when it has candidates, else the standbys the backend holds (activated as they are taken). */
export function standbysOf(pool: StandbyPool | undefined, backend: ClusterBackend): Standbys {
  if (pool?.enabled) {
    return {
      free: async (unusable) => (await pool.members()).filter((member) => member.state === 'ready' && !unusable.has(member.node)).length,
      take: (job, unusable) => pool.take(job, Date.now(), unusable),
    };
  }
  return {
    free: async (unusable) => (await backend.standbys()).filter((candidate) => !unusable.has(candidate)).length,
    async take(job, unusable) {
      const standby = (await backend.standbys()).find((candidate) => !unusable.has(candidate));
      if (standby !== undefined) await backend.activateStandby(standby, job);
      return standby;
    },
  };
}
