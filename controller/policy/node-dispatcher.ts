import type { Queue } from 'bullmq';
import type { AuditLog } from '../../core/audit.js';
import { CONTROLLER_IDENTITY } from '../../core/credentials.js';
import { Locks } from '../../core/locks.js';
import type { Keys, Redis } from '../../core/redis.js';
import { stableHash, type Signal } from '../../core/signal.js';
import { STEPS_JOB_VERSION, stepsJobSchema, type StepsJob } from '../../core/queues.js';
import { profileSuffix, type NodeProfiles } from '../../core/profiles.js';
import { describeSignal } from './describe-signal.js';
import { nodeStep, type NodeRung } from './node-ladder.js';

/** A classified signal about a node outside any job, and the node ladder's rung for it (node-ladder.ts). */
export interface NodeDecisionInput {
  readonly signal: Signal;
  readonly node: string;
  readonly rung: NodeRung;
}

/** What became of it: a new decision (ours, or the one a retried batch made), or the one it joined. */
export type NodeDispatch =
  { readonly outcome: 'decided'; readonly decisionId: string } | { readonly outcome: 'joined'; readonly decisionId: string; readonly sameFault: boolean };

/**
 * The node ladder's side of the RecoveryDispatcher: turns the rung chosen for a node outside any
 * job into ONE transition on the steps queue. The node is claimed for the decision (core/locks.ts,
 * with the transition stored beside the claim) for `dedupeSeconds`: every report of a fault on a
 * node already claimed joins that decision instead of making a new one, which is how the agent's
 * fast path and the later Prometheus alert for the same Xid lead to exactly one drain. The step
 * actuators give the claim back when the gates refuse the step.
 */
export class NodeDispatcher {
  private readonly locks: Locks;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly audit: AuditLog,
    private readonly steps: Queue<StepsJob>,
    private readonly dedupeSeconds: number,
    /** The nodes' profiles (config `profiles:`): a decision names its node's, whose rungs it keeps to. */
    private readonly profiles?: NodeProfiles,
  ) {
    this.locks = new Locks(redis, keys);
  }

  /** Claims the node for the rung's decision, audits the signal and the decision, and enqueues its step. */
  async apply({ signal, node, rung: chosen }: NodeDecisionInput): Promise<NodeDispatch> {
    const match = this.profiles === undefined ? undefined : await this.profiles.resolve(node);
    const profile = match?.kind === 'profile' ? match.profile : undefined;
    // A profile with hand-off off drains a node where the ladder would hand it to people.
    const rung: NodeRung =
      profile?.remedies?.handOff === false && chosen.verb === 'hand_off'
        ? { verb: 'drain', reason: `${chosen.reason}; hand-off is off in profile ${profile.name}: drained instead` }
        : chosen;
    // The decision's id: the rung's verb and the signal, so a redelivered signal finds the decision it made.
    const decisionId = `d-${stableHash(`${rung.verb}|${signal.id}`)}`;
    const transition: StepsJob = {
      v: STEPS_JOB_VERSION,
      transitionId: decisionId,
      node,
      steps: [nodeStep(node, rung)],
      ...(signal.origin ? { origin: signal.origin } : {}),
      fault: { signalId: signal.id, fingerprint: signal.fingerprint, time: signal.time },
    };
    const holder = await this.locks.claimNode(node, decisionId, JSON.stringify(transition), this.dedupeSeconds);
    if (holder !== null && holder !== decisionId) {
      const sameFault = (await this.stored(holder))?.fault?.fingerprint === signal.fingerprint;
      const relation = sameFault ? 'same fault as' : 'node already being drained by';
      await this.audit.append(
        {
          type: 'signal',
          ref: signal.id,
          node: signal.node,
          summary: `${describeSignal(signal)}; ${relation} decision ${holder}`,
          data: { signal, duplicateOf: holder, sameFault },
          actor: signal.origin ?? CONTROLLER_IDENTITY,
        },
        `signal:${signal.id}`,
      );
      return { outcome: 'joined', decisionId: holder, sameFault };
    }
    // A retried job finds the transition its first attempt stored; act on that one.
    const stored = (await this.stored(decisionId)) ?? transition;
    const [step] = stored.steps;
    await this.audit.append(
      {
        type: 'signal',
        ref: signal.id,
        node: signal.node,
        summary: `${describeSignal(signal)}; new decision ${decisionId}`,
        data: { signal },
        actor: signal.origin ?? CONTROLLER_IDENTITY,
      },
      `signal:${signal.id}`,
    );
    await this.audit.append(
      {
        type: 'decision',
        ref: decisionId,
        node,
        summary: `${step?.verb ?? rung.verb} ${node}${step?.gpu ? ` GPU ${step.gpu}` : ''}: ${step?.reason ?? rung.reason}${profileSuffix(profile?.name)}`,
        data: { decision: stored, ...(profile === undefined ? {} : { profile: profile.name }) },
        actor: stored.origin ?? CONTROLLER_IDENTITY,
      },
      `decision:${decisionId}`,
    );
    await this.steps.add('node', stored, { jobId: decisionId });
    return { outcome: 'decided', decisionId };
  }

  /** The transition stored with a decision's claim, if it is there and reads back. */
  private async stored(decisionId: string): Promise<StepsJob | undefined> {
    const raw = await this.redis.get(this.keys.decision(decisionId));
    if (raw === null) return undefined;
    try {
      const parsed = stepsJobSchema.safeParse(JSON.parse(raw));
      return parsed.success ? parsed.data : undefined;
    } catch {
      return undefined;
    }
  }
}
