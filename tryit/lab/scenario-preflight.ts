import { z } from 'zod';
import { expandHostlist } from '../../actuators/hostlist.js';
import { clearNodeLink, nodeLinkQdisc } from './network.js';
import type { ProtectedLab } from './protected.js';
import type { ProtectedLabOptions } from './protected-options.js';
import {
  RECOVERY_TIMEOUT_MS,
  at,
  entriesSince,
  firstStep,
  receivedAt,
  recoveryDeadline,
  report,
  step,
  timeLeft,
  until,
  waitForNewRun,
  waitForRunning,
  type Resumption,
  type ScenarioReport,
} from './scenario-support.js';

/**
 * The lab the scenario needs: four compute nodes (pairwise tests need partners a bad node is not
 * in), one warm standby, every run of the job preceded by the preflight, and from lab up what the
 * third node sends held to 16 Mbit/s (tc tbf on its veth). The threshold, 0.25 s for an
 * all-reduce of 1 MiB, is far above what a healthy pair takes on the lab's veths and below what
 * any pair with the slowed node takes (its half of the exchange, 1 MiB, needs 0.5 s at 16 Mbit/s).
 */
export const PREFLIGHT_LAB: ProtectedLabOptions = { nodes: 4, standbys: 1, preflight: { slowNode: 2, rateMbit: 16, thresholdSeconds: 0.25 } };

/** The part of steadfast_preflight.py's JSON summary the scenario reads. */
const summarySchema = z
  .object({
    exitCode: z.number(),
    bad: z.array(z.string()).default([]),
    nodes: z.array(z.string()).default([]),
    seconds: z.number().optional(),
    rendezvousSeconds: z.number().optional(),
    allreduceSeconds: z.number().optional(),
    bisectSeconds: z.number().optional(),
    allreduce: z.object({ seconds: z.number().nullable() }).loose().optional(),
    rounds: z.array(z.unknown()).default([]),
    reported: z.boolean().optional(),
    error: z.string().optional(),
  })
  .loose();
type PreflightSummary = z.infer<typeof summarySchema>;

/** The first preflight summary a run printed (every node prints one; they agree), with when it appeared. */
function summaryOf(lab: ProtectedLab, run: string): { summary: PreflightSummary; seenAt: number } | undefined {
  const line = lab.log.find(run, /^\[preflight\] \{/);
  if (line === undefined) return undefined;
  const parsed = summarySchema.safeParse(JSON.parse(line.text.slice('[preflight] '.length)));
  return parsed.success ? { summary: parsed.data, seenAt: line.seenAt } : undefined;
}

function describe(summary: PreflightSummary | undefined): string {
  if (summary === undefined) return '';
  const named = summary.bad.length > 0 ? `named ${summary.bad.join(', ')} in ${summary.rounds.length} rounds` : 'passed';
  return `${named}, exit ${summary.exitCode}: rendezvous ${summary.rendezvousSeconds ?? '?'} s, all-reduce ${summary.allreduceSeconds ?? '?'} s (slowest ${summary.allreduce?.seconds ?? '?'} s each), bisection ${summary.bisectSeconds ?? '?'} s, ${summary.seconds ?? '?'} s in all${summary.error ? `; ${summary.error}` : ''}`;
}

/**
 * A bad link among four nodes, found before the job's first iteration: the job's first run starts
 * with its preflight (train.sbatch, STEADFAST_ALLREDUCE_CHECK=1); the all-reduce across the four nodes
 * is slow, the pairwise bisection names the slowed node, a healthy node reports it to the
 * controller (POST /api/v1/jobs/:id/preflight), and the run exits 10. The controller evicts the
 * node as a machine fault — drained with a preflight reason, the warm standby in its place — and
 * relaunches the job, whose preflight passes and which trains on the three others and the standby.
 */
export async function runPreflight(lab: ProtectedLab): Promise<ScenarioReport> {
  const problems: string[] = [];
  const job = lab.job;
  const slowed = lab.linkSlowed;
  if (slowed === undefined) throw new Error('the lab slowed no link: start it with PREFLIGHT_LAB');
  const victim = slowed.node;
  const t0 = slowed.at;
  const deadline = recoveryDeadline(t0);
  const standbys = await lab.controller.backend.standbys();
  const qdisc = await nodeLinkQdisc(lab.node(victim)).catch((error: unknown) => String(error));

  const first = await until(
    () => lab.log.runs()[0],
    (run) => run !== undefined,
    timeLeft(deadline),
    100,
  );
  if (first === undefined) throw new Error(`the job's first run did not start within ${RECOVERY_TIMEOUT_MS / 1000} s`);
  const started = lab.log.find(first, /^\[train\.sbatch\] Slurm job/);
  const named = await until(
    () => summaryOf(lab, first),
    (found) => found !== undefined,
    timeLeft(deadline),
    100,
  );
  const relaunched = await waitForNewRun(lab, [first], deadline);
  if (relaunched === undefined) problems.push(`no run trained after the preflight within ${RECOVERY_TIMEOUT_MS / 1000} s of the slowed link`);
  const runningAt = await waitForRunning(lab, (record) => !record.nodes.includes(victim), deadline);
  if (runningAt === undefined) problems.push(`the ladder did not see training progress on nodes without ${victim}`);
  const passed = relaunched === undefined ? undefined : summaryOf(lab, relaunched);

  const all = await lab.audit();
  const entries = entriesSince(all, t0, job);
  const signal = entries.find((entry) => entry.type === 'signal' && entry.node === victim && /preflight_failed/.test(entry.summary));
  const action = (prefix: string) => entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(prefix));
  const decision = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: evict`));
  const stopped = action(`${job}: stop: done`);
  const drained = action(`${job}: evict ${victim}: done`);
  const activated = entries.find((entry) => entry.type === 'action' && /: evict \S+: done \(standby \S+ activated/.test(entry.summary));
  const restarted = action(`${job}: restart: done`);
  const standby = /standby (\S+) activated/.exec(activated?.summary ?? '')?.[1];
  const sinfo = await lab.sinfo(victim);
  const record = await lab.jobRecord();
  const firstRun = await lab.slurmJob(first).catch(() => undefined);
  const fresh = relaunched === undefined ? undefined : await lab.slurmJob(relaunched).catch(() => undefined);

  if (named === undefined) problems.push(`run ${first} printed no preflight summary`);
  else {
    if (named.summary.bad.join(',') !== victim)
      problems.push(`the preflight of run ${first} named ${named.summary.bad.join(', ') || 'no node'}, not ${victim}`);
    if (named.summary.exitCode !== 10) problems.push(`the preflight of run ${first} exited ${named.summary.exitCode}, not 10 (bad nodes named)`);
    if (named.summary.reported !== true) problems.push(`the preflight of run ${first} did not report to the controller`);
  }
  if (!signal) problems.push(`no preflight_failed signal for ${victim} in the audit`);
  else if (!/machine fault/.test(signal.summary)) problems.push(`the preflight's report was not taken as a machine fault: ${signal.summary}`);
  if (!decision) problems.push('no eviction decision');
  if (!/^drain/.test(sinfo.state) || !/preflight/.test(sinfo.reason))
    problems.push(`${victim} is ${sinfo.state} "${sinfo.reason}" in sinfo, not drained for the preflight`);
  if (standby === undefined || !standbys.includes(standby)) problems.push(`no warm standby from the reservation (${standbys.join(', ')}) was activated`);
  else if (!record.nodes.includes(standby)) problems.push(`the job runs on ${record.nodes.join(', ')}, without standby ${standby}`);
  if (firstRun && /COMPLETED/.test(firstRun.state)) problems.push(`run ${first} ended COMPLETED: the controller would take the job for finished`);
  const freshNodes = fresh ? expandHostlist(fresh.nodes) : [];
  if (fresh && (freshNodes.includes(victim) || (standby !== undefined && !freshNodes.includes(standby))))
    problems.push(`run ${relaunched ?? ''} runs on ${fresh.nodes}`);
  if (relaunched !== undefined && passed?.summary.exitCode !== 0)
    problems.push(`the preflight of run ${relaunched} did not pass: ${describe(passed?.summary)}`);

  const firstIteration = relaunched === undefined ? undefined : lab.log.iterations(relaunched, 0)[0];
  const resumed = relaunched === undefined ? undefined : lab.log.resumedFrom(relaunched);
  // The first run never trained: there is nothing to resume, and nothing is lost.
  const resumption: Resumption = {
    resumedFrom: resumed?.step ?? null,
    source: resumed?.step == null ? 'start: the first run never trained, no checkpoint' : resumed.source,
    firstIteration,
    lossBefore: undefined,
    lostIterations: 0,
    problems: [],
  };
  await clearNodeLink(lab.node(victim));
  const timeline = [
    step(`${victim}'s link slowed at lab up: what it sends held to ${lab.options.preflight?.rateMbit ?? '?'} Mbit/s`, t0, t0, qdisc),
    step(`run ${first} started on ${lab.computeNodes.map((node) => node.name).join(', ')}: its preflight first`, started?.seenAt, t0, started?.text ?? ''),
    step(`preflight of run ${first}: the all-reduce was slow, the bisection named ${victim}`, named?.seenAt, t0, describe(named?.summary)),
    step("detected: the preflight's report stored by the controller", receivedAt(signal), t0, signal?.summary ?? ''),
    step('decided: stop, evict, restart', at(decision), t0, decision?.summary ?? ''),
    step(`stopped: run ${first} gone`, at(stopped), t0, stopped?.summary ?? ''),
    step(`${victim} drained`, at(drained), t0, `sinfo: ${sinfo.state} "${sinfo.reason}"`),
    step(`standby ${standby ?? '?'} activated in its place`, at(activated), t0, activated?.summary ?? ''),
    step(`relaunched with sbatch: run ${relaunched ?? '?'} on ${fresh?.nodes ?? '?'}`, at(restarted), t0, restarted?.summary ?? ''),
    step(`preflight of run ${relaunched ?? '?'} passed`, passed?.seenAt, t0, describe(passed?.summary)),
    firstStep(resumption, relaunched, t0),
    step('the ladder saw training progress: running', runningAt, t0, `nodes ${record.nodes.join(', ')}`),
  ];
  return report(lab, 'preflight', t0, resumption, [first, ...(relaunched === undefined ? [] : [relaunched])], timeline, problems);
}
