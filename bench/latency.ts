import { Queue } from 'bullmq';
import { cpus, loadavg, totalmem } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import type { AuditEntry } from '../core/audit.js';
import { QUEUE_NAMES, type SignalJob, type StepsJob } from '../core/queues.js';
import { SimEnvironment } from '../tryit/environment.js';
import { runFallenOffBus, type ScenarioResult } from '../tryit/scenario.js';
import { quantile } from './stats.js';

/**
 * Fault → drain latency on the real parts, for the agent fast path and for the Prometheus path
 * (scrape → rule → Alertmanager → webhook), each over INJECTIONS faults on distinct nodes.
 * The Prometheus path runs with 1 s scrape and evaluation intervals and group_wait 0s.
 */

const INJECTIONS = Number(process.env.STEADFAST_BENCH_INJECTIONS ?? 12);

/**
 * The fast path's phases, each the time after the injection it was reached, from what the parts
 * already record: the agent's event time (taken as it read the line), the controller's receipt
 * time (signal.receivedAt), the signal batch's BullMQ job (created as the intake stores it,
 * processedOn as the policy worker takes it), and the audit entries' stream ids. Only the POST's
 * start has no record of its own: the agents run in this process, so their fetch is watched.
 */
const PHASES = [
  ['read', 'agent read the kernel-log line (event time)'],
  ['sent', 'fast-path POST sent (agent fetch)'],
  ['received', 'controller received it (signal.receivedAt)'],
  ['stored', 'intake stores it (signal batch job created)'],
  ['taken', 'policy worker took the batch (job processedOn)'],
  ['audited', 'signal audited'],
  ['decided', 'decision audited'],
  ['queued', 'transition queued on steps (its job created)'],
  ['picked', 'step processor took it (job processedOn)'],
  ['started', 'drain command started (action running)'],
  ['done', 'drain done and verified (action done)'],
  ['seen', 'Slurm shows the node drained (bench poll, every 25 ms)'],
] as const;
type Phase = (typeof PHASES)[number][0];
type PhaseTimes = Partial<Record<Phase, number>>;

/** When the agents' fast-path POSTs started, with their bodies, to match them to injections. */
const fastPathPosts: { at: number; body: string }[] = [];

function watchFastPathPosts(): void {
  const fetchBefore = globalThis.fetch;
  globalThis.fetch = (input, init) => {
    const url = typeof input === 'string' ? input : input instanceof URL ? input.href : input.url;
    if (init?.method === 'POST' && url.endsWith('/api/v1/signals'))
      fastPathPosts.push({ at: Date.now(), body: typeof init.body === 'string' ? init.body : '' });
    return fetchBefore(input, init);
  };
}

interface PathFigures {
  readonly name: string;
  readonly samples: number[];
  readonly failures: number;
  /** Per injection, the fast path's phases (empty for the Prometheus path). */
  readonly phases: PhaseTimes[];
}

function streamMs(entry: AuditEntry): number {
  return Number(entry.id.split('-')[0]);
}

async function phasesOf(result: ScenarioResult, signals: Queue<SignalJob>, steps: Queue<StepsJob>): Promise<PhaseTimes> {
  const since = (ms: number | undefined): number | undefined => (ms === undefined || !Number.isFinite(ms) ? undefined : ms - result.injectedAt);
  const first = (predicate: (entry: AuditEntry) => boolean): AuditEntry | undefined => result.audit.find(predicate);
  const signalEntry = first((entry) => entry.type === 'signal' && (entry.data.signal as { source?: string } | undefined)?.source === 'agent');
  const signal = signalEntry?.data.signal as { id?: string; time?: string; receivedAt?: string } | undefined;
  const decision = first((entry) => entry.type === 'decision');
  const running = first((entry) => entry.type === 'action' && entry.data.state === 'running');
  const done = first((entry) => entry.type === 'action' && entry.data.state === 'done');
  const post = fastPathPosts.find((candidate) => candidate.at >= result.injectedAt - 5 && candidate.body.includes(`"node":"${result.node}"`));
  const jobs = signal?.id === undefined ? [] : await signals.getJobs(['completed', 'active', 'failed'], 0, 1000);
  const job = jobs.find((candidate) => candidate.data.signals.some((stored) => stored.id === signal?.id));
  const transition = decision === undefined ? undefined : await steps.getJob(decision.ref ?? '');
  return {
    read: since(Date.parse(signal?.time ?? '')),
    sent: since(post?.at),
    received: since(Date.parse(signal?.receivedAt ?? '')),
    stored: since(job?.timestamp),
    taken: since(job?.processedOn),
    audited: since(signalEntry && streamMs(signalEntry)),
    decided: since(decision && streamMs(decision)),
    queued: since(transition?.timestamp),
    picked: since(transition?.processedOn),
    started: since(running && streamMs(running)),
    done: since(done && streamMs(done)),
    seen: result.timeline.find((step) => step.label === 'Slurm shows the node drained')?.afterMs,
  };
}

async function measure(name: string, fastPath: boolean): Promise<PathFigures> {
  process.stderr.write(`bench: starting ${INJECTIONS}-node environment for the ${name} …\n`);
  const env = await SimEnvironment.start({ nodes: INJECTIONS, fastPath, intervalSeconds: 1, maxDrainsPerWindow: INJECTIONS * 2 });
  const samples: number[] = [];
  const phases: PhaseTimes[] = [];
  let failures = 0;
  const signals = new Queue<SignalJob>(QUEUE_NAMES.signals, { connection: { url: env.redis.url }, prefix: env.config.redis.prefix });
  const steps = new Queue<StepsJob>(QUEUE_NAMES.steps, { connection: { url: env.redis.url }, prefix: env.config.redis.prefix });
  try {
    for (const [index, node] of env.nodes.entries()) {
      const result = await runFallenOffBus(env, { node: node.name, gpuIndex: index % 8, waitForAlert: false, timeoutMs: 30_000 });
      const done = result.timeline.find((step) => step.label === 'action done')?.afterMs;
      if (!result.ok || done === undefined) {
        failures += 1;
        process.stderr.write(`bench: ${node.name}: ${result.problems.join('; ')}\n`);
      } else {
        samples.push(done);
        if (fastPath) phases.push(await phasesOf(result, signals, steps));
        process.stderr.write(`bench: ${name} ${node.name}: ${done} ms\n`);
      }
      // Spread injections over scrape phases instead of locking onto one.
      await sleep(150 + Math.random() * 700);
    }
  } finally {
    await Promise.all([signals.close(), steps.close()]);
    await env.stop();
  }
  return { name, samples: samples.sort((a, b) => a - b), failures, phases };
}

function ascending(values: readonly (number | undefined)[]): number[] {
  return values.filter((value): value is number => value !== undefined).sort((a, b) => a - b);
}

/** Each phase's median and p90: reached after the injection, and taken since the phase before. */
function phaseTable(phases: readonly PhaseTimes[]): string {
  const lines = ['| phase | reached p50 | reached p90 | step p50 | step p90 |', '|---|---|---|---|---|'];
  let previous: Phase | undefined;
  for (const [phase, label] of PHASES) {
    const reached = ascending(phases.map((times) => times[phase]));
    const step = ascending(
      phases.map((times) => {
        const at = times[phase];
        const before = previous === undefined ? 0 : times[previous];
        return at === undefined || before === undefined ? undefined : at - before;
      }),
    );
    const ms = (sorted: number[], q: number): string => (sorted.length === 0 ? '–' : quantile(sorted, q).toFixed(0));
    lines.push(`| ${label} | ${ms(reached, 0.5)} | ${ms(reached, 0.9)} | ${ms(step, 0.5)} | ${ms(step, 0.9)} |`);
    previous = phase;
  }
  return `${lines.join('\n')}\n`;
}

function row(figures: PathFigures, target: number): string {
  const p50 = quantile(figures.samples, 0.5);
  const p95 = quantile(figures.samples, 0.95);
  const verdict = p50 <= target ? 'meets' : 'misses';
  return `| ${figures.name} | ${figures.samples.length} | ${p50.toFixed(0)} | ${p95.toFixed(0)} | ${Math.min(...figures.samples)}–${Math.max(...figures.samples)} | ${verdict} ≤ ${target} ms p50 | ${figures.failures} |`;
}

async function main(): Promise<void> {
  watchFastPathPosts();
  const loadBefore = loadavg();
  const fast = await measure('fast path (agent → controller)', true);
  const prometheus = await measure('Prometheus path (scrape → rule → Alertmanager → webhook)', false);
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  process.stdout.write(`\nFault → drain latency in ms (Xid 79 written to the kernel log → Slurm drain done), ${INJECTIONS} injections per path\n`);
  const load = (values: number[]): string => values.map((value) => value.toFixed(2)).join(' ');
  process.stdout.write(
    `machine: ${cpus().length} × ${cpu}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; load average (1, 5, 15 min) ${load(loadBefore)} before, ${load(loadavg())} after\n\n`,
  );
  process.stdout.write('| path | n | p50 | p95 | range | target | failed |\n|---|---|---|---|---|---|---|\n');
  process.stdout.write(`${row(fast, 250)}\n${row(prometheus, 3000)}\n`);
  process.stdout.write(
    `\nFast path by phase, ms after the injection (${fast.phases.length} injections; a step is the time since the phase above):\n\n${phaseTable(fast.phases)}`,
  );
  const ratio = quantile(prometheus.samples, 0.5) / quantile(fast.samples, 0.5);
  process.stdout.write(
    `\nPrometheus path p50 / fast path p50 = ${ratio.toFixed(1)}×; ByteRobust reports ~10 s to detect a lost GPU, ${(10_000 / quantile(fast.samples, 0.5)).toFixed(0)}× the fast-path p50.\n`,
  );
  if (fast.failures + prometheus.failures > 0) process.exitCode = 1;
}

await main();
