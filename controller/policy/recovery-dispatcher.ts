import { z } from 'zod';
import type { Queue } from 'bullmq';
import type { AuditLog } from '../../core/audit.js';
import { CONTROLLER_IDENTITY } from '../../core/credentials.js';
import { StoreUnavailableError, errorMessage } from '../../core/errors.js';
import type { Keys, Redis } from '../../core/redis.js';
import { stableHash } from '../../core/signal.js';
import { JobNotFoundError, type JobStore } from '../job-store.js';
import type { LadderEvent } from '../../core/ladder.js';
import { ACTING_VERBS, type Step } from '../../core/steps.js';
import { STEPS_JOB_VERSION, type LadderEventJob, type StepsJob } from '../../core/queues.js';
import { DEFAULT_LADDER_CONFIG, advance, initialLadderState, ladderStateSchema, type LadderConfig, type LadderState } from './ladder/index.js';

/**
 * Runs a job's recovery ladder (controller/policy/ladder/) against its state in Redis and hands the
 * resulting steps to the step actuators as ONE transition on the steps queue, so they run in order (stop, evict, then
 * restart). Read-modify-write under WATCH: two controller replicas advancing the same job at
 * once retry instead of losing a transition.
 *
 * The ladder as it stood before the newest transition with acting steps is kept beside it: if the
 * step processor refuses that transition (`recovery_refused`: actions paused, recovery off,
 * the eviction budget spent) and nothing has moved the ladder since, the ladder is put back as it
 * was, so evictions that never happened count towards no quarantine and the fault is acted on
 * afresh when it is next reported.
 */

const MAX_CONFLICT_RETRIES = 8;
/** How long a transition can be undone: its refusal comes back within seconds, or its job is gone. */
const UNDO_TTL_SECONDS = 24 * 3600;

const undoSchema = z.object({ transitionId: z.string(), before: z.unknown(), after: z.string() });

/** The ladder to put back for a refused transition: the state before it, if the ladder still holds what that transition left. */
function stateBefore(undoRaw: string | null, ladderRaw: string | null, event: LadderEvent): LadderState | undefined {
  if (event.type !== 'recovery_refused' || undoRaw === null) return undefined;
  let stored: unknown;
  try {
    stored = JSON.parse(undoRaw);
  } catch {
    return undefined;
  }
  const undo = undoSchema.safeParse(stored);
  if (!undo.success || undo.data.transitionId !== event.transitionId || undo.data.after !== ladderRaw) return undefined;
  const before = ladderStateSchema.safeParse(undo.data.before);
  return before.success ? (before.data as LadderState) : undefined;
}

export class RecoveryDispatcher {
  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly jobs: JobStore,
    private readonly audit: AuditLog,
    private readonly steps: Queue<StepsJob>,
    private readonly config: LadderConfig = DEFAULT_LADDER_CONFIG,
  ) {}

  async state(job: string): Promise<LadderState> {
    const raw = await this.redis.get(this.keys.jobLadder(job));
    if (raw) return ladderStateSchema.parse(JSON.parse(raw)) as LadderState;
    const record = await this.jobs.get(job);
    return initialLadderState(job, { time: Date.parse(record.createdAt), version: record.spec.codeVersion });
  }

  /** Applies `event` to the job's ladder; enqueues the steps it produces. Returns them. */
  async apply(received: LadderEventJob): Promise<Step[]> {
    const input = await this.withJobFacts(received);
    const key = this.keys.jobLadder(input.job);
    const undoKey = this.keys.jobLadderUndo(input.job);
    for (let attempt = 0; attempt < MAX_CONFLICT_RETRIES; attempt += 1) {
      const watcher = this.redis.duplicate();
      try {
        await watcher.watch(key, undoKey);
        const [raw, undoRaw] = [await watcher.get(key), await watcher.get(undoKey)];
        const current = raw ? (ladderStateSchema.parse(JSON.parse(raw)) as LadderState) : await this.state(input.job);
        const { state, steps } = advance(stateBefore(undoRaw, raw, input.event) ?? current, input.event, this.config);
        const transitionId = `t-${stableHash(`${input.job}|${input.eventId}|${input.event.type}`)}`;
        const stored = JSON.stringify(state);
        const write = watcher.multi().set(key, stored);
        if (input.event.type === 'recovery_refused') write.del(undoKey);
        else if (steps.some((step) => ACTING_VERBS.has(step.verb)))
          write.set(undoKey, JSON.stringify({ transitionId, before: current, after: stored }), 'EX', UNDO_TTL_SECONDS);
        const committed = await write.exec();
        if (committed === null) continue; // someone else advanced the job first; read again
        await this.dispatch(input, transitionId, steps, state);
        return steps;
      } finally {
        watcher.disconnect();
      }
    }
    throw new StoreUnavailableError(`job ${input.job}: recovery state kept changing under ${MAX_CONFLICT_RETRIES} attempts`);
  }

  /**
   * A fault carries the job facts the ladder decides on, so that the ladder stays a function of
   * its events: a hot-swap job's unused spares as the fault arrives (FaultEvent.hotSwap).
   */
  private async withJobFacts(input: LadderEventJob): Promise<LadderEventJob> {
    if (input.event.type !== 'fault') return input;
    const spec = await this.jobs.get(input.job).then(
      (record) => record.spec,
      (error: unknown) => {
        // An unregistered job's ladder has nothing to learn; a store that does not answer is retried.
        if (error instanceof JobNotFoundError) return undefined;
        throw error;
      },
    );
    if (spec?.hotSwap === undefined) return input;
    return { ...input, event: { ...input.event, hotSwap: { spares: [...spec.hotSwap.spares] } } };
  }

  private async dispatch(input: LadderEventJob, transitionId: string, steps: Step[], state: LadderState): Promise<void> {
    // The job's state (and with it ETTR) follows the ladder's phase.
    const jobState = state.phase === 'running' ? 'running' : state.phase === 'waiting_for_human' ? 'waiting_for_human' : 'recovering';
    try {
      const current = await this.jobs.get(input.job);
      // A finished job's ladder acts no more (its nodes have left it); nothing is dispatched.
      if (current.state === 'finished') return;
      if (current.state !== jobState) {
        await this.jobs.setState(input.job, jobState, `${input.event.type}${steps.length ? `: ${steps.map((step) => step.verb).join(', ')}` : ''}`);
      }
    } catch (error) {
      throw new StoreUnavailableError(`could not record the state of job ${input.job}: ${errorMessage(error)}`, error);
    }
    if (steps.length === 0) return;
    for (const [index, step] of steps.entries()) {
      await this.audit.append(
        {
          type: 'decision',
          ref: `${transitionId}:${index}`,
          node: step.nodes?.[0],
          summary: `${input.job}: ${step.verb}${step.nodes?.length ? ` ${step.nodes.join(',')}` : ''}${step.version ? ` to ${step.version}` : ''} — ${step.reason} (${step.citation})`,
          data: { job: input.job, step, event: input.event, phase: state.phase },
          actor: input.origin ?? CONTROLLER_IDENTITY,
        },
        `decision:${transitionId}:${index}`,
      );
    }
    await this.steps.add(
      'job',
      { v: STEPS_JOB_VERSION, transitionId, job: input.job, steps, ...(input.origin ? { origin: input.origin } : {}) },
      { jobId: transitionId },
    );
  }
}
