import type { FaultClass } from '../../../core/ladder.js';
import { CITE } from './config.js';
import { appendTime, emit, emptyTried, enterRung, leaveRunning, pageHuman, resetKey, rollbackTarget, step, type Ctx } from './context.js';
import { noteEvictions } from './evidence.js';
import { chainExhausted, launch } from './retry-chain.js';
import { hotSwap } from './hot-swap.js';
import type { LadderState } from './state.js';

/**
 * The rungs of ByteRobust's ladder (§4.1, §4.2): evict, diagnose, reattempt, roll back, replay,
 * and escalation from one to the next when a relaunch fails. Each sets the phase and emits the
 * steps the step actuators carry out (actuators/steps/).
 */

/** The nodes that are still in the job: not quarantined, not evicted earlier in this incident. */
export function stillInJob(s: LadderState, nodes: string[]): string[] {
  const evictedBefore = s.incident?.evictedNodes ?? [];
  return nodes.filter((node) => !s.quarantined.includes(node) && !evictedBefore.includes(node));
}

/** Evicts the nodes still in the job and relaunches on standbys; only records when none is left. */
export function evictAndRestart(ctx: Ctx, nodes: string[], trigger: FaultClass, why: string, citation: string): void {
  const { s } = ctx;
  const targets = stillInJob(s, nodes);
  if (targets.length === 0) {
    emit(ctx, 'tolerate', `${why}; ${nodes.join(', ')} already out of the job`, citation, { nodes });
    return;
  }
  // DeadPool §V-C, §VI: a machine's failure on a hot-swap job is cured by a spare while the job runs.
  if (trigger === 'machine' && hotSwap(ctx, targets, why)) return;
  const incident = leaveRunning(ctx, trigger, why);
  emit(ctx, 'evict', why, citation, { nodes: targets });
  noteEvictions(ctx, incident, targets);
  enterRung(ctx, 'evict', 'stopped');
  launch(ctx, [step(ctx, 'restart', `relaunch on warm standbys replacing ${targets.join(', ')}`, CITE.standby)]);
}

/**
 * A machine fault whose cure is a GPU reset (FaultEvent.resetGpu): the job stops, the recovery
 * actuator resets that GPU through the node's agent — or, refused or failed, evicts the node as
 * evictAndRestart would — and the job is relaunched. No standby is used when the reset holds.
 */
export function resetAndRestart(ctx: Ctx, node: string, gpu: string, why: string): void {
  if (stillInJob(ctx.s, [node]).length === 0) {
    emit(ctx, 'tolerate', `${why}; ${node} already out of the job`, CITE.gpuReset, { nodes: [node] });
    return;
  }
  leaveRunning(ctx, 'machine', why);
  ctx.s.gpuResets = appendTime(ctx.s.gpuResets, resetKey(node, ctx.signature), ctx.time);
  emit(ctx, 'reset_gpu', `${why}; reset GPU ${gpu} of ${node} in place (evict ${node} if the reset is refused or fails)`, CITE.gpuReset, {
    nodes: [node],
    gpu,
  });
  enterRung(ctx, 'evict', 'stopped');
  launch(ctx, [step(ctx, 'restart', `relaunch after the reset of GPU ${gpu} on ${node}`, CITE.gpuReset)]);
}

export function diagnose(ctx: Ctx, why: string, hintNodes: string[], citation: string = CITE.diagnose): void {
  enterRung(ctx, 'diagnose', 'diagnosing');
  emit(ctx, 'run_diagnostics', why, citation, { nodes: hintNodes });
}

export function reattempt(ctx: Ctx, why: string): void {
  if (chainExhausted(ctx)) return;
  enterRung(ctx, 'reattempt', 'reattempting');
  launch(ctx, [step(ctx, 'reattempt', `${why}; assume a transient fault and restart in place`, CITE.reattempt)]);
}

/** The versions change when the rollback step is emitted (see emitRestart), not when it is held. */
export function rollback(ctx: Ctx, target: string, why: string, citation: string): void {
  if (chainExhausted(ctx)) return;
  enterRung(ctx, 'rollback', 'rolling_back');
  const from = ctx.s.runningVersion;
  launch(ctx, [
    step(ctx, 'rollback', `${why}; roll back${from === null ? '' : ` from ${from}`} to the last good version ${target}`, citation, { version: target }),
    step(ctx, 'restart', `relaunch on ${target}`, citation),
  ]);
}

export function replay(ctx: Ctx, why: string, citation: string): void {
  enterRung(ctx, 'replay', 'replaying');
  emit(ctx, 'run_replay', `${why}; assume an unknown fault (e.g. silent data corruption) and localise it by replay`, citation);
}

export type FailedRung = 'evict' | 'update' | 'reattempt' | 'rollback';

/**
 * The next untried rung after a relaunch failed (ByteRobust §4.2):
 * - after an eviction or a code update: roll back (step ⑦); with no good version to go back to,
 *   the stop-time checks (§4.1: "enter the stop-time check procedure"); then replay;
 * - after a reattempt: roll back (step ⑥), else replay;
 * - after a rollback: dual-phase replay (step ⑧);
 * and a human once those are spent in this incident.
 */
export function escalate(ctx: Ctx, why: string, failed: FailedRung): void {
  const { s } = ctx;
  const tried = s.incident?.tried ?? emptyTried();
  const target = failed !== 'rollback' && tried.rollback === 0 ? rollbackTarget(s) : null;
  if (target !== null) {
    const citation = failed === 'reattempt' ? CITE.rollbackAfterReattempt : failed === 'update' ? CITE.rollbackAfterUpdate : CITE.rollbackAfterEviction;
    rollback(ctx, target, why, citation);
    return;
  }
  const noTarget = failed !== 'rollback' && tried.rollback === 0 ? '; no earlier good code version to roll back to' : '';
  if ((failed === 'evict' || failed === 'update') && tried.diagnose === 0) {
    diagnose(ctx, `${why}${noTarget}`, [], CITE.diagnoseAfterEviction);
  } else if (tried.replay === 0) {
    replay(ctx, `${why}${noTarget}`, CITE.replay);
  } else {
    pageHuman(ctx, `${why}; every rung of the ladder was tried in this incident`, CITE.human);
  }
}

export function applyUpdateNow(ctx: Ctx, why: string): void {
  leaveRunning(ctx, 'code_update', why);
  enterRung(ctx, 'update', 'stopped');
  // The apply_update step goes in front of the restart when it is emitted (emitRestart).
  launch(ctx, [step(ctx, 'restart', `${why}; halt, hot-update in place, relaunch`, CITE.hotUpdate)]);
}
