import type { AuditEntry } from '../../core/audit.js';
import { killNode, referenceLosses, trainingProcesses } from './hot-swap-lab.js';
import type { ProtectedLab } from './protected.js';
import type { ProtectedLabOptions } from './protected-options.js';
import {
  RECOVERY_TIMEOUT_MS,
  at,
  entriesSince,
  firstStep,
  judgeEviction,
  receivedAt,
  recoveryDeadline,
  report,
  step,
  timeLeft,
  until,
  waitForNewRun,
  waitForRunning,
  waitForTraining,
  type ScenarioReport,
} from './scenario-support.js';
import { ITERATION, type LogLine } from './training.js';

/**
 * The hot swap in the lab (DeadPool §V-C, §VI; ByteRobust §6.3): the job runs with the example's
 * in-memory checkpoints every step and spare processes on spare nodes of its allocation, and a
 * machine fault is recovered inside the running Slurm job — the spare takes the failed node's
 * shard, restored from its replica on a peer, the survivors roll back at most one step from
 * their own memory, and no rank is started anew. The second case kills the spare while it is
 * being called: the swap cannot finish, and the controller falls back to stop and relaunch.
 */

/**
 * 2 ranks and 2 spares in the allocation (one per case), 2 warm standbys in the reservation: one
 * replaces the spare the first case uses (it joins the allocation at the next launch), one takes
 * the failed spare's place in the second case's fallback.
 */
export const HOT_SWAP_LAB: ProtectedLabOptions = { nodes: 2, spares: 2, standbys: 2 };

/** Steps after the swap whose losses must equal the unfaulted reference run's. */
const COMPARED_STEPS = 5;

const SWAPPED = /^\[rank (\d+)\] hot swap: epoch (\d+), world (\d+), resumed from step (\d+) \(restored from (.*)\)$/;

interface World {
  readonly epoch: number;
  readonly shards: readonly { shard: number; node: string }[];
  readonly spares: readonly string[];
  readonly swap: { epoch: number; replaced: Record<string, string> } | null;
}

async function world(lab: ProtectedLab): Promise<World> {
  const answer = await lab.api(`/api/v1/jobs/${lab.job}/world`);
  if (answer.status !== 200) throw new Error(`GET world: ${answer.status} ${JSON.stringify(answer.body)}`);
  return answer.body as unknown as World;
}

/** Lines of `run` seen after index `from` of the log, with their index. */
function linesOf(lab: ProtectedLab, run: string, from: number): { index: number; line: LogLine }[] {
  return lab.log.lines.flatMap((line, index) => (index >= from && line.slurmJob === run ? [{ index, line }] : []));
}

/** The newest iteration any rank of `run` logged among the first `upTo` lines of the log. */
function lastIteration(lab: ProtectedLab, run: string, upTo: number): number {
  let last = 0;
  for (const { index, line } of linesOf(lab, run, 0)) {
    if (index >= upTo) break;
    const match = ITERATION.exec(line.text);
    if (match) last = Math.max(last, Number(match[2]));
  }
  return last;
}

const decisionOf = (entries: AuditEntry[], job: string, verb: string): AuditEntry | undefined =>
  entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: ${verb}`));
const actionOf = (entries: AuditEntry[], pattern: RegExp): AuditEntry | undefined =>
  entries.find((entry) => entry.type === 'action' && pattern.test(entry.summary));

/** Case 1: a fatal Xid on the job's first node, and its rank killed; the spare takes its place in the running job. */
export async function runHotSwap(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { run } = await waitForTraining(lab, 2 * (lab.options.checkpointEvery ?? 10) + 3);
  const startRecord = await lab.jobRecord();
  const victim = startRecord.nodes[0] ?? '';
  const before = await world(lab);
  const spare = before.spares[0];
  if (spare === undefined) problems.push('the job has no spare left to swap in');
  const mark = lab.log.lines.length;
  const pid = trainingProcesses(lab, run).find((proc) => proc.node === victim && !proc.spare)?.pid;
  const t0 = lab.injectXid(victim, 79, 'GPU has fallen off the bus.', '0000:3a:00', pid);
  const killed = killNode(lab, run, victim);
  const deadline = recoveryDeadline(t0);
  const ranks = startRecord.nodes.length;

  // Every rank says it joined the new epoch; then rank 0 trains the step after the one they agreed on.
  const swapped = await until(
    () =>
      linesOf(lab, run, mark).flatMap(({ index, line }) =>
        SWAPPED.test(line.text) ? [{ index, line, match: SWAPPED.exec(line.text) as RegExpExecArray }] : [],
      ),
    (found) => new Set(found.map(({ match }) => match[1])).size >= ranks,
    Math.min(60_000, timeLeft(deadline)),
    50,
  );
  if (swapped === undefined)
    problems.push(
      `not every rank joined a new epoch within 60 s: ${
        linesOf(lab, run, mark)
          .filter(({ line }) => /hot swap/.test(line.text))
          .map(({ line }) => line.text)
          .join(' | ') || 'no hot swap line'
      }`,
    );
  const resumedFrom = swapped === undefined ? null : Math.min(...swapped.map(({ match }) => Number(match[4])));
  const swapIndex = swapped === undefined ? lab.log.lines.length : Math.min(...swapped.map(({ index }) => index));
  const firstAfter = await until(
    () => linesOf(lab, run, swapIndex).find(({ line }) => ITERATION.exec(line.text)?.[1] === '0'),
    (found) => found !== undefined,
    Math.min(60_000, timeLeft(deadline)),
    50,
  );
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push('the ladder did not call the job running again');
  // Train on past the compared steps, then ask an unfaulted run for the same steps.
  const comparedUpTo = (resumedFrom ?? 0) + COMPARED_STEPS;
  await until(
    () => lab.log.iterations(run, 0).at(-1)?.iteration ?? 0,
    (last) => last >= comparedUpTo,
    Math.min(60_000, timeLeft(deadline)),
    100,
  );
  const reference = await referenceLosses(lab, ranks, comparedUpTo);

  const after = new Map<number, number>();
  for (const { line } of linesOf(lab, run, swapIndex)) {
    const match = ITERATION.exec(line.text);
    if (match?.[1] === '0' && !after.has(Number(match[2]))) after.set(Number(match[2]), Number(match[3]));
  }
  const compared = Array.from({ length: COMPARED_STEPS }, (_, offset) => (resumedFrom ?? 0) + 1 + offset);
  const mismatched = compared.filter((stepNumber) => {
    const [mine, theirs] = [after.get(stepNumber), reference.get(stepNumber)];
    return mine === undefined || theirs === undefined || Math.abs(mine - theirs) > 1e-6;
  });
  const lossMatches = resumedFrom !== null && mismatched.length === 0;
  if (!lossMatches)
    problems.push(
      `losses after the swap differ from the unfaulted run at steps ${mismatched.join(', ')}: ${mismatched.map((n) => `${n}: ${after.get(n) ?? '—'} vs ${reference.get(n) ?? '—'}`).join('; ')}`,
    );
  const lastBefore = lastIteration(lab, run, swapIndex);
  const reexecutedIterations = resumedFrom === null ? null : Math.max(0, lastBefore - resumedFrom);
  // A rank announces its pid when it starts training: a pid not seen before the fault is a rank started anew (the spare was there, idle).
  const known = new Set(
    trainingProcesses(lab, run)
      .filter((proc) => proc.line.seenAt < t0)
      .map((proc) => proc.pid),
  );
  const restarted = new Set(
    lab.log.lines
      .slice(mark)
      .flatMap((line) => /^\[rank \d+\] pid (\d+) on /.exec(line.text)?.slice(1, 2) ?? [])
      .map(Number)
      .filter((pid) => !known.has(pid)),
  ).size;
  if (lab.log.runs().at(-1) !== run) problems.push(`Slurm ran the job again: ${lab.log.runs().join(' → ')}`);
  if (restarted > 0) problems.push(`${restarted} rank processes were started anew`);
  if (reexecutedIterations !== null && reexecutedIterations > 1) problems.push(`${reexecutedIterations} iterations were executed again (at most 1)`);

  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /xid/i.test(entry.summary));
  const decision = decisionOf(entries, job, 'hot_swap');
  const opened = actionOf(entries, new RegExp(`^${job}: hot_swap.*epoch`));
  const done = entries.find((entry) => entry.type === 'decision' && /hot swap done/.test(entry.summary));
  const sinfo = await lab.sinfo(victim);
  if (!decision) problems.push('no hot_swap decision in the audit');
  else if (
    !/DeadPool/.test(decision.summary + JSON.stringify(decision.data ?? {})) ||
    !/ByteRobust/.test(decision.summary + JSON.stringify(decision.data ?? {}))
  )
    problems.push('the hot_swap decision does not cite DeadPool and ByteRobust');
  if (decisionOf(entries, job, 'evict') || decisionOf(entries, job, 'stop')) problems.push('the ladder also stopped or evicted the job');
  if (!/^drain/.test(sinfo.state)) problems.push(`${victim} is ${sinfo.state} in sinfo, not drained`);
  const record = await lab.jobRecord();
  if (spare !== undefined && !record.nodes.includes(spare)) problems.push(`the job runs on ${record.nodes.join(', ')}, without spare ${spare}`);
  const first = after.size === 0 ? undefined : Math.min(...after.keys());
  const timeline = [
    step(`fatal Xid 79 appended to ${victim}'s kernel log, its rank killed (pid ${killed.join(', ') || '?'})`, t0, t0, ''),
    step('detected: the agent on the node posted it, the controller stored the signal', receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: hot swap onto a spare', at(decision), t0, decision?.summary ?? ''),
    step(`epoch opened: ${spare ?? '?'} in place of ${victim}`, at(opened), t0, opened?.summary ?? ''),
    step(
      `every rank joined the new epoch, resumed from step ${resumedFrom ?? '?'}`,
      swapped === undefined ? undefined : Math.max(...swapped.map(({ line }) => line.seenAt)),
      t0,
      swapped?.map(({ line }) => line.text).join(' | ') ?? '',
    ),
    step(
      `first iteration after the swap: step ${first ?? '?'}`,
      firstAfter?.line.seenAt,
      t0,
      first === undefined ? '' : `rank 0 loss ${after.get(first) ?? '?'}; the unfaulted run had ${reference.get(first) ?? '?'}`,
    ),
    step('hot swap done (every rank stepped in the epoch)', at(done), t0, done?.summary ?? ''),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
  ];
  const judged = await report(lab, 'hot-swap', t0, undefined, [run], timeline, problems);
  const recoverySeconds = firstAfter === undefined ? null : Math.round((firstAfter.line.seenAt - t0) / 100) / 10;
  return {
    ...judged,
    recoverySeconds,
    resumedFromStep: resumedFrom,
    lostIterations: reexecutedIterations,
    reexecutedIterations,
    ranksRestarted: restarted,
    lossMatches,
  };
}

/**
 * Case 2: a fatal Xid on a node of the job, its rank killed, and the spare the controller calls
 * killed as the epoch opens. The swap cannot finish: the controller falls back to stop, evict and
 * relaunch from the newest checkpoint on disk, as for any machine fault.
 */
export async function runHotSwapSpareDies(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { run } = await waitForTraining(lab, (lab.log.iterations(lab.log.runs().at(-1), 0).at(-1)?.iteration ?? 0) + 2 * (lab.options.checkpointEvery ?? 10));
  const known = lab.log.runs();
  const startRecord = await lab.jobRecord();
  const victim = startRecord.nodes.at(-1) ?? '';
  const before = await world(lab);
  if (before.spares.length === 0) problems.push('the job has no spare left to swap in');
  const standbys = await lab.controller.backend.standbys();
  const pid = trainingProcesses(lab, run).find((proc) => proc.node === victim && !proc.spare)?.pid;
  const t0 = lab.injectXid(victim, 79, 'GPU has fallen off the bus.', '0000:3a:00', pid);
  killNode(lab, run, victim);
  const deadline = recoveryDeadline(t0);
  // The moment the epoch opens, the spare it calls dies.
  const opened = await until(
    () => world(lab),
    (now) => now.epoch > before.epoch && now.swap !== null,
    Math.min(30_000, timeLeft(deadline)),
    20,
  );
  const calledSpare = opened?.swap?.replaced[victim];
  const killedSpare = calledSpare === undefined ? [] : killNode(lab, run, calledSpare, 'spares');
  const killedAt = Date.now();
  if (calledSpare === undefined) problems.push(`no epoch opened for ${victim}`);

  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the fallback within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push('the ladder did not see training progress again');
  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /xid/i.test(entry.summary));
  const decision = decisionOf(entries, job, 'hot_swap');
  const failed = entries.find((entry) => /hot swap/.test(entry.summary) && /fall(?:ing|s)? back/.test(entry.summary));
  if (!decision) problems.push('no hot_swap decision in the audit');
  if (!failed) problems.push('no audited fallback from the hot swap');
  // The spare that never came is evicted with the fallback, a standby in its place. Should it have
  // met the survivor before it died (its 100 ms poll beat the kill), it is not the swap's culprit
  // and the fallback relaunches without evicting it.
  const evicting = entries.some((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: evict`));
  const judged: string[] = [];
  const eviction = await judgeEviction(lab, entries, { victim, before: run, relaunched, standbys, what: 'interrupted' }, judged);
  problems.push(...(evicting ? judged : judged.filter((problem) => problem !== 'no eviction decision' && !problem.startsWith('no warm standby'))));
  const timeline = [
    step(`fatal Xid 79 appended to ${victim}'s kernel log, its rank killed`, t0, t0, ''),
    step('detected: the agent on the node posted it, the controller stored the signal', receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: hot swap onto a spare', at(decision), t0, decision?.summary ?? ''),
    step(
      `spare ${calledSpare ?? '?'} killed as its epoch opened (pid ${killedSpare.join(', ') || '?'})`,
      calledSpare === undefined ? undefined : killedAt,
      t0,
      '',
    ),
    step('the swap failed: falling back to stop and relaunch', at(failed), t0, failed?.summary ?? ''),
    step(`stopped: run ${run} cancelled and gone`, at(eviction.stopped), t0, eviction.stopped?.summary ?? ''),
    step(`standby ${eviction.standby ?? '?'} activated`, at(eviction.activated), t0, eviction.activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${eviction.fresh?.nodes ?? '?'}`, at(eviction.restarted), t0, eviction.restarted?.summary ?? ''),
    firstStep(eviction.resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${eviction.record.nodes.join(', ')}`),
  ];
  return report(lab, 'hot-swap-spare-dies', t0, eviction.resumption, [run, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}
