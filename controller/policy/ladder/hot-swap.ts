import type { FaultClass } from '../../../core/ladder.js';
import { CITE } from './config.js';
import { emit, enterRung, leaveRunning, setVerdict, step, unique, type Ctx } from './context.js';
import { noteEvictions, onStandbyActivated } from './evidence.js';
import { launch } from './retry-chain.js';

/**
 * The hot-swap rung (DeadPool §V-C, §VI; ByteRobust §6.3): on a job registered with spares, a
 * machine fault is cured while the job keeps running. The failed nodes' shards move to spares in
 * a new recovery epoch, the spares rebuild the state from the per-step in-memory replicas and the
 * survivors meet them under a fresh rendezvous; the job is not stopped. The epoch ends when every
 * shard stepped in it (`hot_swap_done`), or falls back to today's stop, evict and relaunch
 * (`hot_swap_failed`, a fault on a spare of the epoch). A transient communication fault on such a
 * job opens an epoch with the same shards.
 */

/** Whether a hot swap can replace `targets` now: the job has hot swap, trains without an incident, and has a spare for each. */
export function canHotSwap(ctx: Ctx, targets: readonly string[]): boolean {
  const spares = ctx.hotSwap?.spares ?? [];
  return ctx.hotSwap !== undefined && ctx.s.phase === 'running' && ctx.s.incident === null && targets.length > 0 && spares.length >= targets.length;
}

/** Emits the hot swap of `targets` when canHotSwap; false (nothing emitted) otherwise. */
export function hotSwap(ctx: Ctx, targets: string[], why: string): boolean {
  if (!canHotSwap(ctx, targets)) return false;
  const { s, time } = ctx;
  const spares = (ctx.hotSwap?.spares ?? []).slice(0, targets.length);
  const incident = leaveRunning(ctx, 'machine', why, { stop: false });
  const pairs = targets.map((node, index) => `${spares[index] ?? ''} in place of ${node}`).join(', ');
  emit(ctx, 'hot_swap', `${why}; hot swap: ${pairs} while the job keeps running (stop and relaunch if it does not finish)`, CITE.hotSwap, {
    nodes: targets,
    spares,
  });
  noteEvictions(ctx, incident, targets);
  // A crash on a spare soon after says the swap did not help, as for a standby (evidence.ts).
  targets.forEach((node, index) => onStandbyActivated(ctx, node, spares[index] ?? node));
  enterRung(ctx, 'hot_swap', 'swapping');
  s.swap = { openedAt: time, nodes: [...targets], spares };
  return true;
}

/**
 * A transient communication fault tolerated on a hot-swap job (the network flap): the ranks meet
 * again in a new epoch with the same shards, without stopping. False when the job has no hot
 * swap or is not training normally.
 */
export function communicationEpoch(ctx: Ctx, what: string): boolean {
  const { s } = ctx;
  if (ctx.hotSwap === undefined || s.phase !== 'running' || s.incident !== null) return false;
  leaveRunning(ctx, 'network', what, { stop: false });
  emit(ctx, 'hot_swap', `${what}; a communication fault: the ranks meet again in a new epoch with the same shards, without stopping`, CITE.hotSwapEpoch, {
    nodes: [],
  });
  enterRung(ctx, 'hot_swap', 'swapping');
  s.swap = { openedAt: ctx.time, nodes: [], spares: [] };
  return true;
}

/** What the open swap is called in the audit: "hot swap of node-1" or the epoch of a communication fault. */
function swapName(ctx: Ctx): string {
  const nodes = ctx.s.swap?.nodes ?? [];
  return nodes.length > 0 ? `hot swap of ${nodes.join(', ')}` : 'recovery epoch after a communication fault';
}

/**
 * A fault while a swap is under way. Faults the swap itself causes are tolerated: a crash or a
 * worker failure on a swapped node or on none (the failed node's ranks dying, a survivor's torn
 * collective), anything more on a swapped node, network alerts while the ranks meet again,
 * transient and performance faults. A fault on a spare of the epoch, or a machine fault, crash or
 * code error elsewhere, falls back to stop and relaunch (evicting the spare or machine it names).
 */
export function onFaultWhileSwapping(ctx: Ctx, faultClass: FaultClass, nodes: string[], what: string): void {
  const swap = ctx.s.swap ?? { openedAt: ctx.time, nodes: [], spares: [] };
  const onSpare = nodes.filter((node) => swap.spares.includes(node));
  if (onSpare.length > 0) {
    fallBack(ctx, `${what}: on ${onSpare.join(', ')}, a spare of the swap`, onSpare);
    return;
  }
  const elsewhere = nodes.filter((node) => !swap.nodes.includes(node));
  const partOfSwap =
    faultClass === 'transient' ||
    faultClass === 'performance' ||
    faultClass === 'network' ||
    (elsewhere.length === 0 && (faultClass === 'crash' || faultClass === 'machine'));
  if (partOfSwap) {
    emit(ctx, 'tolerate', `${what}; part of the ${swapName(ctx)}`, CITE.hotSwap, { nodes });
    return;
  }
  fallBack(ctx, what, faultClass === 'machine' ? elsewhere : []);
}

/** Every shard stepped in the swap's epoch: the job trains again, the incident is closed. */
export function onHotSwapDone(ctx: Ctx, epoch: number, summary: string): void {
  const { s, time } = ctx;
  if (s.phase !== 'swapping') {
    emit(ctx, 'tolerate', `hot swap done reported for epoch ${epoch} but no hot swap is under way (${s.phase})`, CITE.hotSwap);
    return;
  }
  emit(ctx, 'notify', `hot swap done: ${summary}`, CITE.hotSwap);
  if (s.runningVersion !== null) setVerdict(s, s.runningVersion, 'good', time);
  s.phase = 'running';
  s.incident = null;
  s.scheduled = null;
  s.swap = null;
}

/** The swap cannot finish (bound passed, a rank failed, it could not start): today's road. */
export function onHotSwapFailed(ctx: Ctx, detail: string, evict: string[]): void {
  if (ctx.s.phase !== 'swapping') {
    emit(ctx, 'tolerate', `hot swap failure reported (${detail}) but no hot swap is under way (${ctx.s.phase})`, CITE.hotSwap, { nodes: evict });
    return;
  }
  fallBack(ctx, detail, evict);
}

/**
 * Falls back to stop, evict and relaunch through the launcher: the nodes the swap took out are
 * already drained and replaced; `evict` are those it did not take out, or a spare that failed.
 */
function fallBack(ctx: Ctx, why: string, evict: string[]): void {
  const { s } = ctx;
  const name = swapName(ctx);
  const said = `${name} failed (${why}); falling back to stop and relaunch`;
  s.swap = null;
  const incident = leaveRunning(ctx, 'machine', said);
  emit(ctx, 'stop', said, CITE.hotSwapFallback);
  const targets = unique(evict);
  if (targets.length > 0) {
    emit(ctx, 'evict', said, CITE.hotSwapFallback, { nodes: targets });
    noteEvictions(
      ctx,
      incident,
      targets.filter((node) => !incident.evictedNodes.includes(node)),
    );
  }
  enterRung(ctx, 'evict', 'stopped');
  launch(ctx, [step(ctx, 'restart', `relaunch after the failed ${name}`, CITE.hotSwapFallback)]);
}
