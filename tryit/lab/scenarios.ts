import { errorMessage } from '../../core/errors.js';
import type { ProtectedLab } from './protected.js';
import type { ProtectedLabOptions } from './protected-options.js';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { triggerRankCrash, triggerRankHang, writeCodeVersion } from './training.js';
import { FAIL_SLOW_LAB, runFailSlow } from './scenario-fail-slow.js';
import { HOT_SWAP_LAB, runHotSwap, runHotSwapSpareDies } from './scenario-hot-swap.js';
import { FOREIGN_DRAIN_LAB, runForeignDrain } from './scenario-foreign-drain.js';
import { PREFLIGHT_LAB, runPreflight } from './scenario-preflight.js';
import {
  RECOVERY_TIMEOUT_MS,
  at,
  recoveryDeadline,
  timeLeft,
  beforeNodeFault,
  entriesSince,
  firstStep,
  judgeEviction,
  judgeResumption,
  receivedAt,
  report,
  step,
  until,
  waitForNewRun,
  waitForRunning,
  waitForTraining,
  type ScenarioReport,
} from './scenario-support.js';

export { waitForTraining, type ScenarioReport, type TimelineStep } from './scenario-support.js';

/**
 * The lab's scenarios: a real PyTorch job under steadfast's protection, broken on purpose, and
 * judged by what the job itself wrote — which Slurm runs there were, where the relaunched run
 * resumed, whether its first step is the checkpoint's next one and its loss the one the
 * interrupted run had there — and by the controller's audit trail for the timeline.
 *
 *  - machine-fault: a fatal Xid 79 in one node's kernel log → drained, the job stopped (scancel),
 *    a warm standby in its place, relaunched with sbatch, resumed from the newest checkpoint;
 *  - bad-code: an urgent code update whose ranks raise a TypeError → rolled back through
 *    `{version}`, training goes on;
 *  - crash: a rank raises a CUDA-style RuntimeError → srun's failure in the job log → stop-time
 *    diagnostics on every node find nothing → reattempt in place;
 *  - hang: a rank stops entering the collectives → progress stalls → SteadfastTrainingStalled
 *    → stack aggregation over every rank's faulthandler dumps → the odd rank's node over-evicted,
 *    a standby in its place, relaunched from the newest checkpoint;
 *  - fail-slow: one machine computes slower → its rank's pushed compute times → the online
 *    fail-slow analyzer → S2 rebalanced micro-batches, then, slower still, S4: evicted onto a
 *    standby, resumed from the newest checkpoint (scenario-fail-slow.ts);
 *  - hot-swap, hot-swap-spare-dies: a machine fault recovered inside the running job by a spare
 *    restored from in-memory replicas, and the fallback when the spare dies (scenario-hot-swap.ts);
 *  - foreign-drain: a node an administrator drained gets a fatal Xid 48: its GPU is reset, the job
 *    moves to a standby, the administrator's drain stays; a refused reset appends steadfast's reason
 *    after theirs (scenario-foreign-drain.ts);
 *  - preflight: one node's link slowed (tc tbf) → the job's preflight all-reduce is slow, the
 *    pairwise bisection names the node → drained, the job starts on the others and a standby
 *    (scenario-preflight.ts).
 */

export const SCENARIO_NAMES = [
  'machine-fault',
  'bad-code',
  'crash',
  'hang',
  'fail-slow',
  'hot-swap',
  'hot-swap-spare-dies',
  'foreign-drain',
  'preflight',
] as const;
export type ScenarioName = (typeof SCENARIO_NAMES)[number];

/** Scenario 1: a fatal Xid on one of the job's nodes. */
export async function runMachineFault(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { before, known, victim, standbys } = await beforeNodeFault(lab);
  const pid = Number(lab.log.find(before, new RegExp(`^\\[rank \\d+\\] pid (\\d+) on ${victim},`))?.text.match(/pid (\d+)/)?.[1] ?? Number.NaN);
  const t0 = lab.injectXid(victim, 79, 'GPU has fallen off the bus.', '0000:3a:00', Number.isNaN(pid) ? undefined : pid);
  const deadline = recoveryDeadline(t0);

  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the Xid within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push('the ladder did not see training progress again');

  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /xid/i.test(entry.summary));
  // The alert names the node, which has left the job: look beyond the job's entries for it.
  const alert = (await lab.audit()).find(
    (entry) => Date.parse(entry.time) >= t0 && entry.type === 'signal' && entry.node === victim && /^alertmanager reports Xid 79/.test(entry.summary),
  );
  const sinfo = await lab.sinfo(victim);

  if (!signal) problems.push(`no Xid signal from ${victim} in the audit`);
  if (!/^drain/.test(sinfo.state) || !/Xid/.test(sinfo.reason))
    problems.push(`${victim} is ${sinfo.state} "${sinfo.reason}" in sinfo, not drained for the Xid`);
  const { decision, stopped, drained, activated, restarted, standby, record, fresh, resumption } = await judgeEviction(
    lab,
    entries,
    { victim, before, relaunched, standbys, what: 'interrupted' },
    problems,
  );
  const timeline = [
    step(
      `fatal Xid 79 appended to ${victim}'s kernel log`,
      t0,
      t0,
      `NVRM: Xid (PCI:0000:3a:00): 79, pid=${Number.isNaN(pid) ? '?' : pid}, name=python3, GPU has fallen off the bus.`,
    ),
    step('detected: the agent on the node posted it, the controller stored the signal', receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: stop, evict, restart', at(decision), t0, decision?.summary ?? ''),
    step(`stopped: run ${before} cancelled and gone`, at(stopped), t0, stopped?.summary ?? ''),
    step(`${victim} drained`, at(drained), t0, `sinfo: ${sinfo.state} "${sinfo.reason}"`),
    step(`standby ${standby ?? '?'} activated in its place`, at(activated), t0, activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${fresh?.nodes ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
    step(`the Prometheus path: the alert for the same Xid through Alertmanager`, receivedAt(alert), t0, alert?.summary ?? ''),
  ];
  return report(lab, 'machine-fault', t0, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}

/** Scenario 5: an urgent code update whose ranks raise a TypeError at their first step. */
export async function runBadCode(lab: ProtectedLab, badVersion = 'v2'): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { run: before } = await waitForTraining(
    lab,
    (lab.log.iterations(lab.log.runs().at(-1), 0).at(0)?.iteration ?? 0) + 2 * (lab.options.checkpointEvery ?? 10),
  );
  const known = lab.log.runs();
  const good = (await lab.jobRecord()).version;
  writeCodeVersion(lab.paths, badVersion, "unsupported operand type(s) for *: 'NoneType' and 'float'");
  const t0 = Date.now();
  const deadline = recoveryDeadline(t0);
  const update = await lab.api(`/api/v1/jobs/${job}/code-updates`, { version: badVersion, urgent: true });
  if (update.status !== 202) problems.push(`the code update was answered ${update.status}: ${JSON.stringify(update.body)}`);

  // The bad version's run: it fails before its first iteration, so it is found by its header.
  const badRun = await until(
    () => lab.log.runs().find((run) => !known.includes(run) && lab.log.find(run, new RegExp(`/code/${badVersion}/train\\.py`)) !== undefined),
    (run) => run !== undefined,
    timeLeft(deadline),
    100,
  );
  if (badRun === undefined) problems.push(`no run of ${badVersion} started`);
  const failedLine =
    badRun === undefined
      ? undefined
      : await until(
          () => lab.log.find(badRun, /^srun: error: .*Exited with exit code/),
          (line) => line !== undefined,
          timeLeft(deadline),
          100,
        );
  if (badRun !== undefined && failedLine === undefined) problems.push(`run ${badRun} of ${badVersion} did not fail`);
  const relaunched = await waitForNewRun(lab, [...known, ...(badRun === undefined ? [] : [badRun])], deadline);
  if (relaunched === undefined) problems.push(`no run trained after the rollback within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => record.version === good, deadline);
  if (runningAt === undefined) problems.push(`the ladder did not see training progress again on ${good}`);

  const entries = entriesSince(await lab.audit(), t0, job);
  const updateStop = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: stop: done`));
  const updateLaunch = entries.find(
    (entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: restart: done`) && entry.summary.includes(`launched ${badVersion}`),
  );
  const signal = entries.find((entry) => entry.type === 'signal' && /worker_failed/.test(entry.summary) && /user_code/.test(entry.summary));
  const decision = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: rollback`));
  const rolledBack = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: rollback: done`));
  const restarted = entries.find(
    (entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: restart: done`) && entry.summary.includes(`launched ${good}`),
  );
  const record = await lab.jobRecord();
  const bad = badRun === undefined ? undefined : await lab.slurmJob(badRun).catch(() => undefined);
  const exception = badRun === undefined ? undefined : lab.log.find(badRun, /^TypeError: /);

  if (!signal) problems.push('no worker failure classified as user code in the audit');
  if (!decision) problems.push(`no rollback decision to ${good}`);
  if (record.version !== good) problems.push(`the job runs ${record.version}, not ${good}`);
  if (bad && !/FAILED/.test(bad.state)) problems.push(`run ${badRun ?? ''} of ${badVersion} ended ${bad.state}, not FAILED`);
  const resumption = relaunched === undefined ? undefined : judgeResumption(lab, [before], relaunched);
  const failedAt = failedLine?.seenAt;
  const timeline = [
    step(
      `urgent code update to ${badVersion} posted`,
      t0,
      t0,
      `POST /api/v1/jobs/${job}/code-updates → ${update.status} ${JSON.stringify(update.body.steps ?? '')}`,
    ),
    step(`stopped: run ${before} cancelled`, at(updateStop), t0, updateStop?.summary ?? ''),
    step(`relaunched on ${badVersion}: run ${badRun ?? '?'}`, at(updateLaunch), t0, updateLaunch?.summary ?? ''),
    step(`run ${badRun ?? '?'} failed: ${exception?.text ?? 'TypeError'}`, failedAt, t0, failedLine?.text ?? ''),
    step("detected: the batch host's agent read srun's failure in the job log", receivedAt(signal), t0, signal?.summary ?? ''),
    step(`decided: roll back to ${good}`, at(decision), t0, decision?.summary ?? ''),
    step(`code version set to ${good}`, at(rolledBack), t0, rolledBack?.summary ?? ''),
    step(`relaunched on ${good}: run ${relaunched ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step(`the ladder saw training progress on ${good}: running`, runningAt, t0, ''),
  ];
  // Recovery is counted from the failure itself, not from the update that brought it.
  const result = await report(
    lab,
    'bad-code',
    failedAt ?? t0,
    resumption,
    [before, ...(badRun === undefined ? [] : [badRun]), ...(relaunched === undefined ? [] : [relaunched])],
    timeline,
    problems,
    t0,
  );
  return result;
}

/** Scenario 2: a rank raises a CUDA-style RuntimeError; nothing names a culprit. */
export async function runCrash(lab: ProtectedLab, rank = 1): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const { run: before } = await waitForTraining(
    lab,
    (lab.log.iterations(lab.log.runs().at(-1), 0).at(0)?.iteration ?? 0) + 2 * (lab.options.checkpointEvery ?? 10),
  );
  const known = lab.log.runs();
  const startRecord = await lab.jobRecord();
  const t0 = Date.now();
  const deadline = recoveryDeadline(t0);
  triggerRankCrash(lab.paths, rank);

  const failedLine = await until(
    () => lab.log.find(before, /^srun: error: .*Exited with exit code/),
    (line) => line !== undefined,
    Math.min(60_000, timeLeft(deadline)),
    100,
  );
  if (failedLine === undefined) problems.push(`run ${before} did not fail after rank ${rank} was made to crash`);
  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the crash within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, () => true, deadline);
  if (runningAt === undefined) problems.push('the ladder did not see training progress again');

  const entries = entriesSince(await lab.audit(), t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && /worker_failed/.test(entry.summary));
  const decision = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: run_diagnostics`));
  const diagnosed = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: diagnostics:`));
  const reattempt = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: reattempt`));
  const restarted = entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: reattempt: done`));
  const record = await lab.jobRecord();
  const crashed = await lab.slurmJob(before).catch(() => undefined);

  if (!signal) problems.push('no worker failure signal in the audit');
  else if (!/crash fault/.test(signal.summary)) problems.push(`the failure was not classified as a crash: ${signal.summary}`);
  if (!decision) problems.push('no stop-time diagnostics decision');
  if (!reattempt) problems.push('no reattempt decision after the diagnostics');
  if (record.nodes.join(',') !== startRecord.nodes.join(','))
    problems.push(`the job moved from ${startRecord.nodes.join(', ')} to ${record.nodes.join(', ')}: a reattempt stays in place`);
  if (crashed && !/FAILED/.test(crashed.state)) problems.push(`run ${before} ended ${crashed.state}, not FAILED`);
  const resumption = relaunched === undefined ? undefined : judgeResumption(lab, [before], relaunched);
  const exception = lab.log.find(before, /^RuntimeError: CUDA error/);
  const timeline = [
    step(`rank ${rank} made to raise a CUDA-style RuntimeError at its next step`, t0, t0, ''),
    step(`run ${before} failed: srun's error in the job log`, failedLine?.seenAt, t0, `${exception?.text ?? ''} | ${failedLine?.text ?? ''}`),
    step("detected: the batch host's agent read the failure in the job log", receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: stop-time diagnostics (no culprit named)', at(decision), t0, decision?.summary ?? ''),
    step('diagnostics on every node of the job', at(diagnosed), t0, diagnosed?.summary ?? ''),
    step('decided: reattempt in place', at(reattempt), t0, reattempt?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, ''),
  ];
  return report(lab, 'crash', failedLine?.seenAt ?? t0, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems, t0);
}

/** The faulthandler dumps of `rank` under the lab's stack directory, newest last. */
function stackDumps(lab: ProtectedLab, rank: number): string[] {
  const prefix = `${lab.job}-rank${rank}-`;
  try {
    return readdirSync(lab.paths.stacks)
      .filter((name) => name.startsWith(prefix))
      .map((name) => readFileSync(join(lab.paths.stacks, name), 'utf8'));
  } catch {
    return [];
  }
}

/**
 * Scenario 3: rank `rank` stops entering the collectives (it sleeps forever in
 * lab_hang_before_allreduce at its next step); the others block in the gradient all-reduce.
 * Nothing fails: the stalled progress is the signal (SteadfastTrainingStalled, a performance
 * fault), stack aggregation over every rank's faulthandler dumps finds the odd rank, and its node
 * is over-evicted like a machine fault. Needs a lab of at least 3 compute nodes (with 2 ranks the
 * odd stack is a tie) and a short stalled-progress bound (ProtectedLabOptions.noProgressSeconds).
 */
export async function runHang(lab: ProtectedLab, rank = 1): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  if (lab.computeNodes.length < 3)
    problems.push(`the lab has ${lab.computeNodes.length} compute nodes: stack aggregation needs at least 3 ranks to tell the odd one`);
  if (lab.options.noProgressSeconds === undefined) problems.push('the lab runs the shipped 600 s stalled-progress bound (noProgressSeconds not set)');
  const { run: before } = await waitForTraining(
    lab,
    (lab.log.iterations(lab.log.runs().at(-1), 0).at(0)?.iteration ?? 0) + 2 * (lab.options.checkpointEvery ?? 10),
  );
  const known = lab.log.runs();
  const startRecord = await lab.jobRecord();
  const victim = startRecord.nodes[rank] ?? '';
  const standbys = await lab.controller.backend.standbys();
  const t0 = Date.now();
  const deadline = recoveryDeadline(t0);
  triggerRankHang(lab.paths, rank);

  const relaunched = await waitForNewRun(lab, known, deadline);
  if (relaunched === undefined) problems.push(`no run trained after the hang within ${RECOVERY_TIMEOUT_MS / 1000} s of the fault`);
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push('the ladder did not see training progress again');

  const all = await lab.audit();
  const entries = entriesSince(all, t0, job);
  const signal = all.find((entry) => Date.parse(entry.time) >= t0 && entry.type === 'signal' && /SteadfastTrainingStalled/.test(entry.summary));
  const analyze = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: analyze_stacks`));
  // Every rank's stalled alert asks for an aggregation; the one running answers for the rest.
  const aggregations = entries.filter((entry) => entry.type === 'action' && entry.summary.startsWith(`${job}: stacks:`));
  const aggregated = aggregations.find((entry) => /flagged in/.test(entry.summary)) ?? aggregations[0];
  const joined = aggregations.filter((entry) => /already running/.test(entry.summary)).length;
  // The last step every rank of the hung run logged, and when: the stall began after it.
  const stalledAt = lab.log.iterations(before, 0).at(-1);
  const hungStack = stackDumps(lab, rank).some((text) => text.includes('lab_hang_before_allreduce'));

  if (!signal) problems.push('no SteadfastTrainingStalled signal in the audit');
  if (!analyze) problems.push('no stack analysis decision');
  if (!aggregated) problems.push('no stack aggregation on the record');
  else if (!aggregated.summary.includes(victim)) problems.push(`the stack aggregation did not name ${victim}: ${aggregated.summary}`);
  if (!hungStack) problems.push(`no faulthandler dump of rank ${rank} shows lab_hang_before_allreduce`);
  const { decision, stopped, drained, activated, restarted, standby, record, fresh, resumption } = await judgeEviction(
    lab,
    entries,
    { victim, before, relaunched, standbys, what: 'hung' },
    problems,
  );
  const timeline = [
    step(`rank ${rank} on ${victim} made to hang before its next all-reduce (lab_hang_before_allreduce)`, t0, t0, ''),
    step(`the last iteration of run ${before}: step ${stalledAt?.iteration ?? '?'}`, stalledAt?.seenAt, t0, 'rank 0 waits in the all-reduce from here'),
    step('detected: SteadfastTrainingStalled through Alertmanager', receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: stack aggregation (performance fault)', at(analyze), t0, analyze?.summary ?? ''),
    step(
      `stacks aggregated over rounds: the odd rank's node ${victim}`,
      at(aggregated),
      t0,
      `${aggregated?.summary ?? ''}${joined > 0 ? ` (${joined} more request${joined === 1 ? '' : 's'} joined it)` : ''}`,
    ),
    step('decided: stop, evict, restart', at(decision), t0, decision?.summary ?? ''),
    step(`stopped: run ${before} cancelled and gone`, at(stopped), t0, stopped?.summary ?? ''),
    step(`${victim} drained`, at(drained), t0, drained?.summary ?? ''),
    step(`standby ${standby ?? '?'} activated in its place`, at(activated), t0, activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${fresh?.nodes ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
  ];
  return report(lab, 'hang', t0, resumption, [before, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}

export const SCENARIOS: Readonly<Record<ScenarioName, (lab: ProtectedLab) => Promise<ScenarioReport>>> = {
  'machine-fault': runMachineFault,
  'bad-code': runBadCode,
  crash: runCrash,
  hang: runHang,
  'fail-slow': runFailSlow,
  'hot-swap': runHotSwap,
  'hot-swap-spare-dies': runHotSwapSpareDies,
  'foreign-drain': runForeignDrain,
  preflight: runPreflight,
};

/**
 * Scenarios that need a lab of their own: the hang needs 3 ranks (with 2 the odd stack is a tie)
 * and a short stalled-progress bound, which the others must not have (a relaunch is a pause of
 * several seconds too); fail-slow needs the job registered with micro-batches and fail-slow
 * checks and costs at the lab's pace, which would make the others' relaunch pauses look like
 * slow-downs; the hot swap needs spare nodes in the job's allocation and a rendezvous store (both
 * of its cases share one lab).
 */
export const OWN_LAB: Readonly<Partial<Record<ScenarioName, ProtectedLabOptions>>> = {
  hang: { nodes: 3, standbys: 1, noProgressSeconds: 10 },
  'fail-slow': FAIL_SLOW_LAB,
  // One lab for both hot-swap cases: its job has a spare for each.
  'hot-swap': HOT_SWAP_LAB,
  'hot-swap-spare-dies': HOT_SWAP_LAB,
  // GPU resets on, and it leaves two nodes drained by "administrators".
  'foreign-drain': FOREIGN_DRAIN_LAB,
  // Four nodes, a standby, the preflight before every run and one node's link slowed from lab up.
  preflight: PREFLIGHT_LAB,
};

/**
 * The labs to run `names` on, in order: the scenarios sharing the default lab (2 nodes, 2
 * standbys) in the order given, then each that needs a lab of its own (OWN_LAB).
 */
export function scenarioLabs(names: readonly ScenarioName[]): { options: ProtectedLabOptions; names: ScenarioName[] }[] {
  const shared = names.filter((name) => OWN_LAB[name] === undefined);
  const own: { options: ProtectedLabOptions; names: ScenarioName[] }[] = [];
  for (const name of names) {
    const options = OWN_LAB[name];
    if (options === undefined) continue;
    // Scenarios naming the same lab share one, in the order given.
    const group = own.find((candidate) => candidate.options === options);
    if (group) group.names.push(name);
    else own.push({ options, names: [name] });
  }
  return [...(shared.length > 0 ? [{ options: {}, names: shared }] : []), ...own];
}

/** Runs scenarios one after the other on one lab; a scenario that throws is reported as not recovered. */
export async function runScenarios(
  lab: ProtectedLab,
  names: readonly ScenarioName[],
  onReport: (report: ScenarioReport) => void = () => undefined,
): Promise<ScenarioReport[]> {
  const reports: ScenarioReport[] = [];
  for (const name of names) {
    let result: ScenarioReport;
    try {
      result = await SCENARIOS[name](lab);
    } catch (error) {
      result = {
        name,
        recovered: false,
        recoverySeconds: null,
        resumedFromStep: null,
        lostIterations: null,
        slurmJobIds: lab.log.runs(),
        timeline: [],
        problems: [errorMessage(error)],
      };
    }
    reports.push(result);
    onReport(result);
  }
  return reports;
}
