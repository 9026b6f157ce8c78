import { z } from 'zod';
import type { Signal } from '../core/signal.js';
import { FAULT_CLASSES, type FaultClass, type FaultVerdict } from './fault-class.js';

/**
 * The recovery ladder of one training job: a pure state machine. Given the job's recovery state
 * and one event (a classified fault, the outcome of a restart, a test result, a code update, or
 * time passing) it returns the next state and the steps the actuators should carry out. No I/O
 * and no clock: every event carries its own time, in Unix epoch milliseconds. The controller keeps
 * the state per job (a plain JSON object, `ladderStateSchema` validates it when read back).
 *
 * The rungs are ByteRobust's (000, §4.1 real-time checks, §4.2 hierarchical stop-time checks):
 * evict on a high-confidence machine signal, otherwise stop and diagnose; reattempt in place when
 * diagnosis finds nothing; roll the code back when a restart fails; dual-phase replay when the
 * rollback fails; a human after that (DeadPool's "external fallback", 003 Table II). Code updates
 * are hot updates (§6.1), restarts form a bounded retry chain and evicted nodes an exclusion
 * history (504-GPU report, 002).
 */

// ---------------------------------------------------------------------------------------------
// Configuration

export interface LadderConfig {
  /** Network alerts on one node, within `networkAlertWindowMs`, that get it evicted. */
  readonly networkAlertsBeforeEviction: number;
  readonly networkAlertWindowMs: number;
  /** A crash this soon after an eviction counts as "the job crashed again after the eviction". */
  readonly crashAfterEvictionWindowMs: number;
  /** Restarts one incident may use before a human is paged. */
  readonly retryLimit: number;
  /** Wait before an incident's second restart; doubles for each further one, up to the cap. */
  readonly retryInitialBackoffMs: number;
  readonly retryMaxBackoffMs: number;
  /** How long a non-urgent code update may wait for a failure to ride on. */
  readonly lazyUpdateWindowMs: number;
  /** Evictions of one node, within `exclusionWindowMs`, that quarantine it. */
  readonly quarantineAfterEvictions: number;
  readonly exclusionWindowMs: number;
  /** How many signal ids the state remembers to ignore a fault reported twice. */
  readonly rememberedSignals: number;
}

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

export const DEFAULT_LADDER_CONFIG: LadderConfig = {
  // ByteRobust §4.1: network alerts are tolerated "twice within 5 minutes empirically" before
  // eviction, since NIC and switch flaps often heal by themselves. Evict on the second.
  networkAlertsBeforeEviction: 2,
  networkAlertWindowMs: 5 * MINUTE,
  // ByteRobust §4.2 step ⑦ gives no window. 30 min is our choice: a standby-backed restart is
  // back within minutes, and interruptions come every ~2.78 h at scale (§6.1, citing Llama 3.1).
  crashAfterEvictionWindowMs: 30 * MINUTE,
  // 504-GPU report: 73 auto-retry attempts over 12 chains, about 6 per chain, with a 33.3 %
  // success rate against 12.5 % for manual restarts. Six restarts cover the full ladder
  // (evict, reattempt, rollback, evict after replay) with room for a second eviction.
  retryLimit: 6,
  // Our choice: the first restart is immediate; later ones wait 30 s, 60 s, ... up to 10 min
  // so a failure that repeats at once (storage down, a bad image) does not spin the chain.
  retryInitialBackoffMs: 30_000,
  retryMaxBackoffMs: 10 * MINUTE,
  // ByteRobust §6.1: a non-applied non-critical update is performed when its 24 h window expires.
  lazyUpdateWindowMs: 24 * HOUR,
  // 504-GPU report: the top three nodes caused over half of all exclusions; a node excluded
  // three times in a week is a maintenance case, not a pool member.
  quarantineAfterEvictions: 3,
  exclusionWindowMs: 7 * DAY,
  rememberedSignals: 256,
};

// ---------------------------------------------------------------------------------------------
// State

export const LADDER_PHASES = ['running', 'stopped', 'diagnosing', 'reattempting', 'rolling_back', 'replaying', 'waiting_for_human'] as const;
/**
 * - running: training progresses, no incident is open.
 * - stopped: the job was halted and relaunched (after an eviction or a code update); waiting to
 *   hear whether it trains.
 * - diagnosing: stop-time diagnostics run; waiting for their result.
 * - reattempting: relaunched in place on the same nodes; waiting for the outcome.
 * - rolling_back: relaunched on the last good code version; waiting for the outcome.
 * - replaying: dual-phase replay runs; waiting for its result.
 * - waiting_for_human: automation gave up; only a successful restart closes the incident.
 */
export type LadderPhase = (typeof LADDER_PHASES)[number];

export const LADDER_RUNGS = ['evict', 'diagnose', 'reattempt', 'rollback', 'replay', 'update', 'human'] as const;
export type LadderRung = (typeof LADDER_RUNGS)[number];

export const STEP_VERBS = [
  /** Halt every process of the job (ByteRobust §4.1: "stops all processes immediately"). */
  'stop',
  /** Drain the nodes and activate warm standbys in their place (§6.2). */
  'evict',
  /** Relaunch the job on its current node set. */
  'restart',
  /** Relaunch in place on the same nodes, nothing changed (§4.2 Reattempt). */
  'reattempt',
  /** Hot-update the job's code back to `version` (§4.2 Rollback, §6.1). */
  'rollback',
  /** Hot-update the job's code to `version` (§6.1). */
  'apply_update',
  /** Stop-time diagnostics (EUD, NCCL tests, bit-wise alignment), `nodes` as a hint (§4.2, §4.3). */
  'run_diagnostics',
  /** Dual-phase replay (§4.2, Algorithm 1). */
  'run_replay',
  /** Stack aggregation over the running job, `nodes` as a hint (§5.1). */
  'analyze_stacks',
  /** Keep the nodes out of every pool until an operator returns them (504-GPU report). */
  'quarantine',
  /** Hand the incident to a person. */
  'page_human',
  /** Tell the code owners something that needs no one woken up (§4.2: examine a rolled-back version). */
  'notify',
  /** Record only: the event was seen and deliberately not acted on. */
  'tolerate',
] as const;
export type StepVerb = (typeof STEP_VERBS)[number];

export interface LadderStep {
  verb: StepVerb;
  job: string;
  nodes?: string[];
  version?: string;
  reason: string;
  /** The paper section the step follows. */
  citation: string;
}

export const VERSION_VERDICTS = ['unproven', 'good', 'bad'] as const;
export type VersionVerdict = (typeof VERSION_VERDICTS)[number];

/** One code version of the job; every version ever requested stays listed (ByteRobust §6.1). */
export interface CodeVersion {
  version: string;
  requestedAt: number;
  urgent: boolean;
  /** When it was last put into the job (hot update or rollback); null if never. */
  appliedAt: number | null;
  /** good: training progressed on it; bad: a rollback moved away from it. */
  verdict: VersionVerdict;
  verdictAt: number | null;
}

export interface PendingUpdate {
  version: string;
  urgent: boolean;
  requestedAt: number;
  /** Applied on the first tick at or past this time while the job runs (now, for urgent ones). */
  deadline: number;
}

export interface RetryChain {
  /** Restarts this incident has used. */
  attempts: number;
  /** Wait before the next restart. */
  nextBackoffMs: number;
}

export interface Incident {
  openedAt: number;
  trigger: FaultClass | 'code_update';
  /** Signals folded into this incident, oldest first (at most 32). */
  signalIds: string[];
  rung: LadderRung;
  /** How often each rung ran in this incident. */
  tried: Record<LadderRung, number>;
  evictedNodes: string[];
  /** The version a rollback in this incident moved away from. */
  rolledBackFrom: string | null;
  retry: RetryChain;
}

/** Restart steps held back by the retry chain's backoff until a tick at or after `notBefore`. */
export interface ScheduledRestart {
  notBefore: number;
  steps: LadderStep[];
}

/** Times of events per node, oldest first. An array, not a map: node names are not trusted keys. */
export interface NodeTimes {
  node: string;
  times: number[];
}

export interface LadderState {
  schema: 1;
  job: string;
  phase: LadderPhase;
  incident: Incident | null;
  scheduled: ScheduledRestart | null;
  lastEvictionAt: number | null;
  networkAlerts: NodeTimes[];
  codeVersions: CodeVersion[];
  runningVersion: string | null;
  pendingUpdate: PendingUpdate | null;
  /** Evictions per node within the exclusion window. */
  exclusions: NodeTimes[];
  /** Nodes excluded too often; never handed back automatically. */
  quarantined: string[];
  /** Signal ids already handled, newest last. */
  recentSignals: string[];
}

// ---------------------------------------------------------------------------------------------
// Events

export interface FaultEvent {
  type: 'fault';
  time: number;
  signalId: string;
  faultClass: FaultClass;
  /**
   * The nodes the fault names: the culprits for `machine` and `network` (several when an analyzer
   * over-evicts a parallel group, ByteRobust §5.1), a hint for every other class.
   */
  nodes?: string[];
  detail: string;
}

export type LadderEvent =
  | FaultEvent
  /** Training progressed after a restart (any restart, a person's included). */
  | { type: 'restart_succeeded'; time: number }
  | { type: 'restart_failed'; time: number; detail?: string }
  | { type: 'diagnostics_result'; time: number; suspects: string[] }
  | { type: 'replay_result'; time: number; culprits: string[] }
  | { type: 'code_update'; time: number; version: string; urgent: boolean }
  /** Time passes: fires held-back restarts and due updates. The controller ticks every few seconds. */
  | { type: 'tick'; time: number };

export interface LadderTransition {
  state: LadderState;
  steps: LadderStep[];
}

// ---------------------------------------------------------------------------------------------
// Citations, once

const CITE = {
  machine: 'ByteRobust §4.1 (high-confidence machine events: stop, evict, skip stop-time checks); DeadPool Table II (node replacement)',
  network: 'ByteRobust §4.1 (network alerts tolerated, e.g. twice within 5 minutes, before eviction)',
  userCode: 'ByteRobust §4.1 step ② (user-space errors traceable to code trigger a rollback)',
  diagnose: 'ByteRobust §4.1 step ③ and §4.2 Diagnose (crash or abnormal metrics without a clear culprit)',
  diagnosedEvict: 'ByteRobust §4.2 step ④ (suspects found by diagnosis are evicted)',
  reattempt: 'ByteRobust §4.2 step ⑤ (all tests pass: assume a transient fault, restart in place)',
  rollbackAfterReattempt: 'ByteRobust §4.2 step ⑥ (restarting did not resolve it: roll the code back)',
  rollbackAfterEviction: 'ByteRobust §4.2 step ⑦ (training crashed again after eviction: roll the code back)',
  rollbackAfterUpdate: 'ByteRobust §6.1 and §8.1.2 (hot updates are applied and rolled back automatically)',
  diagnoseAfterEviction: 'ByteRobust §4.1 (restarted training fails again after eviction: enter the stop-time checks)',
  replay: 'ByteRobust §4.2 step ⑧ (restarts fail: dual-phase replay, Algorithm 1)',
  replayEvict: 'ByteRobust §4.2 step ⑨ (the machine replay isolates is evicted)',
  rollbackOwners: 'ByteRobust §4.2 Rollback (relevant teams examine their code while training progresses)',
  human: 'DeadPool Table II and §V-C (software bugs and unknown failures go to an external fallback)',
  stacks: 'ByteRobust §4.1 and §5.1 (performance anomalies trigger aggregation analysis)',
  transient: 'DeadPool Table II and §VI-B (transient faults: local recovery first, no topology change)',
  standby: 'ByteRobust §6.2 (warm standbys replace evicted machines)',
  hotUpdate: 'ByteRobust §6.1 (urgent updates now; others at the next failure or when 24 h expire)',
  retry: '504-GPU report (auto-retry chains)',
  exclusion: '504-GPU report (node exclusion history; the top three nodes caused over half of all exclusions)',
} as const;

// ---------------------------------------------------------------------------------------------
// Entry points

export function initialLadderState(job: string, options: { readonly time: number; readonly version?: string }): LadderState {
  const versions: CodeVersion[] =
    options.version === undefined
      ? []
      : [{ version: options.version, requestedAt: options.time, urgent: false, appliedAt: options.time, verdict: 'unproven', verdictAt: null }];
  return {
    schema: 1,
    job,
    phase: 'running',
    incident: null,
    scheduled: null,
    lastEvictionAt: null,
    networkAlerts: [],
    codeVersions: versions,
    runningVersion: options.version ?? null,
    pendingUpdate: null,
    exclusions: [],
    quarantined: [],
    recentSignals: [],
  };
}

/** The ladder event for a classified signal. */
export function faultEventFromSignal(signal: Signal, verdict: FaultVerdict): FaultEvent {
  return {
    type: 'fault',
    time: Date.parse(signal.time),
    signalId: signal.id,
    faultClass: verdict.faultClass,
    nodes: verdict.node === undefined ? [] : [verdict.node],
    detail: verdict.reason,
  };
}

/** One transition. Never mutates `state`; never throws on a well-typed event. */
export function advance(state: LadderState, event: LadderEvent, config: LadderConfig = DEFAULT_LADDER_CONFIG): LadderTransition {
  const ctx: Ctx = { s: structuredClone(state), time: event.time, config, steps: [] };
  prune(ctx);
  switch (event.type) {
    case 'fault':
      onFault(ctx, event);
      break;
    case 'restart_succeeded':
      onRestartSucceeded(ctx);
      break;
    case 'restart_failed':
      onRestartFailed(ctx, event.detail ?? 'the relaunched job failed');
      break;
    case 'diagnostics_result':
      onDiagnosticsResult(ctx, unique(event.suspects));
      break;
    case 'replay_result':
      onReplayResult(ctx, unique(event.culprits));
      break;
    case 'code_update':
      onCodeUpdate(ctx, event.version, event.urgent);
      break;
    case 'tick':
      onTick(ctx);
      break;
  }
  return { state: ctx.s, steps: ctx.steps };
}

// ---------------------------------------------------------------------------------------------
// Transitions

interface Ctx {
  readonly s: LadderState;
  readonly time: number;
  readonly config: LadderConfig;
  readonly steps: LadderStep[];
}

function onFault(ctx: Ctx, event: FaultEvent): void {
  const { s } = ctx;
  // The same signal delivered twice is one fault (STYLE.md, Actuators: recognise work already done).
  if (s.recentSignals.includes(event.signalId)) return;
  s.recentSignals = [...s.recentSignals, event.signalId].slice(-Math.max(1, ctx.config.rememberedSignals));
  if (s.incident) s.incident.signalIds = [...s.incident.signalIds, event.signalId].slice(-32);
  const nodes = unique(event.nodes ?? []);
  const what = `${event.faultClass} fault: ${event.detail}`;

  if (s.phase === 'waiting_for_human') {
    // A person owns the job now; automation only keeps the record.
    emit(ctx, 'tolerate', `${what}; recorded only while a human handles the incident`, CITE.human, { nodes });
    return;
  }
  switch (event.faultClass) {
    case 'machine':
      if (nodes.length > 0) evictAndRestart(ctx, nodes, 'machine', what, CITE.machine);
      else onCrash(ctx, `${what} (no node named, so no culprit)`, nodes);
      return;
    case 'network':
      if (nodes.length > 0) onNetworkFault(ctx, nodes, what);
      else onCrash(ctx, `${what} (no node named, so no culprit)`, nodes);
      return;
    case 'user_code':
      onUserCode(ctx, what);
      return;
    case 'crash':
    case 'numerical':
      onCrash(ctx, what, nodes, event.faultClass);
      return;
    case 'performance':
      if (s.phase === 'running') {
        // ByteRobust §4.1 → §5.1: the job keeps running while stacks are aggregated; the
        // analyzer's verdict comes back as a machine fault naming the nodes to over-evict.
        emit(ctx, 'analyze_stacks', what, CITE.stacks, { nodes });
      } else {
        emit(ctx, 'tolerate', `${what}; the job is not training normally (${s.phase}), so its speed says nothing`, CITE.stacks, { nodes });
      }
      return;
    case 'transient':
      // DeadPool §VI-B: transient faults leave the node and its state valid.
      emit(ctx, 'tolerate', what, CITE.transient, { nodes });
      return;
  }
}

/** ByteRobust §4.1: tolerate a network alert; evict on the Nth within the window on the same node. */
function onNetworkFault(ctx: Ctx, nodes: string[], what: string): void {
  const { s, config, time } = ctx;
  const due: string[] = [];
  for (const node of nodes) {
    s.networkAlerts = appendTime(s.networkAlerts, node, time);
    const recent = timesOf(s.networkAlerts, node).filter((at) => Math.abs(time - at) <= config.networkAlertWindowMs);
    if (recent.length >= config.networkAlertsBeforeEviction) due.push(node);
  }
  if (due.length === 0) {
    const below = `fewer than ${config.networkAlertsBeforeEviction} network alerts on a node within ${minutes(config.networkAlertWindowMs)}`;
    emit(ctx, 'tolerate', `${what}; ${below}, and flaps often heal`, CITE.network, { nodes });
    return;
  }
  s.networkAlerts = s.networkAlerts.filter((entry) => !due.includes(entry.node));
  const count = config.networkAlertsBeforeEviction;
  evictAndRestart(ctx, due, 'network', `${what}; ${count} network alerts within ${minutes(config.networkAlertWindowMs)}`, CITE.network);
}

/** ByteRobust §4.1 step ②: a user-code error rolls back to the last good version at once. */
function onUserCode(ctx: Ctx, what: string): void {
  const { s } = ctx;
  leaveRunning(ctx, 'user_code', what);
  const target = rollbackTarget(s);
  if (target === null) {
    // Nothing older is known to work: replaying or diagnosing hardware cannot fix code.
    pageHuman(ctx, `${what}; no earlier good code version to roll back to`, CITE.human);
    return;
  }
  rollback(ctx, target, what, CITE.userCode);
}

/** A crash or numerical fault without a culprit (ByteRobust §4.1 step ③, §4.2, §4.3). */
function onCrash(ctx: Ctx, what: string, hintNodes: string[], trigger: FaultClass = 'crash'): void {
  const { s, time, config } = ctx;
  switch (s.phase) {
    case 'running': {
      const sinceEviction = s.lastEvictionAt === null ? Infinity : time - s.lastEvictionAt;
      leaveRunning(ctx, trigger, what);
      if (sinceEviction >= 0 && sinceEviction <= config.crashAfterEvictionWindowMs) {
        escalate(ctx, `${what}; ${minutes(sinceEviction)} after the last eviction`, 'evict');
      } else {
        diagnose(ctx, what, hintNodes);
      }
      return;
    }
    case 'stopped':
    case 'reattempting':
    case 'rolling_back':
      // The relaunched job fell over: the same as a failed restart.
      onRestartFailed(ctx, what);
      return;
    case 'diagnosing':
    case 'replaying':
      emit(ctx, 'tolerate', `${what}; the job is already stopped for ${s.phase === 'diagnosing' ? 'diagnostics' : 'replay'}`, CITE.diagnose, { nodes: hintNodes });
      return;
    case 'waiting_for_human':
      emit(ctx, 'tolerate', `${what}; recorded only while a human handles the incident`, CITE.human, { nodes: hintNodes });
      return;
  }
}

function onRestartFailed(ctx: Ctx, why: string): void {
  const { s } = ctx;
  const awaitingOutcome = s.phase === 'stopped' || s.phase === 'reattempting' || s.phase === 'rolling_back';
  if (!awaitingOutcome || s.scheduled !== null || s.incident === null) {
    const wait = s.scheduled !== null ? 'the next restart is not issued yet' : `no restart is pending (${s.phase})`;
    emit(ctx, 'tolerate', `restart failure reported but ${wait}: ${why}`, CITE.retry);
    return;
  }
  const failed: FailedRung = s.phase === 'reattempting' ? 'reattempt' : s.phase === 'rolling_back' ? 'rollback' : s.incident.rung === 'update' ? 'update' : 'evict';
  escalate(ctx, why, failed);
}

function onDiagnosticsResult(ctx: Ctx, suspects: string[]): void {
  if (ctx.s.phase !== 'diagnosing') {
    emit(ctx, 'tolerate', `diagnostics result ignored: no diagnostics are running (${ctx.s.phase})`, CITE.diagnose, { nodes: suspects });
    return;
  }
  if (stillInJob(ctx.s, suspects).length > 0) {
    evictAndRestart(ctx, suspects, 'crash', `diagnostics found ${suspects.join(', ')}`, CITE.diagnosedEvict);
    return;
  }
  reattempt(ctx, suspects.length === 0 ? 'diagnostics found nothing' : `diagnostics named only nodes already out (${suspects.join(', ')})`);
}

function onReplayResult(ctx: Ctx, culprits: string[]): void {
  if (ctx.s.phase !== 'replaying') {
    emit(ctx, 'tolerate', `replay result ignored: no replay is running (${ctx.s.phase})`, CITE.replay, { nodes: culprits });
    return;
  }
  if (stillInJob(ctx.s, culprits).length > 0) {
    evictAndRestart(ctx, culprits, 'crash', `dual-phase replay isolated ${culprits.join(', ')}`, CITE.replayEvict);
    return;
  }
  pageHuman(ctx, culprits.length === 0 ? 'dual-phase replay isolated no machine' : `dual-phase replay named only nodes already out (${culprits.join(', ')})`, CITE.human);
}

/** Training progressed: the incident is over and the code it runs is good (ByteRobust §4.2). */
function onRestartSucceeded(ctx: Ctx): void {
  const { s, time } = ctx;
  const running = s.runningVersion;
  if (running !== null) setVerdict(s, running, 'good', time);
  const from = s.incident?.rolledBackFrom ?? null;
  if (from !== null && running !== null) {
    emit(ctx, 'notify', `training progresses on ${running} after rolling back from ${from}; ${from} stays marked bad until its owners examine it`, CITE.rollbackOwners, {
      version: from,
    });
  }
  s.incident = null;
  s.scheduled = null;
  s.phase = 'running';
}

/** ByteRobust §6.1: urgent updates are applied now, others ride the next restart or wait 24 h. */
function onCodeUpdate(ctx: Ctx, version: string, urgent: boolean): void {
  const { s, time, config } = ctx;
  if (version === s.runningVersion && s.pendingUpdate === null) {
    emit(ctx, 'tolerate', `code version ${version} is already running`, CITE.hotUpdate, { version });
    return;
  }
  const known = s.codeVersions.find((entry) => entry.version === version);
  if (known) {
    known.requestedAt = time;
    known.urgent = urgent;
  } else {
    s.codeVersions.push({ version, requestedAt: time, urgent, appliedAt: null, verdict: 'unproven', verdictAt: null });
  }
  const previous = s.pendingUpdate;
  // A newer request supersedes a pending one but inherits its clock: the code is cumulative.
  const ownDeadline = urgent ? time : time + config.lazyUpdateWindowMs;
  const deadline = previous === null ? ownDeadline : Math.min(previous.deadline, ownDeadline);
  s.pendingUpdate = { version, urgent: urgent || (previous?.urgent ?? false), requestedAt: time, deadline };
  if (s.phase === 'running' && deadline <= time) {
    applyUpdateNow(ctx, `urgent code update to ${version}`);
    return;
  }
  const when = s.phase === 'running' ? `the next restart or ${new Date(deadline).toISOString()}` : 'the next restart of this incident';
  emit(ctx, 'tolerate', `code version ${version} held for ${when}`, CITE.hotUpdate, { version });
}

function onTick(ctx: Ctx): void {
  const { s, time } = ctx;
  if (s.scheduled !== null && time >= s.scheduled.notBefore) {
    const held = s.scheduled.steps;
    s.scheduled = null;
    emitRestart(ctx, held);
  }
  if (s.phase === 'running' && s.pendingUpdate !== null && time >= s.pendingUpdate.deadline) {
    const pending = s.pendingUpdate;
    applyUpdateNow(ctx, pending.urgent ? `urgent code update to ${pending.version}` : `code update to ${pending.version}: its ${hours(ctx.config.lazyUpdateWindowMs)} window expired`);
  }
}

// ---------------------------------------------------------------------------------------------
// Rungs

/** The nodes that are still in the job: not quarantined, not evicted earlier in this incident. */
function stillInJob(s: LadderState, nodes: string[]): string[] {
  const evictedBefore = s.incident?.evictedNodes ?? [];
  return nodes.filter((node) => !s.quarantined.includes(node) && !evictedBefore.includes(node));
}

/** Evicts the nodes still in the job and relaunches on standbys; only records when none is left. */
function evictAndRestart(ctx: Ctx, nodes: string[], trigger: FaultClass, why: string, citation: string): void {
  const { s, time, config } = ctx;
  const targets = stillInJob(s, nodes);
  if (targets.length === 0) {
    emit(ctx, 'tolerate', `${why}; ${nodes.join(', ')} already out of the job`, citation, { nodes });
    return;
  }
  const incident = leaveRunning(ctx, trigger, why);
  emit(ctx, 'evict', why, citation, { nodes: targets });
  for (const node of targets) {
    s.exclusions = appendTime(s.exclusions, node, time);
    const count = timesOf(s.exclusions, node).filter((at) => Math.abs(time - at) <= config.exclusionWindowMs).length;
    if (count >= config.quarantineAfterEvictions && !s.quarantined.includes(node)) {
      s.quarantined.push(node);
      emit(ctx, 'quarantine', `${node} evicted ${count} times within ${hours(config.exclusionWindowMs)}`, CITE.exclusion, { nodes: [node] });
    }
  }
  s.lastEvictionAt = time;
  incident.evictedNodes = unique([...incident.evictedNodes, ...targets]);
  enterRung(ctx, 'evict', 'stopped');
  launch(ctx, [step(ctx, 'restart', `relaunch on warm standbys replacing ${targets.join(', ')}`, CITE.standby)]);
}

function diagnose(ctx: Ctx, why: string, hintNodes: string[], citation: string = CITE.diagnose): void {
  enterRung(ctx, 'diagnose', 'diagnosing');
  emit(ctx, 'run_diagnostics', why, citation, { nodes: hintNodes });
}

function reattempt(ctx: Ctx, why: string): void {
  if (chainExhausted(ctx)) return;
  enterRung(ctx, 'reattempt', 'reattempting');
  launch(ctx, [step(ctx, 'reattempt', `${why}; assume a transient fault and restart in place`, CITE.reattempt)]);
}

/** The versions change when the rollback step is emitted (see emitRestart), not when it is held. */
function rollback(ctx: Ctx, target: string, why: string, citation: string): void {
  if (chainExhausted(ctx)) return;
  enterRung(ctx, 'rollback', 'rolling_back');
  const from = ctx.s.runningVersion;
  launch(ctx, [
    step(ctx, 'rollback', `${why}; roll back${from === null ? '' : ` from ${from}`} to the last good version ${target}`, citation, { version: target }),
    step(ctx, 'restart', `relaunch on ${target}`, citation),
  ]);
}

function replay(ctx: Ctx, why: string, citation: string): void {
  enterRung(ctx, 'replay', 'replaying');
  emit(ctx, 'run_replay', `${why}; assume an unknown fault (e.g. silent data corruption) and localise it by replay`, citation);
}

type FailedRung = 'evict' | 'update' | 'reattempt' | 'rollback';

/**
 * The next untried rung after a relaunch failed (ByteRobust §4.2):
 * - after an eviction or a code update: roll back (step ⑦); with no good version to go back to,
 *   the stop-time checks (§4.1: "enter the stop-time check procedure"); then replay;
 * - after a reattempt: roll back (step ⑥), else replay;
 * - after a rollback: dual-phase replay (step ⑧);
 * and a human once those are spent in this incident.
 */
function escalate(ctx: Ctx, why: string, failed: FailedRung): void {
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

function pageHuman(ctx: Ctx, why: string, citation: string): void {
  enterRung(ctx, 'human', 'waiting_for_human');
  ctx.s.scheduled = null;
  emit(ctx, 'page_human', why, citation);
}

function applyUpdateNow(ctx: Ctx, why: string): void {
  leaveRunning(ctx, 'code_update', why);
  enterRung(ctx, 'update', 'stopped');
  // The apply_update step goes in front of the restart when it is emitted (emitRestart).
  launch(ctx, [step(ctx, 'restart', `${why}; halt, hot-update in place, relaunch`, CITE.hotUpdate)]);
}

// ---------------------------------------------------------------------------------------------
// Retry chain and restarts

/** Pages a human when the incident's retry chain is spent; true if it did. */
function chainExhausted(ctx: Ctx): boolean {
  const retry = ctx.s.incident?.retry;
  if (retry === undefined || retry.attempts < ctx.config.retryLimit) return false;
  pageHuman(ctx, `retry chain spent: ${retry.attempts} restarts in this incident`, CITE.retry);
  return true;
}

/**
 * Uses one restart of the retry chain (504-GPU report): the first goes out now, later ones are
 * held until a tick past the backoff. A spent chain pages a human instead.
 */
function launch(ctx: Ctx, requested: LadderStep[]): void {
  const incident = ctx.s.incident;
  if (incident === null || chainExhausted(ctx)) return;
  const { config } = ctx;
  // A new relaunch replaces one still held back, but a held rollback must not get lost with it.
  const heldRollback = requested.some((candidate) => candidate.verb === 'rollback') ? [] : (ctx.s.scheduled?.steps ?? []).filter((candidate) => candidate.verb === 'rollback');
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
function emitRestart(ctx: Ctx, restartSteps: LadderStep[]): void {
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

// ---------------------------------------------------------------------------------------------
// Helpers

const STOP_CITATION: Readonly<Record<Incident['trigger'], string>> = {
  machine: CITE.machine,
  network: CITE.network,
  user_code: CITE.userCode,
  crash: CITE.diagnose,
  numerical: CITE.diagnose,
  performance: CITE.stacks,
  transient: CITE.transient,
  code_update: CITE.hotUpdate,
};

/** Opens an incident (and stops the job) when it was running; returns the open incident. */
function leaveRunning(ctx: Ctx, trigger: Incident['trigger'], why: string): Incident {
  const { s, time } = ctx;
  if (s.incident !== null) return s.incident;
  const recent = s.recentSignals.at(-1);
  s.incident = {
    openedAt: time,
    trigger,
    signalIds: trigger === 'code_update' || recent === undefined ? [] : [recent],
    rung: 'evict',
    tried: emptyTried(),
    evictedNodes: [],
    rolledBackFrom: null,
    retry: { attempts: 0, nextBackoffMs: 0 },
  };
  if (s.phase === 'running') emit(ctx, 'stop', why, STOP_CITATION[trigger]);
  return s.incident;
}

function enterRung(ctx: Ctx, rung: LadderRung, phase: LadderPhase): Incident {
  const incident = leaveRunning(ctx, 'crash', `entering ${rung}`);
  incident.rung = rung;
  incident.tried[rung] += 1;
  ctx.s.phase = phase;
  return incident;
}

function emptyTried(): Record<LadderRung, number> {
  return { evict: 0, diagnose: 0, reattempt: 0, rollback: 0, replay: 0, update: 0, human: 0 };
}

/** The newest good version that is not the one running. */
function rollbackTarget(s: LadderState): string | null {
  for (let i = s.codeVersions.length - 1; i >= 0; i -= 1) {
    const entry = s.codeVersions[i];
    if (entry !== undefined && entry.verdict === 'good' && entry.version !== s.runningVersion) return entry.version;
  }
  return null;
}

function setVerdict(s: LadderState, version: string, verdict: VersionVerdict, time: number): void {
  const entry = s.codeVersions.find((candidate) => candidate.version === version);
  if (entry === undefined || entry.verdict === verdict) return;
  entry.verdict = verdict;
  entry.verdictAt = time;
}

function step(ctx: Ctx, verb: StepVerb, reason: string, citation: string, extra: { nodes?: string[]; version?: string } = {}): LadderStep {
  const out: LadderStep = { verb, job: ctx.s.job, reason, citation };
  if (extra.nodes !== undefined && extra.nodes.length > 0) out.nodes = [...extra.nodes];
  if (extra.version !== undefined) out.version = extra.version;
  return out;
}

function emit(ctx: Ctx, verb: StepVerb, reason: string, citation: string, extra: { nodes?: string[]; version?: string } = {}): void {
  ctx.steps.push(step(ctx, verb, reason, citation, extra));
}

function appendTime(entries: NodeTimes[], node: string, time: number): NodeTimes[] {
  const found = entries.find((entry) => entry.node === node);
  if (found === undefined) return [...entries, { node, times: [time] }];
  return entries.map((entry) => (entry === found ? { node, times: [...entry.times, time] } : entry));
}

function timesOf(entries: NodeTimes[], node: string): number[] {
  return entries.find((entry) => entry.node === node)?.times ?? [];
}

/** Drops network alerts and exclusions older than their windows, so the state stays small. */
function prune(ctx: Ctx): void {
  const { s, time, config } = ctx;
  const keep = (entries: NodeTimes[], windowMs: number): NodeTimes[] =>
    entries
      .map((entry) => ({ node: entry.node, times: entry.times.filter((at) => at >= time - windowMs) }))
      .filter((entry) => entry.times.length > 0);
  s.networkAlerts = keep(s.networkAlerts, config.networkAlertWindowMs);
  s.exclusions = keep(s.exclusions, config.exclusionWindowMs);
}

function unique(values: readonly string[]): string[] {
  return [...new Set(values)];
}

function minutes(ms: number): string {
  return `${Math.round(ms / MINUTE)} min`;
}

function hours(ms: number): string {
  return ms % DAY === 0 ? `${ms / DAY} d` : `${Math.round(ms / HOUR)} h`;
}

// ---------------------------------------------------------------------------------------------
// Validation of a stored state (the controller reads it back from Redis)

const time = z.number().finite();
const nodeTimes = z.array(z.object({ node: z.string().min(1), times: z.array(time) }));
export const ladderStepSchema = z.object({
  verb: z.enum(STEP_VERBS),
  job: z.string(),
  nodes: z.array(z.string()).optional(),
  version: z.string().optional(),
  reason: z.string(),
  citation: z.string(),
});
const rungCounts = z.object({
  evict: z.number().int().min(0),
  diagnose: z.number().int().min(0),
  reattempt: z.number().int().min(0),
  rollback: z.number().int().min(0),
  replay: z.number().int().min(0),
  update: z.number().int().min(0),
  human: z.number().int().min(0),
});

export const ladderStateSchema = z.object({
  schema: z.literal(1),
  job: z.string().min(1),
  phase: z.enum(LADDER_PHASES),
  incident: z
    .object({
      openedAt: time,
      trigger: z.enum([...FAULT_CLASSES, 'code_update']),
      signalIds: z.array(z.string()),
      rung: z.enum(LADDER_RUNGS),
      tried: rungCounts,
      evictedNodes: z.array(z.string()),
      rolledBackFrom: z.string().nullable(),
      retry: z.object({ attempts: z.number().int().min(0), nextBackoffMs: z.number().min(0) }),
    })
    .nullable(),
  scheduled: z.object({ notBefore: time, steps: z.array(ladderStepSchema) }).nullable(),
  lastEvictionAt: time.nullable(),
  networkAlerts: nodeTimes,
  codeVersions: z.array(
    z.object({
      version: z.string().min(1),
      requestedAt: time,
      urgent: z.boolean(),
      appliedAt: time.nullable(),
      verdict: z.enum(VERSION_VERDICTS),
      verdictAt: time.nullable(),
    }),
  ),
  runningVersion: z.string().nullable(),
  pendingUpdate: z.object({ version: z.string().min(1), urgent: z.boolean(), requestedAt: time, deadline: time }).nullable(),
  exclusions: nodeTimes,
  quarantined: z.array(z.string()),
  recentSignals: z.array(z.string()),
}) satisfies z.ZodType<LadderState>;
