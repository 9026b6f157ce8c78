import { UnrecoverableError, type Job } from 'bullmq';
import { z } from 'zod';
import type { AuditLog } from '../../core/audit.js';
import { CONTROLLER_IDENTITY } from '../../core/credentials.js';
import { parseJobPayload } from '../../core/job-payload.js';
import type { Keys, Redis } from '../../core/redis.js';
import { signalSchema, type Signal } from '../../core/signal.js';
import { classifySignal, type Classification } from './fault-class.js';
import type { JobStore } from '../job-store.js';
import { faultEventFromSignal } from './ladder/index.js';
import type { RecoveryDispatcher } from './recovery-dispatcher.js';
import type { SignalJob } from '../../core/queues.js';
import { describeIssues } from '../../core/validate.js';
import type { RemediationHistory } from '../../actuators/remediation-history.js';
import { remediesSchema, type RemediesConfig } from '../../core/remedy-config.js';
import { climbNodeLadderReading } from './node-ladder.js';
import { describeSignal } from './describe-signal.js';
import type { NodeDispatcher } from './node-dispatcher.js';
import { lastResume } from './node-resumes.js';
import type { PolicyLayer } from '../../core/xid-policy.js';
import { applyXidPolicy } from './xid-rule.js';
import { XidOccurrences } from './xid-occurrences.js';

export interface PolicyResult {
  readonly outcome: 'observed' | 'decided' | 'joined' | 'repeat';
  readonly decisionId?: string;
  readonly sameFault?: boolean;
}

/** What a batch came to: the signals by outcome, and those refused as malformed. */
export interface BatchResult {
  readonly outcomes: Partial<Record<PolicyResult['outcome'], number>>;
  readonly invalid: number;
}

const signalBatchSchema = z.object({ signals: z.array(z.unknown()).min(1) });

export interface PolicyWorkerDeps {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly audit: AuditLog;
  /** Signals about a node outside any job: the node ladder's rung is claimed, audited and queued there. */
  readonly nodes: NodeDispatcher;
  /** Registered jobs and their recovery ladders; signals about a job's node go to its ladder. */
  readonly recovery?: { readonly jobs: JobStore; readonly dispatcher: RecoveryDispatcher };
  /** Remedies short of a drain (node-ladder.ts); without them every such fault drains the node. */
  readonly remedies?: { readonly config: RemediesConfig; readonly history: RemediationHistory };
  /** A node's remedies as its profile (config `profiles:`) sets them; without it every node has the global ones. */
  readonly remediesFor?: (node: string, global: RemediesConfig) => Promise<RemediesConfig>;
  /** The Xid policy's layers over the catalogue (core/xid-policy.ts, xid-rule.ts); without them, the catalogue alone. */
  readonly xidPolicy?: readonly PolicyLayer[];
  /** The layer a node's profile (config `profiles:`) lays over those, if it has an `xidPolicy`. */
  readonly profileXidLayer?: (node: string) => Promise<PolicyLayer | undefined>;
}

/**
 * A signal about a node of a registered job goes to that job's recovery ladder (ByteRobust §4,
 * DeadPool Table II): classify, advance, and let the step actuators carry out the steps.
 */
async function toLadder(
  audit: AuditLog,
  signal: Signal,
  verdict: Classification,
  trainingJob: string,
  dispatcher: RecoveryDispatcher,
  firstAttempt: boolean,
  remedies: PolicyWorkerDeps['remedies'],
): Promise<PolicyResult> {
  if (verdict.verdict === 'ignore') {
    await audit.append(
      {
        type: 'signal',
        ref: signal.id,
        node: signal.node,
        summary: `${describeSignal(signal)}; job ${trainingJob}: no action: ${verdict.reason}`,
        data: { signal, job: trainingJob },
        actor: signal.origin ?? CONTROLLER_IDENTITY,
      },
      `signal:${signal.id}`,
    );
    return { outcome: 'observed' };
  }
  const written = await audit.append(
    {
      type: 'signal',
      ref: signal.id,
      node: signal.node,
      summary: `${describeSignal(signal)}; job ${trainingJob}: ${verdict.faultClass} fault (${verdict.reason})`,
      data: { signal, job: trainingJob, faultClass: verdict.faultClass },
      actor: signal.origin ?? CONTROLLER_IDENTITY,
    },
    `signal:${signal.id}`,
  );
  // The audit marker is the claim: a signal already audited was taken by an earlier batch (the
  // sender's retry stored it again), and advancing the ladder twice would count one fault twice.
  // A retried batch goes on, as its own first attempt may have stopped between the two writes.
  if (written === undefined && firstAttempt) return { outcome: 'repeat' };
  // A machine fault a GPU reset may cure (the catalogue's remedy, resets on, the node's history
  // allowing one: the node ladder's reset rung) is reset in place; escalation past resets leaves
  // it to the job ladder's eviction.
  const node = signal.node;
  const choice =
    remedies && node && verdict.faultClass === 'machine'
      ? await climbNodeLadderReading(signal, verdict, () => remedies.history.read(node), remedies.config)
      : undefined;
  const resetGpu = choice !== undefined && 'rung' in choice && choice.rung.verb === 'reset_gpu' ? choice.rung.gpu : undefined;
  const event = faultEventFromSignal(signal, verdict, resetGpu);
  const steps = await dispatcher.apply({ job: trainingJob, event, eventId: signal.id, origin: signal.origin });
  return { outcome: steps.length > 0 ? 'decided' : 'joined' };
}

/**
 * Turns queued signals into decisions: each signal is classified once (fault-class.ts) and routed.
 * A signal about a registered job's node goes to its ladder (RecoveryDispatcher), any other to the
 * node ladder's rung (node-ladder.ts) and its NodeDispatcher; each dispatcher audits the decision
 * and puts its steps on the one steps queue. The worker itself takes no lock and runs no script.
 *
 * A job is a batch (SignalJob). Its signals about one node are taken in order, those about
 * different nodes side by side. A malformed signal (never one the intake stored) does not cost the
 * others: they are acted on, then the job fails for good naming it.
 */
export function createPolicyProcessor(deps: PolicyWorkerDeps): (job: Job<SignalJob>) => Promise<BatchResult> {
  const processSignal = signalProcessor(deps);
  return async (job) => {
    const batch = parseJobPayload(signalBatchSchema, job.data, 'signal job payload');
    const firstAttempt = (job.attemptsStarted ?? 1) <= 1;
    const byNode = new Map<string, Signal[]>();
    const invalid: string[] = [];
    for (const [index, raw] of batch.signals.entries()) {
      const parsed = signalSchema.safeParse(raw);
      if (!parsed.success) {
        invalid.push(describeIssues(parsed.error.issues, `signals.${index}`));
        continue;
      }
      const key = parsed.data.node ?? '';
      const signals = byNode.get(key);
      if (signals) signals.push(parsed.data);
      else byNode.set(key, [parsed.data]);
    }
    const outcomes: Partial<Record<PolicyResult['outcome'], number>> = {};
    await Promise.all(
      [...byNode.values()].map(async (signals) => {
        for (const signal of signals) {
          const { outcome } = await processSignal(signal, firstAttempt);
          outcomes[outcome] = (outcomes[outcome] ?? 0) + 1;
        }
      }),
    );
    if (invalid.length > 0)
      throw new UnrecoverableError(
        `invalid signal job payload: ${invalid.slice(0, 5).join('; ')}${invalid.length > 5 ? `; and ${invalid.length - 5} more` : ''}`,
      );
    return { outcomes, invalid: invalid.length };
  };
}

/** The decision for one signal. */
export function signalProcessor(deps: PolicyWorkerDeps): (signal: Signal, firstAttempt: boolean) => Promise<PolicyResult> {
  const { redis, keys, audit } = deps;
  const globalRemedies = deps.remedies?.config ?? remediesSchema.parse({});
  const remediesOf = async (node: string | undefined) => (node === undefined || !deps.remediesFor ? globalRemedies : deps.remediesFor(node, globalRemedies));
  const occurrences = new XidOccurrences(redis, keys);
  const globalLayers = deps.xidPolicy ?? [];
  const layersOf = async (node: string | undefined): Promise<readonly PolicyLayer[]> => {
    const profileLayer = node === undefined || !deps.profileXidLayer ? undefined : await deps.profileXidLayer(node);
    return profileLayer === undefined ? globalLayers : [...globalLayers, profileLayer];
  };

  return async (signal, firstAttempt) => {
    // A fault from before an operator returned its node to service was dealt with by that operator.
    const resumedAt = signal.node === undefined ? undefined : await lastResume(redis, keys, signal.node);
    if (resumedAt !== undefined && Date.parse(signal.time) <= resumedAt) {
      const resumed = new Date(resumedAt).toISOString();
      await audit.append(
        {
          type: 'signal',
          ref: signal.id,
          node: signal.node,
          summary: `${describeSignal(signal)}; no action: it dates from ${signal.time}, before an operator returned ${signal.node} to service at ${resumed}`,
          data: { signal, resumedAt: resumed },
          actor: signal.origin ?? CONTROLLER_IDENTITY,
        },
        `signal:${signal.id}`,
      );
      return { outcome: 'observed' };
    }
    // A configured rule for the signal's Xid or SXid decides over the catalogue (xid-rule.ts).
    const verdict = await applyXidPolicy(signal, classifySignal(signal), { layers: await layersOf(signal.node), occurrences });
    const trainingJob = deps.recovery && signal.node ? await deps.recovery.jobs.jobOnNode(signal.node) : undefined;
    const nodeRemedies = await remediesOf(signal.node);
    const remedies = deps.remedies && { ...deps.remedies, config: nodeRemedies };
    if (deps.recovery && trainingJob) return toLadder(audit, signal, verdict, trainingJob, deps.recovery.dispatcher, firstAttempt, remedies);
    // The node's remediation history is read only when a remedy rung could use it (all off: a drain).
    const history = deps.remedies?.history;
    const choice =
      signal.node === undefined
        ? { observe: 'signal names no node' }
        : await climbNodeLadderReading(signal, verdict, async () => (history && signal.node ? history.read(signal.node) : []), nodeRemedies);
    if ('observe' in choice) {
      await audit.append(
        {
          type: 'signal',
          ref: signal.id,
          node: signal.node,
          summary: `${describeSignal(signal)}; no action: ${choice.observe}`,
          data: { signal },
          actor: signal.origin ?? CONTROLLER_IDENTITY,
        },
        `signal:${signal.id}`,
      );
      return { outcome: 'observed' };
    }
    return deps.nodes.apply({ signal, node: choice.node, rung: choice.rung });
  };
}
