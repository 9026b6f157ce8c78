import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { PrometheusFeatureSource, type FeatureReading, type FeatureSource } from '../analyzers/multisignal/source.js';
import { jobSpecSchema, type JobSpec } from '../core/job.js';
import type { Signal } from '../core/signal.js';
import { instantQuery } from '../core/prometheus.js';
import { agentSelector, newEvents } from '../core/promql.js';
import { DEFAULT_WATCH_WARMUP, SuspectWatch } from '../analyzers/workers/suspect-watch.js';
import { ProcessGroup } from '../tryit/processes.js';
import { backfillFleet, startPrometheusOn } from './heldout/backfill.js';
import { DAY, DEFAULT_SHAPE, HOUR, MINUTE, jobsAt, planFleet, type FaultLabel, type FleetPlan } from './heldout/fleet.js';
import { GRACE_MS, benignAround, benignCounts, leadText, score, type Raise, type Score } from './heldout/score.js';
import { fleetFromEnv } from './heldout/variant.js';

/**
 * The held-out evaluation of the multi-signal detector (bench/heldout/README.md): a labelled
 * 64-node fleet generated from a fixed seed — fleet 1 by default, fleet 2 or 3 with
 * STEADFAST_BENCH_HELDOUT_FLEET (bench/heldout/variant.ts) — backfilled into the real Prometheus, and read back
 * the way steadfast reads it in production — the controller's SuspectWatch every 60 s through
 * PrometheusFeatureSource, per registered job and over the whole fleet — and, for every fault,
 * `steadfast detect suspects` over the 15 minutes around its failure. The baseline in the same
 * run is "any new Xid in the last 5 minutes", asked of the same Prometheus.
 */

const run = promisify(execFile);
/** STEADFAST_BENCH_HELDOUT_FLEET: 1 (the default) or 2 (both have guided detector changes), or 3 (held out). */
const FLEET = fleetFromEnv(process.env.STEADFAST_BENCH_HELDOUT_FLEET);
const DAYS = Number(process.env.STEADFAST_BENCH_HELDOUT_DAYS ?? DEFAULT_SHAPE.days);
/** The watch's first evaluation comes two hours into the data, so that its warm-up (DEFAULT_WATCH_WARMUP) finds two hours of history, as on a cluster Prometheus has watched for a while. */
const WARM_UP_MS = DEFAULT_WATCH_WARMUP.readings * DEFAULT_WATCH_WARMUP.everyMs;
const EVERY_MS = MINUTE;
/** STEADFAST_BENCH_HELDOUT_VERBOSE=1 lists every false episode with the detector's reasons. */
const VERBOSE = process.env.STEADFAST_BENCH_HELDOUT_VERBOSE === '1';
const REPO = resolve(import.meta.dirname, '../..');

/** Reads each time once, whichever watch asks first: both watches see the same matrix, as one controller would. */
class OncePerTime implements FeatureSource {
  private last: { time: number; reading: Promise<FeatureReading> } | undefined;
  constructor(private readonly source: FeatureSource) {}
  read(time: number): Promise<FeatureReading> {
    if (this.last?.time !== time) this.last = { time, reading: this.source.read(time) };
    return this.last.reading;
  }
}

function spec(name: string, nodes: readonly string[]): JobSpec {
  return jobSpecSchema.parse({ name, nodes, ranksPerNode: 8, launcher: 'slurm', codeVersion: 'heldout' });
}

async function replayOnline(plan: FleetPlan, url: string): Promise<{ perJob: Raise[]; fleet: Raise[]; xid: Raise[]; failures: Set<string>; readMs: number }> {
  const source = new OncePerTime(new PrometheusFeatureSource({ url }));
  const perJob: Raise[] = [];
  const fleet: Raise[] = [];
  const collect = (into: Raise[]) => async (signals: readonly Signal[]) => {
    for (const signal of signals) {
      const why = Object.entries(signal.evidence ?? {})
        .filter(([name]) => name.startsWith('feature.'))
        .map(([name, value]) => `${name.slice(8)} ${value}`)
        .join('; ');
      if (signal.node) into.push({ node: signal.node, time: Date.parse(signal.time), why });
    }
  };
  const jobWatch = new SuspectWatch({ source, enqueue: collect(perJob) });
  const fleetWatch = new SuspectWatch({ source, enqueue: collect(fleet) });
  const xidQuery = `sum by (node) (\n${newEvents(`steadfast_xid_errors_total${agentSelector()}`, '5m')}\n)`;
  const xid: Raise[] = [];
  const failures = new Set<string>();
  let readMs = 0;
  for (let time = plan.start + WARM_UP_MS; time < plan.end; time += EVERY_MS) {
    const started = performance.now();
    const reading = await source.read(time);
    readMs += performance.now() - started;
    for (const failure of reading.failures) failures.add(failure.message.split('\n')[0] ?? '');
    await jobWatch.run(
      jobsAt(plan, time).map((job) => spec(job.name, job.nodes)),
      time,
    );
    await fleetWatch.run([spec('fleet', Object.keys(reading.matrix))], time);
    for (const sample of await instantQuery(url, xidQuery, { time })) if (sample.labels.node && sample.value > 0) xid.push({ node: sample.labels.node, time });
    if ((time - plan.start) % (6 * HOUR) === 0)
      process.stderr.write(`bench: evaluated ${((time - plan.start) / HOUR).toFixed(0)} h of ${((plan.end - plan.start) / HOUR).toFixed(0)} h\n`);
  }
  return { perJob, fleet, xid, failures, readMs };
}

/** `steadfast detect suspects` over the 15 minutes ending GRACE_MS after the failure: does it name the node? */
async function cliFinds(plan: FleetPlan, url: string, fault: FaultLabel): Promise<boolean> {
  const job = fault.job ? jobsAt(plan, fault.failure - MINUTE).find((candidate) => candidate.name === fault.job) : undefined;
  const args = [
    join(REPO, 'bin/steadfast.js'),
    'detect',
    'suspects',
    '--prometheus',
    url,
    '--at',
    String((fault.failure + GRACE_MS) / 1000),
    '--minutes',
    '15',
  ];
  if (job) args.push('--nodes', job.nodes.join(','));
  const { stdout } = await run(process.execPath, args, { maxBuffer: 64 * 1024 * 1024 });
  const result = JSON.parse(stdout) as { suspects: { node: string }[] };
  return result.suspects.some((suspect) => suspect.node === fault.node);
}

function row(cells: readonly (string | number)[]): string {
  return `| ${cells.join(' | ')} |`;
}

function summary(name: string, result: Score): string {
  const percent = (count: number) => `${Math.round((100 * count) / Math.max(1, result.eligible))} %`;
  return row([
    name,
    `${result.found}/${result.eligible} (${percent(result.found)})`,
    `${result.foundBefore}/${result.eligible} (${percent(result.foundBefore)})`,
    result.medianLeadMinutes === undefined ? '—' : `${result.medianLeadMinutes.toFixed(0)} min`,
    result.falseEpisodes,
    result.falseEpisodesPerDay.toFixed(2),
  ]);
}

async function main(): Promise<void> {
  const start = Math.floor(Date.now() / DAY) * DAY - (Math.ceil(DAYS) + 1) * DAY;
  const plan = planFleet({ ...DEFAULT_SHAPE, seed: FLEET.seed, days: DAYS, start, variant: FLEET });
  const root = mkdtempSync(join(tmpdir(), 'steadfast-heldout-'));
  const group = new ProcessGroup();
  try {
    process.stderr.write(
      `bench: held-out fleet ${FLEET.id}: generating ${plan.nodes.length} nodes × ${plan.gpusPerNode} GPUs, ${DAYS} days at ${plan.stepMs / 1000} s, and backfilling …\n`,
    );
    const backfill = await backfillFleet(plan, root, join(root, 'data'));
    const prometheus = await startPrometheusOn(group, root, join(root, 'data'));
    process.stderr.write(`bench: ${backfill.samples} samples in Prometheus; replaying the detector every 60 s …\n`);
    const started = performance.now();
    const online = await replayOnline(plan, prometheus.url);
    const replaySeconds = (performance.now() - started) / 1000;
    const cli = new Map<string, boolean>();
    for (const fault of plan.faults) cli.set(fault.id, await cliFinds(plan, prometheus.url, fault));

    const evaluated = plan.end - plan.start - WARM_UP_MS;
    const onJobs = plan.faults.filter((fault) => fault.job !== undefined);
    const perJob = score(online.perJob, plan.faults, onJobs, evaluated);
    const fleet = score(online.fleet, plan.faults, plan.faults, evaluated);
    const xidOnJobs = score(online.xid, plan.faults, onJobs, evaluated);
    const xidAll = score(online.xid, plan.faults, plan.faults, evaluated);

    const lines = [
      `Held-out evaluation of the multi-signal detector on held-out fleet ${FLEET.id} (STEADFAST_BENCH_HELDOUT_FLEET=${FLEET.id}; seed ${plan.seed}; ${plan.nodes.length} nodes × ${plan.gpusPerNode} GPUs, ${DAYS} days at ${plan.stepMs / 1000} s, ${plan.jobs.length} jobs, ${plan.faults.length} labelled faults, ${plan.confusers.length} benign events)`,
      `generated and backfilled ${backfill.samples} samples in ${backfill.backfillSeconds.toFixed(0)} s (writing ${backfill.writeSeconds.toFixed(0)} s); replay ${replaySeconds.toFixed(0)} s (feature reads ${(online.readMs / 1000).toFixed(0)} s)`,
      '',
      row(['detector path', 'faults found', 'found before the failure', 'median lead', 'false episodes', 'false episodes / day (64 nodes)']),
      row(['---', '---', '---', '---', '---', '---']),
      summary('online, per job (controller SuspectWatch)', perJob),
      summary('baseline: new Xid in 5 min, same faults', xidOnJobs),
      summary('online, whole fleet as one group', fleet),
      summary('baseline: new Xid in 5 min, all faults', xidAll),
      '',
      `\`steadfast detect suspects\` (15 min ending ${GRACE_MS / MINUTE} min after each failure, --nodes of the job): ${[...cli.values()].filter(Boolean).length}/${plan.faults.length} faults named`,
      `targets: found ≥ 90 %, ≥ 60 % before the failure, ≤ 0.84 false episodes/day, never fewer found than the Xid baseline`,
      '',
      row(['fault', 'kind', 'node', 'job', 'precursor min', 'Xid', 'per job', 'fleet', 'Xid baseline', 'CLI window']),
      row(['---', '---', '---', '---', '---', '---', '---', '---', '---', '---']),
      ...plan.faults.map((fault) =>
        row([
          fault.id,
          fault.kind,
          fault.node,
          fault.job ?? 'idle',
          Math.round((fault.failure - fault.precursorStart) / MINUTE),
          fault.xid ?? '—',
          fault.job ? leadText(fault, perJob.outcomes.get(fault.id)) : 'n/a',
          leadText(fault, fleet.outcomes.get(fault.id)),
          leadText(fault, xidAll.outcomes.get(fault.id)),
          cli.get(fault.id) ? 'yes' : 'no',
        ]),
      ),
      '',
      'minutes relative to the failure: −m raised m minutes before it, +m after, — not raised',
      '',
      `false episodes by the benign event on their node (bench/heldout/score.ts benignAround): per job ${benignCounts(plan.confusers, perJob.falseStarts)}; whole fleet ${benignCounts(plan.confusers, fleet.falseStarts)}`,
    ];
    if (VERBOSE) {
      for (const [name, result] of [
        ['per job', perJob],
        ['whole fleet', fleet],
      ] as const) {
        lines.push(
          '',
          `false episodes, ${name}:`,
          ...result.falseStarts.map(
            (raise) =>
              `  ${new Date(raise.time).toISOString()} ${raise.node} [${benignAround(plan.confusers, raise).join(', ') || 'no benign event'}]: ${raise.why ?? ''}`,
          ),
        );
      }
    }
    if (online.failures.size > 0) lines.push('', `feature queries that failed: ${[...online.failures].join('; ')}`);
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    await group.stopAll();
    rmSync(root, { recursive: true, force: true });
  }
}

await main();
