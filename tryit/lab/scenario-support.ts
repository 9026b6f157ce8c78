import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { expandHostlist } from '../../actuators/hostlist.js';
import type { AuditEntry } from '../../core/audit.js';
import { errorMessage } from '../../core/errors.js';
import type { ProtectedLab } from './protected.js';
import type { Iteration } from './training.js';

/**
 * What the lab's scenarios share: their report and timeline, waiting on the job's own log and on
 * the controller, and judging where a relaunched run resumed against the run it replaced.
 */

export interface TimelineStep {
  readonly label: string;
  /** Milliseconds after the fault was injected; null when it never happened. */
  readonly afterMs: number | null;
  readonly detail: string;
}

export interface ScenarioReport {
  readonly name: string;
  readonly recovered: boolean;
  /** From the fault to the relaunched run's first iteration. */
  readonly recoverySeconds: number | null;
  readonly resumedFromStep: number | null;
  /** Iterations the interrupted run had done past the step it resumed from. */
  readonly lostIterations: number | null;
  /** Every Slurm run of the job in the scenario, in order. */
  readonly slurmJobIds: string[];
  /** Hot swap: iterations completed before the fault and executed again after it. */
  readonly reexecutedIterations?: number | null;
  /** Hot swap: rank processes started anew after the fault (a spare taking a shard is not one). */
  readonly ranksRestarted?: number;
  /** Hot swap: rank 0's losses at the first steps after the swap equal an unfaulted run's (within 1e-6). */
  readonly lossMatches?: boolean;
  readonly timeline: TimelineStep[];
  /** Why it does not count as recovered; empty when it does. */
  readonly problems: string[];
  /**
   * When it did not recover: what the lab looked like as it was judged (the job's record and
   * Slurm queue, the audit since the fault, the job log's tail, the controller's warnings), so
   * that a failed run says where recovery stopped.
   */
  readonly context?: string[];
}

/**
 * How long a scenario may take from the fault to the ladder calling the job healthy again: every
 * wait after the fault shares this one deadline, so a scenario that does not recover is reported,
 * with its context, before a test's own timeout could cut it short.
 */
export const RECOVERY_TIMEOUT_MS = 180_000;

/** The deadline of a scenario whose fault was injected at `t0`. */
export const recoveryDeadline = (t0: number): number => t0 + RECOVERY_TIMEOUT_MS;

/** Milliseconds left before `deadline`, never negative. */
export const timeLeft = (deadline: number): number => Math.max(0, deadline - Date.now());

export async function until<T>(read: () => Promise<T> | T, ok: (value: T) => boolean, timeoutMs: number, intervalMs = 200): Promise<T | undefined> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const value = await read();
      if (ok(value)) return value;
    } catch {
      // A part answering late (Slurm busy, Redis reconnecting) is asked again.
    }
    if (Date.now() >= deadline) return undefined;
    await sleep(intervalMs);
  }
}

/** The run training now: the newest run in the log, once rank 0 has logged `minIteration`. */
export async function waitForTraining(lab: ProtectedLab, minIteration: number, timeoutMs = 120_000): Promise<{ run: string; iteration: Iteration }> {
  const found = await until(
    () => {
      const run = lab.log.runs().at(-1);
      const last = run === undefined ? undefined : lab.log.iterations(run, 0).at(-1);
      return run !== undefined && last !== undefined ? { run, iteration: last } : undefined;
    },
    (value) => value !== undefined && value.iteration.iteration >= minIteration,
    timeoutMs,
  );
  if (!found)
    throw new Error(
      `the job did not train to iteration ${minIteration} within ${timeoutMs / 1000} s; log tail:\n${lab.log.lines
        .slice(-20)
        .map((line) => line.text)
        .join('\n')}`,
    );
  return found;
}

export const at = (entry: AuditEntry | undefined): number | undefined => (entry === undefined ? undefined : Date.parse(entry.time));

/** What the interrupted run and the relaunched run wrote, compared. */
export interface Resumption {
  readonly resumedFrom: number | null;
  readonly source: string;
  readonly firstIteration: Iteration | undefined;
  /** The interrupted run's loss at the relaunched run's first step, when it got that far. */
  readonly lossBefore: number | undefined;
  readonly lostIterations: number | null;
  readonly problems: string[];
}

/**
 * The relaunched run must resume from the newest step every rank of the interrupted run saved,
 * train the step after it first, and have there the loss the interrupted run had at that step
 * (the data of a step is seeded by step and rank, and the weights and optimizer come from the
 * checkpoint, so the same step gives the same loss): the run went on, it did not start over.
 */
export function judgeResumption(lab: ProtectedLab, interrupted: readonly string[], relaunched: string): Resumption {
  const problems: string[] = [];
  const saved = new Map<number, Set<string>>();
  for (const line of lab.log.lines) {
    if (!interrupted.includes(line.slurmJob)) continue;
    const match = /^\[rank (\d+)\] checkpoint step (\d+) saved/.exec(line.text);
    if (match) saved.set(Number(match[2]), new Set([...(saved.get(Number(match[2])) ?? []), match[1] ?? '']));
  }
  const ranks = lab.computeNodes.length;
  const newestComplete = Math.max(-1, ...[...saved].filter(([, by]) => by.size === ranks).map(([step]) => step));
  const resume = lab.log.resumedFrom(relaunched);
  const resumedFrom = resume?.step ?? null;
  if (resume === undefined) problems.push(`run ${relaunched} never said where it resumed`);
  else if (newestComplete >= 0 && resumedFrom !== newestComplete)
    problems.push(`run ${relaunched} resumed from ${resume.source} step ${String(resumedFrom)}, not from the newest complete checkpoint ${newestComplete}`);
  const firstIteration = lab.log.iterations(relaunched, 0)[0];
  if (resumedFrom !== null && firstIteration !== undefined && firstIteration.iteration !== resumedFrom + 1) {
    problems.push(`run ${relaunched} trained step ${firstIteration.iteration} first, not ${resumedFrom + 1}`);
  }
  const before = interrupted.flatMap((run) => lab.log.iterations(run, 0));
  const lastBefore = Math.max(0, ...before.map((step) => step.iteration));
  const same = firstIteration === undefined ? undefined : [...before].reverse().find((step) => step.iteration === firstIteration.iteration);
  if (firstIteration !== undefined) {
    // A step's loss is its rank's mean over the micro-batches it ran: comparable only at the same share.
    if (same !== undefined && same.microbatches === firstIteration.microbatches) {
      if (Math.abs(same.loss - firstIteration.loss) > 1e-4 * Math.max(1, Math.abs(same.loss))) {
        problems.push(`step ${firstIteration.iteration} had loss ${same.loss} before and ${firstIteration.loss} after the restart`);
      }
    } else {
      // Nothing to compare at the same step (the interrupted run stopped right after saving, or
      // ran another share): the run must at least not have started over. The start is the job's
      // own first step, not the interrupted run's, which may itself have resumed well trained.
      const start = lab.log.iterations(undefined, 0).find((step) => step.iteration === 1) ?? before[0];
      if (start !== undefined && firstIteration.loss > start.loss / 2)
        problems.push(`loss ${firstIteration.loss} after the restart is no better than at the start (${start.loss})`);
    }
  }
  return {
    resumedFrom,
    source: resume?.source ?? '',
    firstIteration,
    lossBefore: same !== undefined && same.microbatches === firstIteration?.microbatches ? same.loss : undefined,
    lostIterations: resumedFrom === null ? null : Math.max(0, lastBefore - resumedFrom),
    problems,
  };
}

/** The timeline's line for the relaunched run's first step: where it resumed and its loss against the interrupted run's. */
export function firstStep(resumption: Resumption | undefined, run: string | undefined, t0: number): TimelineStep {
  const first = resumption?.firstIteration;
  const loss =
    first === undefined
      ? ''
      : `; rank 0 loss ${first.loss}${resumption?.lossBefore === undefined ? '' : ` (the interrupted run had ${resumption.lossBefore} at this step)`}`;
  return step(
    `first iteration of run ${run ?? '?'}: step ${first?.iteration ?? '?'}`,
    first?.seenAt,
    t0,
    `resumed from the ${resumption?.source ?? '?'}${loss}`,
  );
}

/** Waits until the ladder calls the job healthy: running again, on the nodes and version `ok` wants. */
export async function waitForRunning(
  lab: ProtectedLab,
  ok: (job: { state: string; nodes: string[]; version: string }) => boolean,
  deadline: number,
): Promise<number | undefined> {
  const seen = await until(
    () => lab.jobRecord(),
    (job) => job.state === 'running' && ok(job),
    timeLeft(deadline),
    250,
  );
  return seen === undefined ? undefined : Date.now();
}

/** A run not among `known`, once its rank 0 logged an iteration. */
export async function waitForNewRun(lab: ProtectedLab, known: readonly string[], deadline: number): Promise<string | undefined> {
  return until(
    () => lab.log.runs().find((run) => !known.includes(run) && lab.log.iterations(run, 0).length > 0),
    (run) => run !== undefined,
    timeLeft(deadline),
    100,
  );
}

export function step(label: string, time: number | undefined, t0: number, detail = ''): TimelineStep {
  return { label, afterMs: time === undefined ? null : Math.max(0, time - t0), detail };
}

/**
 * The scenario's report; one that did not recover carries the lab's context (`since`: when the
 * scenario injected its fault, `t0` when that is the moment recovery is counted from).
 */
export async function report(
  lab: ProtectedLab,
  name: string,
  t0: number,
  resumption: Resumption | undefined,
  runs: string[],
  timeline: TimelineStep[],
  problems: string[],
  since = t0,
): Promise<ScenarioReport> {
  const first = resumption?.firstIteration;
  const all = [...problems, ...(resumption?.problems ?? [])];
  const judged: ScenarioReport = {
    name,
    recovered: all.length === 0,
    recoverySeconds: first === undefined ? null : Math.round((first.seenAt - t0) / 100) / 10,
    resumedFromStep: resumption?.resumedFrom ?? null,
    lostIterations: resumption?.lostIterations ?? null,
    slurmJobIds: runs,
    timeline,
    problems: all,
  };
  return judged.recovered ? judged : { ...judged, context: await labContext(lab, since) };
}

/** What the lab looks like now, for a scenario that did not recover; a part that cannot be read says so. */
async function labContext(lab: ProtectedLab, since: number): Promise<string[]> {
  const lines: string[] = [];
  const offset = (time: number): string => `+${Math.round(time - since)} ms`;
  const attempt = async (what: string, read: () => Promise<string[]>): Promise<void> => {
    try {
      lines.push(...(await read()));
    } catch (error) {
      lines.push(`${what}: could not be read: ${errorMessage(error)}`);
    }
  };
  await attempt('job record', async () => {
    const record = await lab.jobRecord();
    return [`job record: ${record.state} on ${record.nodes.join(',')}, version ${record.version}`];
  });
  await attempt('Slurm queue', async () => [`Slurm runs queued or running: ${(await lab.queued()).join(', ') || 'none'}`]);
  await attempt('audit', async () => {
    const entries = entriesSince(await lab.audit(), since, lab.job).sort((a, b) => Date.parse(a.time) - Date.parse(b.time));
    return [
      `audit since the fault (${entries.length} entries, the last ${Math.min(entries.length, CONTEXT_LINES)}):`,
      ...entries.slice(-CONTEXT_LINES).map((entry) => `  ${offset(Date.parse(entry.time))} ${entry.type}: ${entry.summary.slice(0, 300)}`),
    ];
  });
  // A scrape that fails or times out hides a node's series (the progress check then waits on the fast path alone).
  await attempt('Prometheus targets', async () => {
    const response = await fetch(`${lab.prometheus.url}/api/v1/targets?state=active`, { signal: AbortSignal.timeout(5000) });
    const body = (await response.json()) as {
      data: { activeTargets: { labels: Record<string, string>; health: string; lastError: string; lastScrapeDuration: number }[] };
    };
    return [
      'Prometheus targets:',
      ...body.data.activeTargets.map(
        (target) =>
          `  ${target.labels.job ?? '?'} ${target.labels.node ?? target.labels.instance ?? '?'}: ${target.health}, last scrape ${Math.round(target.lastScrapeDuration * 1000)} ms${target.lastError ? `, ${target.lastError.slice(0, 200)}` : ''}`,
      ),
    ];
  });
  lines.push(
    `job log, the last ${CONTEXT_LINES} lines:`,
    ...lab.log.lines.slice(-CONTEXT_LINES).map((line) => `  [${line.slurmJob}] ${line.text.slice(0, 300)}`),
  );
  const controllerLog = lab.controllerLogPath;
  if (controllerLog !== undefined) {
    await attempt('controller log', async () => {
      const warnings = (await readFile(controllerLog, 'utf8')).split('\n').flatMap((line) => {
        try {
          const entry = JSON.parse(line) as { level?: number; time?: number; msg?: string; err?: { message?: string } };
          return (entry.level ?? 0) >= 40 && (entry.time ?? 0) >= since
            ? [`  ${offset(entry.time ?? since)} ${entry.msg ?? ''}${entry.err?.message ? `: ${entry.err.message}` : ''}`.slice(0, 300)]
            : [];
        } catch {
          return [];
        }
      });
      return [
        `controller warnings since the fault (${warnings.length}, the last ${Math.min(warnings.length, CONTEXT_LINES)}):`,
        ...warnings.slice(-CONTEXT_LINES),
      ];
    });
  }
  return lines;
}

const CONTEXT_LINES = 20;

/** Newer audit entries of this job's recovery, or of its nodes' signals. */
export function entriesSince(entries: AuditEntry[], t0: number, job: string): AuditEntry[] {
  return entries.filter((entry) => Date.parse(entry.time) >= t0 - 1000 && (entry.summary.startsWith(`${job}:`) || entry.summary.includes(`job ${job}`)));
}

export const receivedAt = (entry: AuditEntry | undefined): number | undefined => {
  const signal = entry?.data?.signal as { receivedAt?: string } | undefined;
  return signal?.receivedAt === undefined ? at(entry) : Date.parse(signal.receivedAt);
};

/**
 * What an eviction onto a warm standby left on the record, and what is wrong with it: the
 * decision, the stop (the old run cancelled), the drain, a standby from the reservation in the
 * job and in the relaunched run, the victim not in it, and where the new run resumed.
 */
export async function judgeEviction(
  lab: ProtectedLab,
  entries: AuditEntry[],
  scenario: {
    readonly victim: string;
    readonly before: string;
    readonly relaunched: string | undefined;
    readonly standbys: readonly string[];
    readonly what: string;
  },
  problems: string[],
): Promise<{
  decision: AuditEntry | undefined;
  stopped: AuditEntry | undefined;
  drained: AuditEntry | undefined;
  activated: AuditEntry | undefined;
  restarted: AuditEntry | undefined;
  standby: string | undefined;
  record: { state: string; nodes: string[]; version: string };
  fresh: { state: string; nodes: string; exitCode: string } | undefined;
  resumption: Resumption | undefined;
}> {
  const { victim, before, relaunched, standbys } = scenario;
  const job = lab.job;
  const action = (prefix: string): AuditEntry | undefined => entries.find((entry) => entry.type === 'action' && entry.summary.startsWith(prefix));
  const decision = entries.find((entry) => entry.type === 'decision' && entry.summary.startsWith(`${job}: evict`));
  const stopped = action(`${job}: stop: done`);
  const drained = action(`${job}: evict ${victim}: done`);
  const activated = entries.find((entry) => entry.type === 'action' && /: evict \S+: done \(standby \S+ activated/.test(entry.summary));
  const restarted = action(`${job}: restart: done`);
  const standby = /standby (\S+) activated/.exec(activated?.summary ?? '')?.[1];
  const record = await lab.jobRecord();
  const old = await lab.slurmJob(before).catch(() => ({ state: 'unknown', nodes: '', exitCode: '' }));
  const fresh = relaunched === undefined ? undefined : await lab.slurmJob(relaunched).catch(() => undefined);

  if (!decision) problems.push('no eviction decision');
  if (!/CANCELLED/.test(old.state)) problems.push(`the ${scenario.what} run ${before} is ${old.state}, not cancelled`);
  if (standby === undefined || !standbys.includes(standby)) problems.push(`no warm standby from the reservation (${standbys.join(', ')}) was activated`);
  else if (!record.nodes.includes(standby)) problems.push(`the job runs on ${record.nodes.join(', ')}, without standby ${standby}`);
  const freshNodes = fresh ? expandHostlist(fresh.nodes) : [];
  if (fresh && (freshNodes.includes(victim) || (standby !== undefined && !freshNodes.includes(standby))))
    problems.push(`run ${relaunched ?? ''} runs on ${fresh.nodes}`);
  const resumption = relaunched === undefined ? undefined : judgeResumption(lab, [before], relaunched);
  return { decision, stopped, drained, activated, restarted, standby, record, fresh, resumption };
}

/**
 * Where a fault on a job's node starts from: the job trained past two checkpoints, the runs seen
 * so far, the job's record, its first node (the victim) and the standbys held.
 */
export async function beforeNodeFault(
  lab: ProtectedLab,
): Promise<{ before: string; known: string[]; startRecord: { state: string; nodes: string[]; version: string }; victim: string; standbys: string[] }> {
  const { run: before } = await waitForTraining(lab, 2 * (lab.options.checkpointEvery ?? 10) + 3);
  const known = lab.log.runs();
  const startRecord = await lab.jobRecord();
  return { before, known, startRecord, victim: startRecord.nodes[0] ?? '', standbys: await lab.controller.backend.standbys() };
}
