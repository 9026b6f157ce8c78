import type { Step } from '../../../core/steps.js';
import { CITE } from './config.js';
import { emit, pageHuman, setVerdict, step, type Ctx } from './context.js';

/**
 * Restarts as a bounded retry chain (504-GPU report: auto-retry chains): each relaunch uses one
 * try, later tries wait an exponential backoff, and a spent chain pages a person. Emitting a
 * restart also does the code-version bookkeeping it implies (ByteRobust §4.2, §6.1).
 */

/** Pages a human when the incident's retry chain is spent; true if it did. */
export function chainExhausted(ctx: Ctx): boolean {
  const retry = ctx.s.incident?.retry;
  if (retry === undefined || retry.attempts < ctx.config.retryLimit) return false;
  pageHuman(ctx, `retry chain spent: ${retry.attempts} restarts in this incident`, CITE.retry);
  return true;
}

/**
 * Uses one restart of the retry chain (504-GPU report): the first goes out now, later ones are
 * held until a tick past the backoff. A spent chain pages a human instead.
 */
export function launch(ctx: Ctx, requested: Step[]): void {
  const incident = ctx.s.incident;
  if (incident === null || chainExhausted(ctx)) return;
  const { config } = ctx;
  // A new relaunch replaces one still held back, but a held rollback must not get lost with it.
  const heldRollback = requested.some((candidate) => candidate.verb === 'rollback')
    ? []
    : (ctx.s.scheduled?.steps ?? []).filter((candidate) => candidate.verb === 'rollback');
  const restartSteps = [...heldRollback, ...requested];
  const delay = incident.retry.nextBackoffMs;
  incident.retry.attempts += 1;
  incident.retry.nextBackoffMs =
    incident.retry.attempts === 1 ? config.retryInitialBackoffMs : Math.min(incident.retry.nextBackoffMs * 2, config.retryMaxBackoffMs);
  if (delay <= 0) {
    ctx.s.scheduled = null;
    emitRestart(ctx, restartSteps);
    return;
  }
  ctx.s.scheduled = { notBefore: ctx.time + delay, steps: restartSteps };
  emit(ctx, 'tolerate', `restart ${incident.retry.attempts} of at most ${config.retryLimit} held back ${Math.round(delay / 1000)} s`, CITE.retry);
}

/**
 * Emits restart steps and does the version bookkeeping they imply: a rollback marks the version
 * it leaves bad (ByteRobust §4.2); otherwise a pending code update goes in front of the restart
 * or reattempt (§6.1: updates ride the recovery of the next failure).
 */
export function emitRestart(ctx: Ctx, restartSteps: Step[]): void {
  const { s, time } = ctx;
  const back = restartSteps.find((candidate) => candidate.verb === 'rollback')?.version;
  if (back !== undefined) {
    // A rollback deliberately goes back; a pending update must not ride along and undo it.
    const from = s.runningVersion;
    if (from !== null && from !== back) {
      setVerdict(s, from, 'bad', time);
      if (s.incident !== null) s.incident.rolledBackFrom = from;
    }
    const entry = s.codeVersions.find((candidate) => candidate.version === back);
    if (entry) entry.appliedAt = time;
    s.runningVersion = back;
    ctx.steps.push(...restartSteps);
    return;
  }
  const pending = s.pendingUpdate;
  const relaunch = restartSteps.findIndex((candidate) => candidate.verb === 'restart' || candidate.verb === 'reattempt');
  if (pending === null || relaunch < 0) {
    ctx.steps.push(...restartSteps);
    return;
  }
  const entry = s.codeVersions.find((candidate) => candidate.version === pending.version);
  if (entry) {
    entry.appliedAt = time;
    // A person asked for a version rolled back earlier: it gets a fresh chance to prove itself.
    if (entry.verdict === 'bad') setVerdict(s, entry.version, 'unproven', time);
  }
  s.runningVersion = pending.version;
  s.pendingUpdate = null;
  const why = pending.urgent ? 'urgent update applied at once' : 'update applied with this restart instead of a restart of its own';
  ctx.steps.push(
    ...restartSteps.slice(0, relaunch),
    step(ctx, 'apply_update', `${why} (${pending.version})`, CITE.hotUpdate, { version: pending.version }),
    ...restartSteps.slice(relaunch),
  );
}
