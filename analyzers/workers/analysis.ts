import type { Job } from 'bullmq';
import { UnrecoverableError } from 'bullmq';
import type { AuditLog } from '../../core/audit.js';
import { InputError, errorMessage } from '../../core/errors.js';
import { parseJobSpec, type JobSpec } from '../../core/job.js';
import type { Logger } from '../../core/log.js';
import { analysisJobSchema, nothingFound, type AnalysisJob, type LadderEventJob } from '../../core/queues.js';
import { runStagedDiagnostics } from '../diagnosis/staged.js';
import type { StopTimeDiagnosis } from '../diagnosis/stop-time.js';
import { FailSlowRounds, type FailSlowVerdict } from '../stacks/rounds.js';
import { aggregateStacks, type StackAggregation } from '../stacks/aggregate.js';
import { commandReplayRunner, runDualPhaseReplay, type ReplayGroupRunner } from '../replay/runner.js';

/**
 * The analysis queue's worker: the analyzers the recovery ladder asks for, run off the recovery
 * queue (they take seconds to many minutes, and the recovery worker runs one transition at a
 * time). Each reports back to the ladder as an event with a stable id, so a redelivered analysis
 * job cannot move the ladder twice.
 *
 * - diagnostics: every node's agent runs its stop-time checks, stage by stage when stages are
 *   configured (ByteRobust §4.2's hierarchy: machine-local, NCCL within a machine, across
 *   machines; §4.3), each stage on the audit trail;
 * - replay: dual-phase replay with the job's replay command (§4.2, Algorithm 1);
 * - stacks: py-spy dumps from every node's agent, aggregated over several rounds (§5.1, §5.2);
 *   a suspect group comes back as a machine fault naming the machines to over-evict. One
 *   aggregation per job at a time: a request while one runs is recorded and joins its verdict.
 */

/** The registered jobs, as the analyses read them (controller/job-store.ts's JobStore is one). */
export interface AnalysisJobs {
  get(name: string): Promise<{ readonly spec: JobSpec }>;
}

/** One node's py-spy dumps by global rank, as its agent gave them. */
export interface NodeStacks {
  readonly node: string;
  readonly byRank: ReadonlyMap<number, string>;
  /** Dumps the agent took but could not tie to a rank. */
  readonly unranked: number;
  readonly error?: string | undefined;
}

/** The nodes' agents, as the analyses reach them (controller/agents.ts's AgentDirectory is one). */
export interface AnalysisAgents {
  /** The agent URLs of those of `nodes` the cluster backend knows; another node gets none. */
  urls(nodes: readonly string[]): Promise<ReadonlyMap<string, string>>;
  /** The bearer token `node`'s agent requires; none when agents run open. */
  tokenFor(node: string): string | undefined;
  readonly diagnoseTimeoutSeconds: number;
  /** Every node's stacks, all nodes at once; a node whose agent fails gives an entry with `error`, never an exception. */
  trace(nodes: readonly string[]): Promise<readonly NodeStacks[]>;
}

/** Fills a job's replay command in for one group of machines. */
export type ReplayCommand = (machines: readonly string[]) => string[];

export interface AnalysisDeps {
  readonly jobs: AnalysisJobs;
  readonly audit: AuditLog;
  readonly agents: AnalysisAgents;
  /**
   * The job's replay command: the `replay` argv of the Slurm launcher the job names (config
   * `launchers:`), or undefined when its launcher has none. controller/workers.ts builds it from
   * the operator's launchers (replayCommandOf).
   */
  readonly replayCommand: (spec: JobSpec) => ReplayCommand | undefined;
  readonly feedback: (event: LadderEventJob) => Promise<unknown>;
  readonly logger: Logger;
  /** Stack aggregation rounds and the pause between them (ByteRobust §5.2: 5 rounds, 10 s). */
  readonly stackRounds: number;
  readonly stackRoundSeconds: number;
  /** Longest one replay group may run. */
  readonly replayTimeoutSeconds: number;
  /** The stop-time checks' stages (config `analysis.diagnoseStages`); none: one call with every check. */
  readonly diagnoseStages?: readonly { readonly name: string; readonly checks: readonly string[]; readonly timeoutSeconds?: number | undefined }[];
  /** Replaces the job's replay command (tests). */
  readonly replayRunner?: (job: string) => ReplayGroupRunner | undefined;
  readonly sleep?: (ms: number) => Promise<void>;
}

export function createAnalysisProcessor(deps: AnalysisDeps): (job: Job<AnalysisJob>) => Promise<{ evict: string[] }> {
  const { jobs, audit, agents, logger } = deps;
  const sleep = deps.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));

  /** One audit entry per analysis, or per `part` of one (a diagnosis stage), written once. */
  async function record(request: AnalysisJob, summary: string, data: Record<string, unknown>, nodes: readonly string[] = [], part?: string): Promise<void> {
    await audit.append(
      {
        type: 'action',
        ref: request.ref,
        node: nodes[0],
        summary: `${request.job}: ${request.kind}: ${summary}`,
        data: { job: request.job, verb: `analysis_${request.kind}`, ...data },
      },
      `analysis:${request.ref}:${request.kind}${part === undefined ? '' : `:${part}`}`,
    );
  }

  /** What one diagnosis call found, for the audit line. */
  function findings(result: StopTimeDiagnosis): string[] {
    return [
      result.evict.length > 0 ? `evict ${result.evict.join(', ')}` : 'no suspect',
      ...result.failed.map((failure) => `${failure.node} failed ${failure.check}: ${failure.reason}`),
      ...result.alignmentOutliers.map((node) => `${node} disagrees with the reference hash`),
      ...result.unreachable.map((problem) => `${problem.node} unreachable: ${problem.reason}`),
      ...result.inconclusive.map((problem) => `${problem.node} inconclusive: ${problem.reason}`),
      ...result.notes,
    ];
  }

  /** ByteRobust §4.2: the stop-time checks, stage by stage (analyzers/diagnosis/staged.ts). */
  async function diagnostics(request: AnalysisJob): Promise<string[]> {
    const { spec } = await jobs.get(request.job);
    const stages = deps.diagnoseStages ?? [];
    // Agent URLs for the nodes the backend knows only; another node counts as unreachable.
    const urls = await agents.urls(spec.nodes);
    const agentUrl = (node: string): string => {
      const url = urls.get(node);
      if (url === undefined) throw new InputError(`${node} is not a node the backend knows; its agent is not contacted`);
      return url;
    };
    const walk = await runStagedDiagnostics(spec.nodes, stages, {
      agentUrl,
      tokenFor: (node) => agents.tokenFor(node),
      timeoutSeconds: agents.diagnoseTimeoutSeconds,
    });
    const evict = [...walk.evict];
    const failed = walk.stages.flatMap((stage) => stage.diagnosis.failed);
    const unreachable = walk.stages.flatMap((stage) => stage.diagnosis.unreachable);
    const inconclusive = walk.stages.flatMap((stage) => stage.diagnosis.inconclusive);
    if (stages.length > 0) {
      // Every stage on the record: which nodes it tested, what it found, whom it did not clear.
      for (const [index, stage] of walk.stages.entries()) {
        const checks = stages[index]?.checks.join(', ') ?? '';
        const notCleared = stage.dropped.length > 0 ? [`not cleared, not tested further: ${stage.dropped.join(', ')}`] : [];
        const summary = [...findings(stage.diagnosis), ...notCleared].join('; ');
        await record(
          request,
          `stage ${index + 1}/${stages.length} ${stage.stage} (${checks}) on ${stage.nodes.length} nodes: ${summary}`.slice(0, 2000),
          {
            stage: stage.stage,
            nodes: stage.nodes,
            evict: stage.diagnosis.evict,
            cleared: stage.cleared,
            dropped: stage.dropped,
            failed: stage.diagnosis.failed,
            unreachable: stage.diagnosis.unreachable,
            inconclusive: stage.diagnosis.inconclusive,
          },
          stage.diagnosis.evict,
          `stage:${stage.stage}`,
        );
      }
    }
    const only = stages.length === 0 ? walk.stages[0] : undefined;
    const said =
      only !== undefined
        ? findings(only.diagnosis)
        : [
            evict.length > 0 ? `evict ${evict.join(', ')}` : 'no suspect',
            ...failed.map((failure) => `${failure.node} failed ${failure.check}: ${failure.reason}`),
          ];
    const ran = stages.length > 0 ? [`stages run: ${walk.stages.map((stage) => stage.stage).join(', ') || 'none'}`] : [];
    const skipped = walk.skipped.length > 0 ? [`skipped ${walk.skipped.join(', ')}: ${walk.skipReason ?? ''}`] : [];
    await record(
      request,
      [...said, ...ran, ...skipped].join('; ').slice(0, 2000),
      { evict, failed, unreachable, inconclusive, stages: walk.stages.map((stage) => stage.stage), skipped: walk.skipped },
      evict,
    );
    await deps.feedback({ job: request.job, event: { type: 'diagnostics_result', time: Date.now(), suspects: evict }, eventId: `${request.ref}:diagnostics` });
    return evict;
  }

  async function replay(request: AnalysisJob): Promise<string[]> {
    const { spec } = await jobs.get(request.job);
    const command = deps.replayCommand(spec);
    const runner = deps.replayRunner?.(request.job) ?? (command ? commandReplayRunner(command, deps.replayTimeoutSeconds * 1000) : undefined);
    let culprits: string[] = [];
    let unrun: string | undefined;
    if (!runner) {
      unrun = `launcher ${JSON.stringify(spec.launcher)} has no replay command (launchers.<name>.replay in the controller's configuration)`;
      await record(request, `${unrun}; replay skipped`, {});
    } else {
      const outcome = await runDualPhaseReplay(spec.nodes, runner);
      culprits = outcome.suspects;
      await record(
        request,
        outcome.detail,
        { groupSize: outcome.groupSize, horizontal: outcome.horizontal, vertical: outcome.vertical, suspects: culprits },
        culprits,
      );
    }
    await deps.feedback({
      job: request.job,
      event: { type: 'replay_result', time: Date.now(), culprits, ...(unrun === undefined ? {} : { unrun }) },
      eventId: `${request.ref}:replay`,
    });
    return culprits;
  }

  /** Jobs whose stacks are being aggregated: a hang stalls every rank, and each rank's alert asks. */
  const aggregating = new Set<string>();

  async function stacks(request: AnalysisJob): Promise<string[]> {
    if (aggregating.has(request.job)) {
      // The agents trace one request at a time (409 to the rest): a second aggregation of the
      // same job would only get refusals, and its verdict is the running one's.
      await record(request, 'a stack aggregation of this job is already running; its verdict stands for this request too', {});
      return [];
    }
    aggregating.add(request.job);
    try {
      return await aggregateJobStacks(request);
    } finally {
      aggregating.delete(request.job);
    }
  }

  async function aggregateJobStacks(request: AnalysisJob): Promise<string[]> {
    const { spec } = await jobs.get(request.job);
    const { topology } = parseJobSpec(spec);
    const rounds = new FailSlowRounds(deps.stackRounds);
    let verdict: FailSlowVerdict | undefined;
    let last: StackAggregation | undefined;
    const traceErrors = new Set<string>();
    // Dumps an agent took but could not tie to a rank (no RANK in the process environment).
    let unranked = 0;
    for (let round = 0; round < deps.stackRounds; round += 1) {
      if (round > 0) await sleep(deps.stackRoundSeconds * 1000);
      const traces = await agents.trace(spec.nodes);
      const dumps = new Map<number, string>();
      for (const trace of traces) {
        if (trace.error) traceErrors.add(`${trace.node}: ${trace.error}`);
        unranked += trace.unranked;
        for (const [rank, text] of trace.byRank) if (rank < topology.ranks.length) dumps.set(rank, text);
      }
      if (dumps.size === 0) {
        // No stack at all is the tracer failing, not evidence against every machine.
        await record(
          request,
          `no stack dumps could be taken (${[...traceErrors].join('; ').slice(0, 500) || (unranked > 0 ? `${unranked} dumps without a rank` : 'no training processes found')}); nothing to aggregate`,
          { traceErrors: [...traceErrors], unranked },
        );
        return [];
      }
      last = aggregateStacks(dumps, topology);
      verdict = rounds.add(last);
    }
    const evict = verdict?.degrader ? [...verdict.evict] : [];
    const degrader = verdict?.degrader;
    const summary = degrader
      ? `${degrader.kind === 'node' ? 'node' : `${degrader.kind.toUpperCase()} group on`} ${degrader.nodes.join(', ')} flagged in ${degrader.flags} of ${verdict?.roundsSeen} rounds; evicting its machines`
      : `no outlier group (${last?.reason ?? 'no rounds'})`;
    await record(
      request,
      summary,
      {
        evict,
        counts: verdict?.counts ?? [],
        groups: last?.groups.map((group) => ({ signature: group.signature, ranks: group.ranks.length, healthy: group.healthy, top: group.frames[0] })),
        traceErrors: [...traceErrors],
        unranked,
      },
      evict,
    );
    if (evict.length > 0) {
      await deps.feedback({
        job: request.job,
        event: {
          type: 'fault',
          time: Date.now(),
          signalId: `analysis:${request.ref}`,
          faultClass: 'machine',
          nodes: evict,
          detail: `stack aggregation: ${summary}`,
        },
        eventId: `${request.ref}:stacks`,
      });
    }
    return evict;
  }

  return async (job) => {
    const parsed = analysisJobSchema.safeParse(job.data);
    if (!parsed.success) throw new UnrecoverableError(new InputError(`invalid analysis job payload: ${parsed.error.message}`).message);
    const request = parsed.data;
    try {
      switch (request.kind) {
        case 'diagnostics':
          return { evict: await diagnostics(request) };
        case 'replay':
          return { evict: await replay(request) };
        case 'stacks':
          return { evict: await stacks(request) };
      }
    } catch (error) {
      logger.warn({ job: request.job, kind: request.kind, err: error }, 'analysis failed');
      const lastAttempt = job.attemptsMade + 1 >= (job.opts.attempts ?? 1);
      if (!lastAttempt || request.kind === 'stacks') throw error;
      // The ladder waits for this result: after the last attempt, report that nothing was found
      // (so it moves on, as ByteRobust §4.2 does on clean checks) and say why on the record.
      const failed = `failed after ${job.attemptsMade + 1} attempts`;
      await record(request, `${failed}, reported as finding nothing: ${errorMessage(error)}`, {});
      await deps.feedback({
        job: request.job,
        event: nothingFound(request.kind, Date.now(), `the ${request.kind} analysis ${failed}`),
        eventId: `${request.ref}:${request.kind}`,
      });
      return { evict: [] };
    }
  };
}
