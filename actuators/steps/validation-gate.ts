import type { Keys, Redis } from '../../core/redis.js';
import type { RemedyAction } from '../../core/remedy.js';
import { validationFailure, type NodeValidation, type NodeValidator } from '../node-validation.js';
import { leaseHolder, recordStep, rememberRemedy, stepRef, type StepAt, type StepBase } from './context.js';

/** What the gate works with: the steps' base, the step's progress in Redis, and the validator (none: validation is off). */
export interface ValidationGateDeps extends StepBase {
  readonly redis: Redis;
  readonly keys: Keys;
  readonly validator?: NodeValidator | undefined;
}

/**
 * The gate a step passes just before it returns a node it took out to service (validation:
 * actuators/node-validation.ts). Passed (or validation off): false, and the caller resumes the
 * node. Failed: the node stays out, drained with a reason naming the failed check, its remediation
 * history (the remedy that held, `remedy`, then the drain) and the audit record it, and true. A redelivered step does not validate twice: the
 * verdict is kept under the step's ref.
 */
export async function keptOutByValidation(deps: ValidationGateDeps, at: StepAt, node: string, what: string, remedy?: RemedyAction): Promise<boolean> {
  const { validator } = deps;
  if (validator === undefined) return false;
  const progress = deps.keys.action(stepRef(at));
  const kept = await deps.redis.hget(progress, 'validation');
  // A validation outlasts the node's lease (60 s by default against up to minutes): keep it held meanwhile.
  if (kept === null && validator.maxSeconds !== undefined) await deps.gates.renewLease(node, leaseHolder(at), (validator.maxSeconds + 30) * 1000);
  const verdict: NodeValidation = kept !== null ? (JSON.parse(kept) as NodeValidation) : await validator.validate(node);
  if (kept === null)
    await deps.redis.hset(progress, 'validation', JSON.stringify({ ok: verdict.ok, failed: verdict.failed, detail: verdict.detail, seconds: verdict.seconds }));
  if (verdict.ok) {
    await recordStep(deps, at, 'running', `${node} validated before its return to service in ${verdict.seconds.toFixed(1)} s: ${verdict.detail}`, {
      part: 'validated',
    });
    return false;
  }
  const why = validationFailure(verdict);
  await deps.backend.drain(node, `steadfast: ${what}; ${why} audit=${at.transitionId}`.slice(0, 1000));
  const detail = `${what}; ${why}; node kept out of service`;
  // The remedy itself held; the node failed what comes after it.
  if (remedy !== undefined) await rememberRemedy(deps, at, node, remedy, 'done', what, remedy);
  await rememberRemedy(deps, at, node, 'drain', 'done', why, 'validation');
  await recordStep(deps, at, 'done', detail, { data: { validation: { ok: false, failed: verdict.failed, seconds: verdict.seconds } } });
  return true;
}
