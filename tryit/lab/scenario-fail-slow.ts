import { setTimeout as sleep } from 'node:timers/promises';
import type { AuditEntry } from '../../core/audit.js';
import { type ProtectedLab } from './protected.js';
import { LAB_MICROBATCHES_PER_RANK, type ProtectedLabOptions } from './protected-options.js';
import {
  RECOVERY_TIMEOUT_MS,
  at,
  recoveryDeadline,
  timeLeft,
  entriesSince,
  firstStep,
  judgeEviction,
  report,
  step,
  until,
  waitForNewRun,
  waitForRunning,
  waitForTraining,
  type ScenarioReport,
} from './scenario-support.js';
import { slowMachine, type Iteration } from './training.js';

/**
 * The fail-slow scenario: one machine of the job computes slower, nothing fails. The slow rank's
 * own compute times, pushed to its node's agent and scraped by Prometheus, are all steadfast
 * sees; the controller's online fail-slow analyzer (analyzers/workers/failslow-watch.ts) verifies the
 * slow-down (BOCD, ≥ 10 %, Greyhound §4.2) and climbs the S1–S4 ladder as the training time it
 * costs pays for each rung (§5.1):
 *
 *  1. a slow-down S2 can absorb (+40 ms per micro-batch, about ×3 on the lab's 20 ms ones): the
 *     rebalanced plan, served at GET /api/v1/jobs/:id/microbatches, gives the slow rank fewer
 *     micro-batches and the training loop follows it; the iteration time is measured before the
 *     fault, slowed, and on the plan;
 *  2. the machine gets much slower (+400 ms per micro-batch, more than the one micro-batch S2 must
 *     leave it): the lost time reaches S3's cost and then S4's, and S4 hands the machine to the
 *     recovery ladder, which evicts it onto a warm standby; the job resumes from its newest
 *     checkpoint.
 */

/**
 * The lab for it: 2 ranks (the trackers follow each rank against its own past, so two are
 * enough), 1 standby, and the fail-slow settings scaled to the lab: checks every second,
 * mitigation costs of seconds (shipped: 5 s and 30 / 600 / 1800 s), and verification at 50 %
 * (shipped: Greyhound's 10 %). The lab's ranks share the machine's CPU cores, so a healthy rank's
 * compute time moves by up to a third with the others' load (seen: ×1.31 while rank 1 was
 * slowed); the injected slow-down is about ×3.
 */
export const FAIL_SLOW_LAB: ProtectedLabOptions = {
  nodes: 2,
  standbys: 1,
  failSlow: { intervalSeconds: 1, costSeconds: { S2: 2, S3: 5, S4: 8 }, threshold: 0.5 },
};

/** Seconds added to each micro-batch on the slow machine: first what S2 can absorb, then what it cannot. */
export const SLOWDOWN_SECONDS = 0.04;
export const WORSE_SLOWDOWN_SECONDS = 0.4;
/** Healthy training the trackers learn the level from before the fault (one sample per check). */
const BASELINE_MS = 15_000;
/** Iterations measured on the plan before the machine gets worse. */
const MEASURED_ON_PLAN = 30;

/** The job's iteration time (rank 0's whole synchronous step) in three stretches, median seconds. */
export interface IterationSeconds {
  readonly before: number | null;
  /** Slowed, before the rebalanced plan reached the training loop. */
  readonly slowed: number | null;
  /** On the rebalanced plan, before the machine got worse. */
  readonly rebalanced: number | null;
  readonly samples: { readonly before: number; readonly slowed: number; readonly rebalanced: number };
}

export interface FailSlowReport extends ScenarioReport {
  readonly iterationSeconds: IterationSeconds;
  /** The slow rank's micro-batches per iteration on the plan (of `microbatches` in all). */
  readonly planned: { readonly slowRank: number | null; readonly microbatches: number };
}

const medianOf = (values: readonly number[]): number | null => {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  const middle = Math.floor(sorted.length / 2);
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
};

const mitigation = (entries: AuditEntry[], strategy: string): AuditEntry | undefined =>
  entries.find((entry) => entry.type === 'decision' && entry.data.verb === 'failslow_mitigation' && entry.data.strategy === strategy);

export async function runFailSlow(lab: ProtectedLab, rank = 1): Promise<FailSlowReport> {
  const problems: string[] = [];
  const job = lab.job;
  const even = LAB_MICROBATCHES_PER_RANK;
  const total = even * lab.computeNodes.length;
  const { run: before } = await waitForTraining(
    lab,
    (lab.log.iterations(lab.log.runs().at(-1), 0).at(0)?.iteration ?? 0) + 2 * (lab.options.checkpointEvery ?? 10),
  );
  await sleep(BASELINE_MS);
  const known = lab.log.runs();
  const standbys = await lab.controller.backend.standbys();
  const victim = /^\[rank \d+\] pid \d+ on (\S+),/.exec(lab.log.find(before, new RegExp(`^\\[rank ${rank}\\] pid \\d+ on `))?.text ?? '')?.[1];
  if (victim === undefined) throw new Error(`run ${before}: rank ${rank} never said which node it is on`);

  // Part 1: a slow-down the rebalanced plan absorbs.
  const t0 = Date.now();
  slowMachine(lab.paths, victim, SLOWDOWN_SECONDS);
  const ofRun = (from: number): Iteration[] => lab.log.iterations(before, 0).filter((iteration) => iteration.seenAt >= from);
  const onPlan = await until(
    () => ofRun(t0).filter((iteration) => iteration.microbatches !== even),
    (iterations) => iterations.length >= MEASURED_ON_PLAN,
    timeLeft(recoveryDeadline(t0)),
    100,
  );
  if (onPlan === undefined)
    problems.push(
      `rank 0 of run ${before} did not train ${MEASURED_ON_PLAN} iterations on a rebalanced plan within ${RECOVERY_TIMEOUT_MS / 1000} s of the slow-down`,
    );
  const served = await lab.api(`/api/v1/jobs/${job}/microbatches`);
  const assignment = Array.isArray(served.body.assignment) ? (served.body.assignment as number[]) : [];

  // Part 2: slower than S2 can hide; the lost time pays for S3, then S4.
  const tWorse = Date.now();
  slowMachine(lab.paths, victim, WORSE_SLOWDOWN_SECONDS);
  const deadline = recoveryDeadline(tWorse);
  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the machine got slower within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push('the ladder did not see training progress again without the slow machine');

  const entries = entriesSince(await lab.audit(), t0, job);
  const change = entries.find(
    (entry) => entry.type === 'signal' && entry.data.verb === 'failslow_change' && entry.data.rank === rank && entry.data.direction === 'slowdown',
  );
  const falseAlarm = entries.find((entry) => entry.type === 'signal' && entry.data.verb === 'failslow_change' && entry.data.rank !== rank);
  const [s2, s3, s4] = [mitigation(entries, 'S2'), mitigation(entries, 'S3'), mitigation(entries, 'S4')];
  if (!change) problems.push(`no verified slow-down of rank ${rank} in the audit`);
  if (falseAlarm) problems.push(`a slow-down reported for a healthy rank: ${falseAlarm.summary}`);
  if (!s2) problems.push('no S2 decision (rebalanced micro-batches)');
  if (!s4) problems.push('no S4 decision (checkpoint and restart without the slow machine)');
  if (s2 && s4 && !(Date.parse(s2.time) < tWorse && Date.parse(s4.time) > tWorse))
    problems.push('S2 was not in force before the machine got worse, or S4 came before it');
  const { decision, stopped, drained, activated, restarted, standby, record, fresh, resumption } = await judgeEviction(
    lab,
    entries,
    { victim, before, relaunched, standbys, what: 'slowed' },
    problems,
  );

  // The job's iteration time: rank 0's whole step, all-reduce included, waits for the slow rank.
  const all = lab.log.iterations(before, 0);
  const firstOnPlan = onPlan?.[0]?.seenAt ?? tWorse;
  const beforeFault = all.filter((iteration) => iteration.seenAt < t0).slice(-MEASURED_ON_PLAN);
  // Half a second for the fault to reach the rank's next micro-batch and its line to be read.
  const slowed = all.filter((iteration) => iteration.seenAt >= t0 + 500 && iteration.seenAt < firstOnPlan && iteration.microbatches === even);
  // The first two lines on the plan may be from iterations begun before it.
  const rebalanced = all.filter((iteration) => iteration.seenAt < tWorse && iteration.microbatches !== even && iteration.seenAt >= firstOnPlan).slice(2);
  const iterationSeconds: IterationSeconds = {
    before: medianOf(beforeFault.map((iteration) => iteration.stepSeconds)),
    slowed: medianOf(slowed.map((iteration) => iteration.stepSeconds)),
    rebalanced: medianOf(rebalanced.map((iteration) => iteration.stepSeconds)),
    samples: { before: beforeFault.length, slowed: slowed.length, rebalanced: rebalanced.length },
  };
  const { before: healthy, slowed: slow, rebalanced: mitigated } = iterationSeconds;
  if (healthy === null || slow === null || mitigated === null) problems.push(`iteration times missing: ${JSON.stringify(iterationSeconds)}`);
  else if (!(mitigated < 0.9 * slow))
    problems.push(`the plan did not bring the iteration time back: ${mitigated.toFixed(3)} s on it, ${slow.toFixed(3)} s slowed`);
  const slowShare = assignment[rank] ?? null;
  if (slowShare !== null && !(slowShare < even)) problems.push(`the plan gave the slow rank ${slowShare} of ${total} micro-batches, not fewer than ${even}`);

  const figures = (value: number | null): string => (value === null ? '?' : `${(value * 1000).toFixed(0)} ms`);
  const timeline = [
    step(`${victim} (rank ${rank}) made slower: +${SLOWDOWN_SECONDS * 1000} ms per micro-batch`, t0, t0, `iteration ${figures(healthy)} before`),
    step(`detected: rank ${rank}'s pushed compute times, a verified slow-down`, at(change), t0, change?.summary ?? ''),
    step('decided: S2, rebalanced micro-batches', at(s2), t0, s2?.summary ?? ''),
    step(
      `the training loop on the plan: rank 0 runs ${onPlan?.[0]?.microbatches ?? '?'} of ${total}`,
      onPlan?.[0]?.seenAt,
      t0,
      `iteration ${figures(slow)} slowed → ${figures(mitigated)} on the plan [${assignment.join(', ')}]`,
    ),
    step(`slowed further: +${WORSE_SLOWDOWN_SECONDS * 1000} ms per micro-batch, more than S2 can hide`, tWorse, t0, ''),
    step('decided: S3, topology plan', at(s3), t0, s3?.summary ?? ''),
    step(`decided: S4, checkpoint and restart without ${victim}`, at(s4), t0, s4?.summary ?? ''),
    step('decided: stop, evict, restart', at(decision), t0, decision?.summary ?? ''),
    step(`stopped: run ${before} cancelled and gone`, at(stopped), t0, stopped?.summary ?? ''),
    step(`${victim} drained`, at(drained), t0, drained?.summary ?? ''),
    step(`standby ${standby ?? '?'} activated in its place`, at(activated), t0, activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${fresh?.nodes ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
  ];
  // Recovery is counted from the slow-down S2 could not hide: the one that needed the restart.
  const result = await report(lab, 'fail-slow', tWorse, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems, t0);
  return { ...result, iterationSeconds, planned: { slowRank: slowShare, microbatches: total } };
}
