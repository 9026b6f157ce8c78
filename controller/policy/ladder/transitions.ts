import type { FaultClass, FaultEvent } from '../../../core/ladder.js';
import { CITE } from './config.js';
import {
  RESET_REJOIN_MS,
  appendTime,
  emit,
  hours,
  leaveRunning,
  minutes,
  pageHuman,
  resetKey,
  rollbackTarget,
  setVerdict,
  timesOf,
  unique,
  type Ctx,
} from './context.js';
import { applyUpdateNow, diagnose, escalate, evictAndRestart, reattempt, resetAndRestart, rollback, stillInJob, type FailedRung } from './rungs.js';
import { addSignature, evictionDidNotHelp } from './evidence.js';
import { emitRestart } from './retry-chain.js';
import { canHotSwap, communicationEpoch, onFaultWhileSwapping } from './hot-swap.js';

/**
 * How each kind of event moves a job's ladder: which rung a fault starts on (ByteRobust §4.1),
 * and what a restart's outcome, a diagnosis, a replay, a code update or a clock tick does next.
 */

export function onFault(ctx: Ctx, event: FaultEvent): void {
  const { s } = ctx;
  // The same signal delivered twice is one fault (recognise work already done).
  if (s.recentSignals.includes(event.signalId)) return;
  s.recentSignals = [...s.recentSignals, event.signalId].slice(-Math.max(1, ctx.config.rememberedSignals));
  if (s.incident) {
    s.incident.signalIds = [...s.incident.signalIds, event.signalId].slice(-32);
    addSignature(s.incident, ctx.signature);
  }
  const nodes = unique(event.nodes ?? []);
  const what = `${event.faultClass} fault: ${event.detail}`;

  if (s.phase === 'waiting_for_human') {
    // A person owns the job now; automation only keeps the record.
    emit(ctx, 'tolerate', `${what}; recorded only while a human handles the incident`, CITE.human, { nodes });
    return;
  }
  if (s.phase === 'swapping') {
    onFaultWhileSwapping(ctx, event.faultClass, nodes, what);
    return;
  }
  switch (event.faultClass) {
    case 'machine':
      // On a hot-swap job a spare takes the node's place while the job runs: no GPU reset, which stops it.
      if (nodes.length === 1 && timesOf(s.gpuResets, resetKey(nodes[0] as string, ctx.signature)).length > 0) {
        emit(
          ctx,
          'tolerate',
          `${what}; the same fault on ${nodes[0] as string} was reset in place within ${minutes(RESET_REJOIN_MS)}: this report joins that reset`,
          CITE.gpuReset,
          { nodes },
        );
      } else if (event.resetGpu !== undefined && nodes.length === 1 && !canHotSwap(ctx, stillInJob(s, nodes)))
        resetAndRestart(ctx, nodes[0] as string, event.resetGpu, what);
      else if (nodes.length > 0) evictAndRestart(ctx, nodes, 'machine', what, CITE.machine);
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
export function onNetworkFault(ctx: Ctx, nodes: string[], what: string): void {
  const { s, config, time } = ctx;
  const due: string[] = [];
  for (const node of nodes) {
    s.networkAlerts = appendTime(s.networkAlerts, node, time);
    const recent = timesOf(s.networkAlerts, node).filter((at) => Math.abs(time - at) <= config.networkAlertWindowMs);
    if (recent.length >= config.networkAlertsBeforeEviction) due.push(node);
  }
  if (due.length === 0) {
    // A hot-swap job's ranks meet again in a new epoch with the same shards (DeadPool §VI-B).
    if (communicationEpoch(ctx, what)) return;
    const below = `fewer than ${config.networkAlertsBeforeEviction} network alerts on a node within ${minutes(config.networkAlertWindowMs)}`;
    emit(ctx, 'tolerate', `${what}; ${below}, and flaps often heal`, CITE.network, { nodes });
    return;
  }
  s.networkAlerts = s.networkAlerts.filter((entry) => !due.includes(entry.node));
  const count = config.networkAlertsBeforeEviction;
  evictAndRestart(ctx, due, 'network', `${what}; ${count} network alerts within ${minutes(config.networkAlertWindowMs)}`, CITE.network);
}

/** ByteRobust §4.1 step ②: a user-code error rolls back to the last good version at once. */
export function onUserCode(ctx: Ctx, what: string): void {
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
export function onCrash(ctx: Ctx, what: string, hintNodes: string[], trigger: FaultClass = 'crash'): void {
  const { s, time, config } = ctx;
  switch (s.phase) {
    case 'running': {
      const sinceEviction = s.lastEvictionAt === null ? Infinity : time - s.lastEvictionAt;
      const afterEviction = sinceEviction >= 0 && sinceEviction <= config.crashAfterEvictionWindowMs;
      // ByteRobust §4.2 step ⑦ is "crashed again after eviction": roll back only when the
      // evidence says the eviction did not help (evidence.ts); any other crash is a new incident.
      const notHelped = afterEviction ? evictionDidNotHelp(s, ctx.signature, hintNodes) : null;
      leaveRunning(ctx, trigger, what);
      if (notHelped !== null) {
        escalate(ctx, `${what}; ${minutes(sinceEviction)} after the last eviction, ${notHelped}`, 'evict');
      } else if (afterEviction) {
        const unrelated = `${minutes(sinceEviction)} after the last eviction, but a different failure and not on a standby that replaced an evicted node`;
        diagnose(ctx, `${what}; ${unrelated}`, hintNodes, CITE.unrelatedAfterEviction);
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
      emit(ctx, 'tolerate', `${what}; the job is already stopped for ${s.phase === 'diagnosing' ? 'diagnostics' : 'replay'}`, CITE.diagnose, {
        nodes: hintNodes,
      });
      return;
    case 'waiting_for_human':
      emit(ctx, 'tolerate', `${what}; recorded only while a human handles the incident`, CITE.human, { nodes: hintNodes });
      return;
  }
}

export function onRestartFailed(ctx: Ctx, why: string): void {
  const { s } = ctx;
  const awaitingOutcome = s.phase === 'stopped' || s.phase === 'reattempting' || s.phase === 'rolling_back';
  if (!awaitingOutcome || s.scheduled !== null || s.incident === null) {
    const wait = s.scheduled !== null ? 'the next restart is not issued yet' : `no restart is pending (${s.phase})`;
    emit(ctx, 'tolerate', `restart failure reported but ${wait}: ${why}`, CITE.retry);
    return;
  }
  const failed: FailedRung =
    s.phase === 'reattempting' ? 'reattempt' : s.phase === 'rolling_back' ? 'rollback' : s.incident.rung === 'update' ? 'update' : 'evict';
  escalate(ctx, why, failed);
}

export function onDiagnosticsResult(ctx: Ctx, suspects: string[], unrun?: string): void {
  if (ctx.s.phase !== 'diagnosing') {
    emit(ctx, 'tolerate', `diagnostics result ignored: no diagnostics are running (${ctx.s.phase})`, CITE.diagnose, { nodes: suspects });
    return;
  }
  if (stillInJob(ctx.s, suspects).length > 0) {
    evictAndRestart(ctx, suspects, 'crash', `diagnostics found ${suspects.join(', ')}`, CITE.diagnosedEvict);
    return;
  }
  reattempt(
    ctx,
    unrun !== undefined
      ? `no diagnostics ran: ${unrun}`
      : suspects.length === 0
        ? 'diagnostics found nothing'
        : `diagnostics named only nodes already out (${suspects.join(', ')})`,
  );
}

export function onReplayResult(ctx: Ctx, culprits: string[], unrun?: string): void {
  if (ctx.s.phase !== 'replaying') {
    emit(ctx, 'tolerate', `replay result ignored: no replay is running (${ctx.s.phase})`, CITE.replay, { nodes: culprits });
    return;
  }
  if (stillInJob(ctx.s, culprits).length > 0) {
    evictAndRestart(ctx, culprits, 'crash', `dual-phase replay isolated ${culprits.join(', ')}`, CITE.replayEvict);
    return;
  }
  const why =
    unrun !== undefined
      ? `no dual-phase replay ran: ${unrun}`
      : culprits.length === 0
        ? 'dual-phase replay isolated no machine'
        : `dual-phase replay named only nodes already out (${culprits.join(', ')})`;
  pageHuman(ctx, why, CITE.human);
}

/**
 * The step processor refused what the ladder decided (actions paused, the job's recovery off,
 * the eviction budget spent), so nothing it waits for will come: no restart, no test result. The
 * controller hands this event the ladder as it was before the refused transition when it can
 * (recovery-dispatcher.ts), and the job is then simply running; otherwise the open incident is
 * closed here. Either way the next report of a fault starts the ladder again, from its first rung.
 * A code update whose time had come waits another lazy-update window (or rides the next restart),
 * so that a pause does not have the ladder ask for it again at every tick. A job already handed to
 * a person (the step that stopped paged them: no standby left) stays theirs.
 */
export function onRecoveryRefused(ctx: Ctx, detail: string): void {
  const { s, time, config } = ctx;
  if (s.phase === 'waiting_for_human') {
    // The transition stopped on something a person must see to, and they were paged for it.
    emit(ctx, 'notify', `recovery stopped (${detail}); a person handles the incident`, CITE.human);
    return;
  }
  const closed = s.phase !== 'running' ? ` and the incident opened at ${new Date(s.incident?.openedAt ?? time).toISOString()} closed` : '';
  if (closed !== '') {
    s.phase = 'running';
    s.incident = null;
    s.scheduled = null;
    s.swap = null;
  }
  let update = '';
  if (s.pendingUpdate !== null && time >= s.pendingUpdate.deadline) {
    s.pendingUpdate.deadline = time + config.lazyUpdateWindowMs;
    update = `; the code update to ${s.pendingUpdate.version} waits for the next restart or ${hours(config.lazyUpdateWindowMs)}`;
  }
  emit(ctx, 'notify', `recovery refused (${detail}): nothing was done${closed}; the next report of the fault starts recovery again${update}`, CITE.refused);
}

/**
 * No warm standby was left to take the evicted nodes' places (ByteRobust §6.2 sizes the pool at
 * the P99 of the failures it expects, so this is rare): they left the job, and the job is not
 * relaunched on fewer nodes than its topology places ranks on. A person provisions standbys
 * and registers the job again on the nodes it should run on.
 */
export function onStandbyMissing(ctx: Ctx, nodes: string[]): void {
  const them = nodes.length === 1 ? 'it' : 'them';
  pageHuman(
    ctx,
    `no warm standby left to replace ${nodes.join(', ')}: ${nodes.length === 1 ? 'it has' : 'they have'} left the job, which is not relaunched without ${them}; provision a standby (steadfast plan standby sizes the pool) and register the job again on the nodes it should run on`,
    CITE.standby,
  );
}

/** Training progressed: the incident is over and the code it runs is good (ByteRobust §4.2). */
export function onRestartSucceeded(ctx: Ctx): void {
  const { s, time } = ctx;
  const running = s.runningVersion;
  if (running !== null) setVerdict(s, running, 'good', time);
  const from = s.incident?.rolledBackFrom ?? null;
  if (from !== null && running !== null) {
    emit(
      ctx,
      'notify',
      `training progresses on ${running} after rolling back from ${from}; ${from} stays marked bad until its owners examine it`,
      CITE.rollbackOwners,
      {
        version: from,
      },
    );
  }
  s.incident = null;
  s.scheduled = null;
  s.swap = null;
  s.phase = 'running';
}

/** ByteRobust §6.1: urgent updates are applied now, others ride the next restart or wait 24 h. */
export function onCodeUpdate(ctx: Ctx, version: string, urgent: boolean): void {
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

export function onTick(ctx: Ctx): void {
  const { s, time } = ctx;
  if (s.scheduled !== null && time >= s.scheduled.notBefore) {
    const held = s.scheduled.steps;
    s.scheduled = null;
    emitRestart(ctx, held);
  }
  if (s.phase === 'running' && s.pendingUpdate !== null && time >= s.pendingUpdate.deadline) {
    const pending = s.pendingUpdate;
    applyUpdateNow(
      ctx,
      pending.urgent
        ? `urgent code update to ${pending.version}`
        : `code update to ${pending.version}: its ${hours(ctx.config.lazyUpdateWindowMs)} window expired`,
    );
  }
}
