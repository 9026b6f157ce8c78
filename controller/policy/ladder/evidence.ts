import type { FaultEvent } from '../../../core/ladder.js';
import { CITE } from './config.js';
import { appendTime, emit, hours, timesOf, unique, type Ctx } from './context.js';
import type { Incident, LadderState } from './state.js';

/**
 * Did the last eviction help? ByteRobust §4.2 step ⑦ rolls the code back when "training crashed
 * again after eviction". A crash soon after an eviction is not by itself that: at the scale of a
 * large job unrelated failures arrive every few hours (§6.1), and in the ETTR simulation about
 * 3 % of crashes fell inside a 30-minute window by chance and were sent on to rollback and
 * replay. The ladder therefore keeps what an eviction acted on — the failure signatures of the
 * incident that evicted, and the standbys that took the evicted nodes' places — and rolls back
 * only when a crash in the window repeats one of those signatures or happens on a replacement.
 */

/** Most signatures an incident keeps; a bound on state size, not a policy. */
const MAX_SIGNATURES = 16;
/** Most replacements the state keeps; a bound on state size, not a policy. */
const MAX_REPLACEMENTS = 64;
const MAX_SIGNATURE_LENGTH = 160;

/**
 * A fault's failure signature: its class and what kind of failure it is, without where. The
 * controller's classifier gives the kind (exception type, Xid, NCCL error kind, alert name);
 * otherwise it is the detail with the named nodes and long numbers (addresses, PCI ids, pids,
 * times) taken out, so the same failure reported from two nodes has one signature.
 */
export function failureSignature(event: FaultEvent): string {
  const kind = event.signature?.trim() || normaliseDetail(event.detail, event.nodes ?? []);
  return `${event.faultClass}:${kind}`.slice(0, MAX_SIGNATURE_LENGTH);
}

export function normaliseDetail(detail: string, nodes: readonly string[]): string {
  let text = detail.toLowerCase();
  // Longest first, so a node whose name contains another's is removed whole.
  for (const node of [...nodes].sort((a, b) => b.length - a.length)) if (node !== '') text = text.split(node.toLowerCase()).join(' ');
  return text
    .replace(/0x[0-9a-f]+/g, '#')
    .replace(/\d{4,}/g, '#')
    .replace(/\s+/g, ' ')
    .trim();
}

/** Folds a fault's signature into the incident, each once. */
export function addSignature(incident: Incident, signature: string | undefined): void {
  if (signature === undefined || incident.signatures.includes(signature)) return;
  incident.signatures = [...incident.signatures, signature].slice(-MAX_SIGNATURES);
}

/** Keeps what an eviction acted on, for the crash-after-eviction rule. */
export function recordEviction(ctx: Ctx, incident: Incident): void {
  ctx.s.lastEvictionAt = ctx.time;
  ctx.s.lastEviction = { at: ctx.time, nodes: [...incident.evictedNodes], signatures: [...incident.signatures] };
}

/** ByteRobust §6.2: a standby took an evicted node's place; remembered for the crash window. */
export function onStandbyActivated(ctx: Ctx, replaced: string, by: string): void {
  const { s, time } = ctx;
  if (s.replacements.some((entry) => entry.node === by && entry.replaced === replaced)) return;
  s.replacements = [...s.replacements, { node: by, replaced, at: time }].slice(-MAX_REPLACEMENTS);
}

/** Drops replacements older than the crash window: after it, a crash is a new incident anyway. */
export function pruneReplacements(ctx: Ctx): void {
  const { s, time, config } = ctx;
  s.replacements = s.replacements.filter((entry) => entry.at >= time - config.crashAfterEvictionWindowMs);
}

/**
 * Why a crash within the window after an eviction says the eviction did not help, or null when
 * nothing says so (a new incident). A state stored before the evidence was kept has no record
 * of what the eviction was for: it keeps the old rule and rolls back.
 */
export function evictionDidNotHelp(s: LadderState, signature: string | undefined, nodes: readonly string[]): string | null {
  const last = s.lastEviction;
  if (last === null) return 'no record of what the eviction was for';
  if (signature !== undefined && last.signatures.includes(signature))
    return `the same failure (${signature}) as the incident that evicted ${last.nodes.join(', ')}`;
  const replacement = s.replacements.find((entry) => nodes.includes(entry.node));
  if (replacement !== undefined) return `on ${replacement.node}, the standby that replaced ${replacement.replaced}`;
  return null;
}

/**
 * The bookkeeping of nodes taken out of the job (by an eviction or a hot swap): their exclusion
 * history, quarantine for a node excluded too often (504-GPU report), the incident's evicted
 * nodes and the evidence of what the eviction acted on.
 */
export function noteEvictions(ctx: Ctx, incident: Incident, targets: string[]): void {
  const { s, time, config } = ctx;
  for (const node of targets) {
    s.exclusions = appendTime(s.exclusions, node, time);
    const count = timesOf(s.exclusions, node).filter((at) => Math.abs(time - at) <= config.exclusionWindowMs).length;
    if (count >= config.quarantineAfterEvictions && !s.quarantined.includes(node)) {
      s.quarantined.push(node);
      emit(ctx, 'quarantine', `${node} evicted ${count} times within ${hours(config.exclusionWindowMs)}`, CITE.exclusion, { nodes: [node] });
    }
  }
  incident.evictedNodes = unique([...incident.evictedNodes, ...targets]);
  recordEviction(ctx, incident);
}
