import { z } from 'zod';
import { errorMessage } from '../core/errors.js';
import type { TrainingProgressEvent } from '../core/fast-path-event.js';
import { instantQuery } from '../core/prometheus.js';
import { aggregateBy, equals, series } from '../core/promql.js';
import type { Keys, Redis } from '../core/redis.js';
import { TRAINING_JOB_LABEL } from '../core/scrape.js';
import type { LadderEventJob } from '../core/queues.js';

/**
 * Whether a restarted job trains again: ByteRobust §4.2 judges a restart by whether training
 * resumes. After a relaunch the controller watches for a new iteration by two roads, whichever
 * comes first:
 *
 * - the agents' fast path: an agent sends `training_progress` when a rank of the job on its node
 *   records an iteration as a run starts or resumes (agent/collectors/training/progress.ts).
 *   The newest report per job and node is kept (TrainingProgressReports); one from a node of the
 *   job, made after the relaunch, means it trains. This needs no scrape, so a Prometheus that
 *   is slow, loaded or cannot reach the relaunched nodes does not keep a training job
 *   `recovering`;
 * - Prometheus: the job's newest iteration (`steadfast_training_iteration`) on the job's own nodes
 *   grown past what it was there at the relaunch. A node names its training job in a label the
 *   pushing loop chooses, so an agent outside the job could push the job's name; the node label
 *   is Prometheus' own (the scrape target's), so only the series of the job's nodes are read.
 *
 * Neither within the timeout: the restart failed.
 */

const awaitingSchema = z.object({ baseline: z.number().nullable(), since: z.number(), eventId: z.string() });
const reportSchema = z.object({ time: z.number(), iteration: z.number(), rank: z.number().optional() });

/** How long a job's progress reports are kept after the newest one. */
const REPORT_TTL_MS = 24 * 3600 * 1000;

// Records a node's report only while the job is registered, so that reports cannot make keys for
// jobs nobody registered; keeps the newer of two reports from one node.
const RECORD_IF_JOB_EXISTS = `
if redis.call('hexists', KEYS[1], 'spec') == 0 then return 0 end
local old = redis.call('hget', KEYS[2], ARGV[1])
if old then
  local ok, decoded = pcall(cjson.decode, old)
  if ok and type(decoded) == 'table' and tonumber(decoded.time) and tonumber(decoded.time) >= tonumber(ARGV[3]) then return 1 end
end
redis.call('hset', KEYS[2], ARGV[1], ARGV[2])
redis.call('pexpire', KEYS[2], ARGV[4])
return 1`;

export interface ProgressReport {
  readonly node: string;
  /** When the rank recorded the iteration: the agent's time, never later than its arrival. */
  readonly time: number;
  readonly iteration: number;
  readonly rank?: number | undefined;
}

/** The agents' training_progress reports, newest per job and node, in Redis. */
export class TrainingProgressReports {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
  ) {}

  /**
   * Records reports from agents (each already checked to speak for its own node). Reports for a
   * job that is not registered are dropped. Returns how many were recorded.
   */
  async record(events: readonly TrainingProgressEvent[], receivedAt: number): Promise<number> {
    // One write per job and node: the newest of a batch.
    const newest = new Map<string, TrainingProgressEvent & { at: number }>();
    for (const event of events) {
      // An agent's clock running ahead must not date a report after the relaunch it preceded.
      const at = Math.min(Date.parse(event.time), receivedAt);
      const key = `${event.job}\u0000${event.node}`;
      const held = newest.get(key);
      if (held === undefined || held.at < at) newest.set(key, { ...event, at });
    }
    let recorded = 0;
    for (const event of newest.values()) {
      const report = { time: event.at, iteration: event.iteration, ...(event.rank === undefined ? {} : { rank: event.rank }) };
      const kept = await this.redis.eval(
        RECORD_IF_JOB_EXISTS,
        2,
        this.keys.job(event.job),
        this.keys.jobProgressReports(event.job),
        event.node,
        JSON.stringify(report),
        String(event.at),
        String(REPORT_TTL_MS),
      );
      if (kept === 1) recorded += 1;
    }
    return recorded;
  }

  /** The newest report from any of `nodes` made after `since`, if there is one. */
  async since(job: string, nodes: readonly string[], since: number): Promise<ProgressReport | undefined> {
    if (nodes.length === 0) return undefined;
    const values = await this.redis.hmget(this.keys.jobProgressReports(job), ...nodes);
    let best: ProgressReport | undefined;
    values.forEach((raw, index) => {
      if (raw === null) return;
      let parsed: z.infer<typeof reportSchema>;
      try {
        parsed = reportSchema.parse(JSON.parse(raw));
      } catch {
        return; // Not written by record(): ignored, never trusted.
      }
      if (parsed.time > since && (best === undefined || parsed.time > best.time)) best = { node: nodes[index] as string, ...parsed };
    });
    return best;
  }
}

/** A restart judged by the progress watch, with how it was seen. */
export interface ProgressVerdict extends LadderEventJob {
  readonly seen: string;
}

export interface ProgressWatchOptions {
  readonly prometheusUrl: string;
  /** A restart that shows no new iteration within this long has failed. */
  readonly timeoutMs: number;
  /** The label naming the node on the agents' series, set by Prometheus from the scrape target (analysis.labels.nodeLabel). */
  readonly nodeLabel: string;
  /** The job's nodes now (its spec's): only their iterations count. */
  readonly nodesOf: (job: string) => Promise<readonly string[]>;
}

export class ProgressWatch {
  private readonly reports: TrainingProgressReports;
  private readonly timeoutMs: number;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly options: ProgressWatchOptions,
  ) {
    this.reports = new TrainingProgressReports(redis, keys);
    this.timeoutMs = options.timeoutMs;
  }

  /**
   * The job's newest iteration over its ranks on `nodes`, or null when Prometheus has none there.
   * Asked per node and filtered here, not with the node names in the query: a job of thousands of
   * nodes would make a query URL longer than Prometheus takes. The answer has one sample per node
   * that shows the job's series, the job's own nodes and any that push its name.
   */
  async iteration(job: string, nodes: readonly string[]): Promise<number | null> {
    if (nodes.length === 0) return null;
    const { nodeLabel } = this.options;
    const samples = await instantQuery(
      this.options.prometheusUrl,
      aggregateBy('max', [nodeLabel], series('steadfast_training_iteration', equals(TRAINING_JOB_LABEL, job))),
    );
    const members = new Set(nodes);
    let newest: number | null = null;
    for (const sample of samples) {
      const node = sample.labels[nodeLabel];
      if (node !== undefined && members.has(node) && !Number.isNaN(sample.value) && (newest === null || sample.value > newest)) newest = sample.value;
    }
    return newest;
  }

  /** Starts watching a restart launched at `since` (taken before the launch). */
  async watch(job: string, eventId: string, since = Date.now()): Promise<void> {
    const nodes = await this.options.nodesOf(job);
    let baseline: number | null;
    try {
      baseline = await this.iteration(job, nodes);
    } catch {
      baseline = null; // Prometheus unreachable now: any iteration seen later counts as progress.
    }
    await this.redis.set(this.keys.jobAwaitingProgress(job), JSON.stringify({ baseline, since, eventId }));
  }

  /**
   * Checks a watched restart of a job now on `nodes`; returns the ladder event to feed, with how
   * it was decided, if it is decided.
   */
  async check(job: string, nodes: readonly string[], now = Date.now()): Promise<ProgressVerdict | undefined> {
    const raw = await this.redis.get(this.keys.jobAwaitingProgress(job));
    if (raw === null) return undefined;
    const awaiting = awaitingSchema.parse(JSON.parse(raw));
    let seen: string | undefined;
    const report = await this.reports.since(job, nodes, awaiting.since);
    if (report !== undefined)
      seen = `${report.node}'s agent reported iteration ${report.iteration}${report.rank === undefined ? '' : ` of rank ${report.rank}`} ${Math.round((report.time - awaiting.since) / 100) / 10} s after the relaunch`;
    let detail = '';
    if (seen === undefined) {
      try {
        const current = await this.iteration(job, nodes);
        if (current !== null && (awaiting.baseline === null || current > awaiting.baseline))
          seen = `Prometheus: the newest iteration is ${current}${awaiting.baseline === null ? '' : `, up from ${awaiting.baseline} at the relaunch`}`;
      } catch (error) {
        detail = `; Prometheus: ${errorMessage(error)}`;
      }
    }
    if (seen === undefined && now - awaiting.since < this.timeoutMs) return undefined;
    await this.redis.del(this.keys.jobAwaitingProgress(job));
    return seen !== undefined
      ? { job, event: { type: 'restart_succeeded', time: now }, eventId: `${awaiting.eventId}:progress`, seen }
      : {
          job,
          event: {
            type: 'restart_failed',
            time: now,
            detail: `no new iteration within ${Math.round(this.timeoutMs / 1000)} s of the restart (no agent of ${nodes.join(', ')} reported one, nor Prometheus)${detail}`,
          },
          eventId: `${awaiting.eventId}:no-progress`,
          seen: 'nothing',
        };
  }
}
