import { z } from 'zod';
import { InputError } from '../../core/errors.js';
import { Topology } from '../../core/topology.js';
import { parseOrThrow } from '../../core/validate.js';
import { planMicrobatches } from '../microbatch.js';
import { planTopologyAdjustment, type TopologyAdjustment } from '../topology-adjust.js';

/**
 * Fail-slow mitigation (Greyhound §5.1, Algorithm 1), as a pure state machine that escalates:
 *
 *   S1 ignore → S2 rebalance micro-batches → S3 adjust the topology → S4 checkpoint-and-restart
 *
 * Each rung is more effective and costs more to apply (Table 2), and how long a fail-slow will
 * last is unknown, so the choice is a ski-rental problem: while the fail-slow persists, add up
 * the training time it costs under the current strategy — iterations × (observed − healthy
 * iteration seconds) — and take the next strategy once that sum reaches the next strategy's cost
 * (rent until the rent paid equals the price of the skis). The sum then restarts under the new
 * strategy, so a strategy that cures the slow-down is never replaced, and one that only helps a
 * little is replaced later than S1 was. Algorithm 1 line 3 picks the candidate strategies by root
 * cause: S2 does nothing for a communication fail-slow (Table 2), so that root cause skips it.
 *
 * One observation moves at most one rung up: after a switch, the next rung's sum has to
 * be measured under the new strategy. When the detector reports the fail-slow over, everything
 * is undone: the even micro-batch split and the original placement return (Greyhound §7.5
 * reverts the topology as soon as congestion ends) and the next fail-slow starts from S1.
 *
 * S2's assignment stays in force at S3 (strategies add up until the restart) and is re-solved on
 * every observation that brings a fresh per-group profile — what the training loop fetches
 * before each iteration (§5.2, "Implementation and overhead").
 */

export type Strategy = 'S1' | 'S2' | 'S3' | 'S4';
export type RootCause = 'computation' | 'communication' | 'unknown';

export const STRATEGY_CITATIONS: Readonly<Record<Strategy, string>> = {
  S1: 'Greyhound §5.1 (S1: ignore)',
  S2: 'Greyhound §5.2 (S2: micro-batch distribution, Eq. 1)',
  S3: 'Greyhound §5.2 (S3: parallelism topology, Figures 11–12)',
  S4: 'Greyhound §5.1 (S4: checkpoint-and-restart)',
};
const SWITCH_RULE = 'Greyhound §5.1, Algorithm 1 (ski rental)';

const positiveSeconds = z.number().finite().positive();

export const mitigationConfigSchema = z
  .object({
    /** Seconds of training lost to apply each strategy once (Table 2's action overhead). */
    costSeconds: z.object({ S2: positiveSeconds, S3: positiveSeconds, S4: positiveSeconds }).strict(),
    /** Micro-batches in one global batch, M. */
    microbatches: z.number().int().positive(),
    /** DP groups (model replicas) that share them. */
    dpGroups: z.number().int().positive(),
    /** PP depth P of a 1F1B schedule: every group's count must be a multiple (footnote 4). */
    pipelineStages: z.number().int().positive().default(1),
    /** The job's topology, for S3's plans; without it S3 pauses nothing and carries no plan. */
    topology: z.custom<Topology>((value) => value instanceof Topology, { message: 'must be a Topology' }).optional(),
  })
  .strict();

export type MitigationConfig = z.input<typeof mitigationConfigSchema>;

export const mitigationObservationSchema = z
  .object({
    /** Iterations since the previous observation. */
    iterations: z.number().int().positive(),
    /** Mean iteration seconds over them, with the current mitigation in place. */
    iterationSeconds: positiveSeconds,
    /** Iteration seconds before the fail-slow began (the change point's beforeSeconds). */
    healthySeconds: positiveSeconds,
    /** Whether the detector still sees the fail-slow: Algorithm 1's event.persist(). */
    persists: z.boolean(),
    rootCause: z.enum(['computation', 'communication', 'unknown']).optional(),
    /** Seconds per micro-batch of each DP group, as profiled (§4.3); S2 needs it. */
    dpGroupSeconds: z.array(positiveSeconds).optional(),
    /** For S3's straggler consolidation. */
    slowRanks: z.array(z.number().int().min(0)).optional(),
    /** For S3's DP → PP link exchange: node pairs whose link is congested. */
    congestedLinks: z.array(z.tuple([z.string(), z.string()])).optional(),
  })
  .strict();

export type MitigationObservation = z.input<typeof mitigationObservationSchema>;

export interface MicrobatchAssignment {
  /** Micro-batches per DP group, in DP-group order: what the training loop fetches. */
  readonly assignment: readonly number[];
  /** False for the even split. */
  readonly rebalanced: boolean;
  /** The slowest group's predicted iteration seconds under this assignment, when profiled. */
  readonly predictedSeconds: number | null;
}

export interface MitigationState {
  readonly strategy: Strategy;
  /** Training seconds lost to the fail-slow since the current strategy took effect. */
  readonly lostSeconds: number;
  /** Iterations observed slow in the current fail-slow. */
  readonly slowIterations: number;
  readonly rootCause: RootCause | null;
  readonly microbatches: MicrobatchAssignment;
  readonly topologyPlan: TopologyAdjustment | null;
}

export type MitigationAction = 'none' | 'escalate' | 'rebalance' | 'reset';

export interface MitigationStep {
  /** Pass this to the next stepMitigation call; strategy, lostSeconds, microbatches and topologyPlan mirror it. */
  readonly state: MitigationState;
  readonly strategy: Strategy;
  readonly action: MitigationAction;
  readonly reason: string;
  readonly citation: string;
  readonly lostSeconds: number;
  /** The next rung and the lost seconds at which it will be taken, or null at the top. */
  readonly next: { readonly strategy: Strategy; readonly costSeconds: number } | null;
  readonly microbatches: MicrobatchAssignment;
  readonly topologyPlan: TopologyAdjustment | null;
  /** True on the step that escalates to S4: checkpoint now and restart on healthy nodes. */
  readonly restart: boolean;
}

type ParsedConfig = z.output<typeof mitigationConfigSchema>;

export function initialMitigationState(config: MitigationConfig): MitigationState {
  const parsed = parseConfig(config);
  return { strategy: 'S1', lostSeconds: 0, slowIterations: 0, rootCause: null, microbatches: evenSplit(parsed), topologyPlan: null };
}

/** Candidate strategies for a root cause, cheapest first (Algorithm 1, lines 3–5). */
export function candidateStrategies(rootCause: RootCause): Strategy[] {
  return rootCause === 'communication' ? ['S1', 'S3', 'S4'] : ['S1', 'S2', 'S3', 'S4'];
}

export function stepMitigation(state: MitigationState, observation: MitigationObservation, config: MitigationConfig): MitigationStep {
  const parsedConfig = parseConfig(config);
  const seen = parseOrThrow(mitigationObservationSchema, observation, 'fail-slow observation');
  if (seen.dpGroupSeconds && seen.dpGroupSeconds.length !== parsedConfig.dpGroups) {
    throw new InputError(`dpGroupSeconds lists ${seen.dpGroupSeconds.length} groups but the job has ${parsedConfig.dpGroups}`, 'dpGroupSeconds');
  }
  if (!seen.persists) return endOfFailSlow(state, parsedConfig);

  const rootCause = seen.rootCause ?? state.rootCause ?? 'unknown';
  const candidates = candidateStrategies(rootCause);
  const costOf = (strategy: Strategy): number => (strategy === 'S1' ? 0 : parsedConfig.costSeconds[strategy]);
  const rung = rungOf(candidates, state.strategy);
  const next = candidates[rung + 1];
  const lostSeconds = state.lostSeconds + seen.iterations * Math.max(0, seen.iterationSeconds - seen.healthySeconds);
  const slowIterations = state.slowIterations + seen.iterations;
  const carried = { ...state, rootCause, slowIterations };

  if (next !== undefined && next !== 'S1' && lostSeconds >= costOf(next)) {
    const reason =
      `lost ${lostSeconds.toFixed(3)} s to the fail-slow under ${state.strategy}, reaching ${next}'s cost of ${costOf(next)} s: ` + `switch to ${next}`;
    return escalate({ ...carried, strategy: next, lostSeconds: 0 }, next, reason, seen, parsedConfig, candidates);
  }

  const stayed = { ...carried, lostSeconds };
  const rebalancing = candidates.includes('S2') && rung >= candidates.indexOf('S2') && state.strategy !== 'S4';
  if (rebalancing && seen.dpGroupSeconds) {
    const microbatches = rebalance(seen.dpGroupSeconds, parsedConfig);
    const changed = microbatches.assignment.join(',') !== state.microbatches.assignment.join(',');
    const updated = { ...stayed, microbatches };
    const reason = changed ? 'a fresh per-DP-group profile moves the optimal micro-batch assignment' : 'the micro-batch assignment is still optimal';
    return toStep(updated, changed ? 'rebalance' : 'none', reason, STRATEGY_CITATIONS.S2, candidates, parsedConfig, false);
  }
  const reason =
    next === undefined
      ? `${state.strategy} is the last resort; the fail-slow persists`
      : `lost ${lostSeconds.toFixed(3)} s under ${state.strategy}; ${next} is taken at ${costOf(next)} s`;
  return toStep(stayed, 'none', reason, `${STRATEGY_CITATIONS[state.strategy]}; ${SWITCH_RULE}`, candidates, parsedConfig, false);
}

function escalate(
  state: MitigationState,
  strategy: Exclude<Strategy, 'S1'>,
  why: string,
  seen: z.output<typeof mitigationObservationSchema>,
  config: ParsedConfig,
  candidates: readonly Strategy[],
): MitigationStep {
  const citation = `${STRATEGY_CITATIONS[strategy]}; ${SWITCH_RULE}`;
  switch (strategy) {
    case 'S2': {
      if (!seen.dpGroupSeconds) {
        return toStep(state, 'escalate', `${why}; no per-DP-group profile yet, so the even split stays until one arrives`, citation, candidates, config, false);
      }
      const microbatches = rebalance(seen.dpGroupSeconds, config);
      return toStep({ ...state, microbatches }, 'escalate', `${why}: give slow DP groups fewer micro-batches`, citation, candidates, config, false);
    }
    case 'S3': {
      const microbatches = seen.dpGroupSeconds && candidates.includes('S2') ? rebalance(seen.dpGroupSeconds, config) : state.microbatches;
      if (!config.topology) {
        return toStep(
          { ...state, microbatches },
          'escalate',
          `${why}; no topology known, so there is no exchange to plan`,
          citation,
          candidates,
          config,
          false,
        );
      }
      const topologyPlan = planTopologyAdjustment(config.topology, { slowRanks: seen.slowRanks, congestedLinks: seen.congestedLinks });
      const summary = `${topologyPlan.swaps.length} node exchange(s): stragglers into ${topologyPlan.consolidation.stagesAfter.length} PP stage(s), ${topologyPlan.links.links.filter((link) => link.relieved).length} of ${topologyPlan.links.links.length} congested link(s) off DP`;
      return toStep({ ...state, microbatches, topologyPlan }, 'escalate', `${why}: ${summary}`, citation, candidates, config, false);
    }
    case 'S4': {
      const restarted = { ...state, microbatches: evenSplit(config), topologyPlan: null };
      return toStep(restarted, 'escalate', `${why}: checkpoint and restart on healthy nodes`, citation, candidates, config, true);
    }
  }
}

function endOfFailSlow(state: MitigationState, config: ParsedConfig): MitigationStep {
  const idle = state.strategy === 'S1' && state.lostSeconds === 0 && !state.microbatches.rebalanced && state.topologyPlan === null;
  const reset: MitigationState = { strategy: 'S1', lostSeconds: 0, slowIterations: 0, rootCause: null, microbatches: evenSplit(config), topologyPlan: null };
  if (idle) return toStep(reset, 'none', 'no fail-slow', STRATEGY_CITATIONS.S1, candidateStrategies('unknown'), config, false);
  return toStep(
    reset,
    'reset',
    `the fail-slow is over (was at ${state.strategy}): even micro-batch split and original placement restored, next fail-slow starts from S1`,
    'Greyhound §5.1 Algorithm 1 (while event.persist()); topology reverted as in §7.5',
    candidateStrategies('unknown'),
    config,
    false,
  );
}

function toStep(
  state: MitigationState,
  action: MitigationAction,
  reason: string,
  citation: string,
  candidates: readonly Strategy[],
  config: ParsedConfig,
  restart: boolean,
): MitigationStep {
  const following = candidates[rungOf(candidates, state.strategy) + 1];
  const next = following === undefined || following === 'S1' ? null : { strategy: following, costSeconds: config.costSeconds[following] };
  return {
    state,
    strategy: state.strategy,
    action,
    reason,
    citation,
    lostSeconds: state.lostSeconds,
    next,
    microbatches: state.microbatches,
    topologyPlan: state.topologyPlan,
    restart,
  };
}

/** Position among the candidate strategies; a strategy they skip counts as the rung below it. */
function rungOf(candidates: readonly Strategy[], strategy: Strategy): number {
  const order: readonly Strategy[] = ['S1', 'S2', 'S3', 'S4'];
  let rung = 0;
  candidates.forEach((candidate, index) => {
    if (order.indexOf(candidate) <= order.indexOf(strategy)) rung = index;
  });
  return rung;
}

function rebalance(dpGroupSeconds: readonly number[], config: ParsedConfig): MicrobatchAssignment {
  const plan = planMicrobatches(dpGroupSeconds, config.microbatches, { multipleOf: config.pipelineStages });
  return { assignment: plan.assignment, rebalanced: true, predictedSeconds: plan.iterationSeconds };
}

function evenSplit(config: ParsedConfig): MicrobatchAssignment {
  const plan = planMicrobatches(new Array<number>(config.dpGroups).fill(1), config.microbatches, { multipleOf: config.pipelineStages });
  return { assignment: plan.assignment, rebalanced: false, predictedSeconds: null };
}

function parseConfig(config: MitigationConfig): ParsedConfig {
  const parsed = parseOrThrow(mitigationConfigSchema, config, 'fail-slow mitigation config');
  if (parsed.microbatches % parsed.pipelineStages !== 0 || parsed.microbatches < parsed.dpGroups * parsed.pipelineStages) {
    throw new InputError(
      `microbatches (${parsed.microbatches}) must be a multiple of pipelineStages (${parsed.pipelineStages}) and at least dpGroups × pipelineStages (${parsed.dpGroups * parsed.pipelineStages})`,
      'microbatches',
    );
  }
  return parsed;
}
