import { UnrecoverableError, type Job, type Queue } from 'bullmq';
import { z } from 'zod';
import type { Decision } from '../../core/action.js';
import { decisionSchema } from '../../core/action.js';
import type { AuditLog } from '../../core/audit.js';
import { CONTROLLER_IDENTITY } from '../../core/credentials.js';
import { parseJobPayload } from '../../core/job-payload.js';
import type { Keys, Redis } from '../../core/redis.js';
import { signalSchema, stableHash, type Signal } from '../../core/signal.js';
import { classifySignal } from './fault-class.js';
import type { JobStore } from '../job-store.js';
import { faultEventFromSignal } from './ladder/index.js';
import type { RecoveryDispatcher } from './recovery-dispatcher.js';
import type { ActionJob, SignalJob } from '../../core/queues.js';
import { describeIssues } from '../../core/validate.js';
import { decide } from './policy.js';
import type { RemediationHistory } from '../../actuators/remediation-history.js';
import type { RemediesConfig } from '../../core/remedy-config.js';
import { chooseRemedyReading } from './remedy-policy.js';

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
  readonly actions: Queue<ActionJob>;
  /** Reports for a node already being drained, within this window, join the first decision. */
  readonly dedupeSeconds: number;
  /** Registered jobs and their recovery ladders; signals about a job's node go to its ladder. */
  readonly recovery?: { readonly jobs: JobStore; readonly dispatcher: RecoveryDispatcher };
  /** Remedies short of a drain (remedy-policy.ts); without them every such fault drains the node. */
  readonly remedies?: { readonly config: RemediesConfig; readonly history: RemediationHistory };
}

// Claims the node for a decision and stores the decision in one step. Returns the id of the
// decision that holds the claim: ours when we got it (or had it already, on a retried job).
const CLAIM = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
  return ARGV[1]
end
return redis.call('GET', KEYS[1])
`;

function describe(signal: Signal): string {
  const what = signal.kind === 'xid' ? `Xid ${String(signal.evidence.xid ?? '?')}` : signal.kind === 'alert' ? String(signal.evidence.alertname) : signal.kind;
  const where = [signal.node, signal.gpu].filter(Boolean).join(' GPU ');
  const status = signal.evidence.status === 'resolved' ? ' (resolved)' : '';
  return `${signal.source} reports ${what}${where ? ` on ${where}` : ''}${status}`;
}

/**
 * A signal about a node of a registered job goes to that job's recovery ladder (ByteRobust §4,
 * DeadPool Table II): classify, advance, and let the recovery actuator carry out the steps.
 */
async function toLadder(audit: AuditLog, signal: Signal, trainingJob: string, dispatcher: RecoveryDispatcher, firstAttempt: boolean, remedies: PolicyWorkerDeps['remedies']): Promise<PolicyResult> {
  const verdict = classifySignal(signal);
  if (verdict.verdict === 'ignore') {
    await audit.append(
      { type: 'signal', ref: signal.id, node: signal.node, summary: `${describe(signal)}; job ${trainingJob}: no action: ${verdict.reason}`, data: { signal, job: trainingJob }, actor: signal.origin ?? CONTROLLER_IDENTITY },
      `signal:${signal.id}`,
    );
    return { outcome: 'observed' };
  }
  const written = await audit.append(
    {
      type: 'signal',
      ref: signal.id,
      node: signal.node,
      summary: `${describe(signal)}; job ${trainingJob}: ${verdict.faultClass} fault (${verdict.reason})`,
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
  // allowing one) is reset in place; escalation past resets leaves it to the ladder's eviction.
  const node = signal.node;
  const remedy = remedies && node && verdict.faultClass === 'machine' ? await chooseRemedyReading(signal, verdict.reason, () => remedies.history.read(node), remedies.config) : undefined;
  const event = faultEventFromSignal(signal, verdict, remedy?.verb === 'reset_gpu' ? remedy.gpu : undefined);
  const steps = await dispatcher.apply({ job: trainingJob, event, eventId: signal.id, origin: signal.origin });
  return { outcome: steps.length > 0 ? 'decided' : 'joined' };
}

/**
 * Turns queued signals into decisions: a signal about a registered job's node goes to its ladder,
 * any other to the node policy (policy.ts). Every report of a fault on a node that is already being
 * drained joins the existing decision instead of making a new one, which is how the agent's fast
 * path and the later Prometheus alert for the same Xid lead to exactly one drain.
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
    if (invalid.length > 0) throw new UnrecoverableError(`invalid signal job payload: ${invalid.slice(0, 5).join('; ')}${invalid.length > 5 ? `; and ${invalid.length - 5} more` : ''}`);
    return { outcomes, invalid: invalid.length };
  };
}

/** The decision for one signal. */
export function signalProcessor(deps: PolicyWorkerDeps): (signal: Signal, firstAttempt: boolean) => Promise<PolicyResult> {
  const { redis, keys, audit, actions, dedupeSeconds } = deps;

  return async (signal, firstAttempt) => {
    const trainingJob = deps.recovery && signal.node ? await deps.recovery.jobs.jobOnNode(signal.node) : undefined;
    if (deps.recovery && trainingJob) return toLadder(audit, signal, trainingJob, deps.recovery.dispatcher, firstAttempt, deps.remedies);
    const outcome = decide(signal);
    if (outcome.verb === 'observe') {
      await audit.append(
        { type: 'signal', ref: signal.id, node: signal.node, summary: `${describe(signal)}; no action: ${outcome.reason}`, data: { signal }, actor: signal.origin ?? CONTROLLER_IDENTITY },
        `signal:${signal.id}`,
      );
      return { outcome: 'observed' };
    }

    // The node's remediation history is read only when a remedy rung could use it (all off: a drain).
    const remedies = deps.remedies;
    const remedy = remedies
      ? await chooseRemedyReading(signal, outcome.reason, () => remedies.history.read(outcome.node), remedies.config)
      : { verb: 'drain' as const, reason: outcome.reason, gpu: undefined };
    // A drain keeps the id it always had (`drain|…`), so a fault decided before an upgrade is recognised after it.
    const decisionId = `d-${stableHash(`${remedy.verb}|${signal.id}`)}`;
    const decision: Decision = {
      id: decisionId,
      verb: remedy.verb,
      node: outcome.node,
      ...(remedy.gpu === undefined ? {} : { gpu: remedy.gpu }),
      // BullMQ job ids may not contain ':'.
      idempotencyKey: `${remedy.verb.replace('_', '-')}-${outcome.node}-${decisionId}`,
      reason: remedy.reason.slice(0, 512),
      signalId: signal.id,
      fingerprint: signal.fingerprint,
      faultTime: signal.time,
      time: new Date().toISOString(),
      ...(signal.origin ? { origin: signal.origin } : {}),
    };
    const holder = (await redis.eval(
      CLAIM,
      2,
      keys.nodeDrainClaim(outcome.node),
      keys.decision(decisionId),
      decisionId,
      JSON.stringify(decision),
      String(dedupeSeconds),
    )) as string | null;

    if (holder !== null && holder !== decisionId) {
      const existingRaw = await redis.get(keys.decision(holder));
      const existing = existingRaw ? decisionSchema.safeParse(JSON.parse(existingRaw)) : undefined;
      const sameFault = existing?.success === true && existing.data.fingerprint === signal.fingerprint;
      const relation = sameFault ? 'same fault as' : 'node already being drained by';
      await audit.append(
        {
          type: 'signal',
          ref: signal.id,
          node: signal.node,
          summary: `${describe(signal)}; ${relation} decision ${holder}`,
          data: { signal, duplicateOf: holder, sameFault },
          actor: signal.origin ?? CONTROLLER_IDENTITY,
        },
        `signal:${signal.id}`,
      );
      return { outcome: 'joined', decisionId: holder, sameFault };
    }

    // A retried job finds the decision its first attempt stored; act on that one.
    const storedRaw = await redis.get(keys.decision(decisionId));
    const storedParse = storedRaw ? decisionSchema.safeParse(JSON.parse(storedRaw)) : undefined;
    const stored = storedParse?.success ? storedParse.data : decision;
    await audit.append(
      { type: 'signal', ref: signal.id, node: signal.node, summary: `${describe(signal)}; new decision ${decisionId}`, data: { signal }, actor: signal.origin ?? CONTROLLER_IDENTITY },
      `signal:${signal.id}`,
    );
    await audit.append(
      { type: 'decision', ref: decisionId, node: stored.node, summary: `${stored.verb} ${stored.node}${stored.gpu ? ` GPU ${stored.gpu}` : ''}: ${stored.reason}`, data: { decision: stored }, actor: stored.origin ?? CONTROLLER_IDENTITY },
      `decision:${decisionId}`,
    );
    await actions.add(stored.verb, { decision: stored }, { jobId: stored.idempotencyKey });
    return { outcome: 'decided', decisionId };
  };
}
