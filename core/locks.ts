import { luaScript, type Keys, type Redis } from './redis.js';

/**
 * Who may act on what, in Redis: every claim, lease and hold is taken, renewed and let go here,
 * each operation one script (or one command), each script written once.
 *
 * - A node's claim: the decision acting on a node outside any job. The node dispatcher takes it
 *   with the decision it stores; a refused step gives it back, a GPU reset that held shortens it,
 *   an operator returning the node to service closes it.
 * - A node's lease: the one actuator working on a node now (SafetyGates).
 * - A job's hold: the one transition running on a job now (the step processor), renewed while it runs.
 * - A budget slot: a decision counted once against the eviction budget's window (SafetyGates.admit).
 * - The analysis leader's lease: the one replica running the online analyzers.
 *
 * A holder lets go only of what it holds: a key since taken by another is left alone.
 */

// Deletes the key if `ARGV[1]` holds it.
const RELEASE_IF_HELD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

// Sets the key to expire in `ARGV[2]` ms if `ARGV[1]` holds it.
const RENEW_IF_HELD = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end return 0";

// Claims the node for a decision and stores the decision in one step. Returns the id of the
// decision that holds the claim: ours when we got it (or had it already, on a retried job).
const CLAIM_NODE = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[3]) then
  redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
  return ARGV[1]
end
return redis.call('GET', KEYS[1])
`;

// Keeps the later of two resume times, releases the node's claim and answers the decision it
// pointed at, in one step: a fault decided between the two cannot find the claim gone but the
// resume not yet recorded.
const CLOSE_ON_RESUME = `
local old = tonumber(redis.call('HGET', KEYS[2], ARGV[1]))
if old == nil or old < tonumber(ARGV[2]) then redis.call('HSET', KEYS[2], ARGV[1], ARGV[2]) end
local claim = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
return claim`;

// Counts a decision against the window once: a retried job that was already counted passes.
const TAKE_BUDGET_SLOT = `
if redis.call('ZSCORE', KEYS[1], ARGV[4]) then return 1 end
local now = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[4])
redis.call('PEXPIRE', KEYS[1], window)
return 1
`;

type Script = (...args: (string | number)[]) => Promise<unknown>;

export class Locks {
  private readonly releaseIfHeld: Script;
  private readonly renewIfHeld: Script;
  private readonly claim: Script;
  private readonly closeOnResume: Script;
  private readonly takeSlot: Script;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {
    this.releaseIfHeld = luaScript(redis, 'steadfastReleaseIfHeld', 1, RELEASE_IF_HELD);
    this.renewIfHeld = luaScript(redis, 'steadfastRenewIfHeld', 1, RENEW_IF_HELD);
    this.claim = luaScript(redis, 'steadfastClaimNode', 2, CLAIM_NODE);
    this.closeOnResume = luaScript(redis, 'steadfastCloseOnResume', 2, CLOSE_ON_RESUME);
    this.takeSlot = luaScript(redis, 'steadfastTakeBudgetSlot', 1, TAKE_BUDGET_SLOT);
  }

  /**
   * Claims `node` for `decisionId` for `seconds`, storing `decision` (its transition) beside the
   * claim. Returns the decision that holds the claim: `decisionId` when it was taken now or
   * before, another's when the node is already claimed, null when the claim vanished meanwhile.
   */
  async claimNode(node: string, decisionId: string, decision: string, seconds: number): Promise<string | null> {
    return (await this.claim(this.keys.nodeDrainClaim(node), this.keys.decision(decisionId), decisionId, decision, String(seconds))) as string | null;
  }

  /** The decision that holds the node's claim, if one does. */
  async nodeClaim(node: string): Promise<string | null> {
    return this.redis.get(this.keys.nodeDrainClaim(node));
  }

  /** Gives back the node's claim if `decisionId` holds it. */
  async releaseNodeClaim(node: string, decisionId: string): Promise<void> {
    await this.releaseIfHeld(this.keys.nodeDrainClaim(node), decisionId);
  }

  /** Lets the node's claim lapse `seconds` from now if `decisionId` holds it. */
  async shortenNodeClaim(node: string, decisionId: string, seconds: number): Promise<void> {
    await this.renewIfHeld(this.keys.nodeDrainClaim(node), decisionId, String(seconds * 1000));
  }

  /** Records that `node` went back to service at `at` (ms) and releases its claim; returns the decision the claim pointed at. */
  async closeNodeClaimOnResume(node: string, at: number): Promise<string | undefined> {
    const claim = (await this.closeOnResume(this.keys.nodeDrainClaim(node), this.keys.nodeResumes, node, String(at))) as string | null;
    return claim ?? undefined;
  }

  /** Takes the node's lease for `holder` for `ms`; undefined when taken (or already held by `holder`), else who holds it. */
  async takeLease(node: string, holder: string, ms: number): Promise<string | undefined> {
    const key = this.keys.nodeLease(node);
    if ((await this.redis.set(key, holder, 'PX', ms, 'NX')) === 'OK') return undefined;
    const current = await this.redis.get(key);
    if (current === holder) return undefined;
    return current ?? 'another actuator';
  }

  async releaseLease(node: string, holder: string): Promise<void> {
    await this.releaseIfHeld(this.keys.nodeLease(node), holder);
  }

  /** Takes the one-validation-at-a-time lease on `node` for `holder` (a controller's follow-up validation); false when another holds it. */
  async takeValidationLease(node: string, holder: string, ms: number): Promise<boolean> {
    return (await this.redis.set(this.keys.validationLease(node), holder, 'PX', ms, 'NX')) === 'OK';
  }

  async releaseValidationLease(node: string, holder: string): Promise<void> {
    await this.releaseIfHeld(this.keys.validationLease(node), holder);
  }

  /** Makes `holder`'s lease on the node last `ms` from now (a step about to wait on the node longer than a lease); nothing when another holds it. */
  async renewLease(node: string, holder: string, ms: number): Promise<void> {
    await this.renewIfHeld(this.keys.nodeLease(node), holder, String(ms));
  }

  /** Holds the job for `holder` for `ms`; false when another holds it. */
  async holdJob(job: string, holder: string, ms: number): Promise<boolean> {
    return (await this.redis.set(this.keys.jobStepsHold(job), holder, 'PX', ms, 'NX')) === 'OK';
  }

  async renewJobHold(job: string, holder: string, ms: number): Promise<void> {
    await this.renewIfHeld(this.keys.jobStepsHold(job), holder, String(ms));
  }

  async releaseJobHold(job: string, holder: string): Promise<void> {
    await this.releaseIfHeld(this.keys.jobStepsHold(job), holder);
  }

  /** Takes or renews the analysis leader's lease for `replica` for `ms`; false while another replica holds it. */
  async leadAnalysis(replica: string, ms: number): Promise<boolean> {
    const key = this.keys.analysisLeader;
    if ((await this.redis.set(key, replica, 'PX', ms, 'NX')) === 'OK') return true;
    return Number(await this.renewIfHeld(key, replica, String(ms))) === 1;
  }

  /** Counts `decisionId` in the budget's window (once): false when `max` decisions already fill it. */
  async takeBudgetSlot(decisionId: string, now: number, windowMs: number, max: number, key = this.keys.drainBudget): Promise<boolean> {
    return Number(await this.takeSlot(key, String(now), String(windowMs), String(max), decisionId)) === 1;
  }
}
