import type { Step, StepVerb } from '../../../core/steps.js';
import { CITE, type LadderConfig } from './config.js';
import { LADDER_RUNGS, type Incident, type LadderPhase, type LadderRung, type LadderState, type NodeTimes, type VersionVerdict } from './state.js';

/**
 * One transition's working set, and the bookkeeping every rung shares: opening an incident,
 * entering a rung, emitting steps, and the per-node time windows.
 */

export interface Ctx {
  readonly s: LadderState;
  readonly time: number;
  readonly config: LadderConfig;
  readonly steps: Step[];
  /** The failure signature of the fault being handled (evidence.ts); absent for other events. */
  readonly signature?: string;
  /** The job's hot swap and its unused spares, as the fault being handled carried them (FaultEvent.hotSwap). */
  readonly hotSwap?: { readonly spares: readonly string[] };
}

const MINUTE = 60_000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;

const STOP_CITATION: Readonly<Record<Incident['trigger'], string>> = {
  machine: CITE.machine,
  network: CITE.network,
  user_code: CITE.userCode,
  crash: CITE.diagnose,
  numerical: CITE.diagnose,
  performance: CITE.stacks,
  transient: CITE.transient,
  code_update: CITE.hotUpdate,
};

/**
 * Opens an incident (and stops the job) when it was running; returns the open incident. A hot
 * swap opens one without stopping the job (`stop: false`).
 */
export function leaveRunning(ctx: Ctx, trigger: Incident['trigger'], why: string, options: { stop?: boolean } = {}): Incident {
  const { s, time } = ctx;
  if (s.incident !== null) return s.incident;
  const recent = s.recentSignals.at(-1);
  s.incident = {
    openedAt: time,
    trigger,
    signalIds: trigger === 'code_update' || recent === undefined ? [] : [recent],
    rung: 'evict',
    tried: emptyTried(),
    evictedNodes: [],
    rolledBackFrom: null,
    retry: { attempts: 0, nextBackoffMs: 0 },
    signatures: trigger === 'code_update' || ctx.signature === undefined ? [] : [ctx.signature],
  };
  if (s.phase === 'running' && options.stop !== false) emit(ctx, 'stop', why, STOP_CITATION[trigger]);
  return s.incident;
}

export function enterRung(ctx: Ctx, rung: LadderRung, phase: LadderPhase): Incident {
  const incident = leaveRunning(ctx, 'crash', `entering ${rung}`);
  incident.rung = rung;
  incident.tried[rung] += 1;
  ctx.s.phase = phase;
  return incident;
}

export function emptyTried(): Record<LadderRung, number> {
  return Object.fromEntries(LADDER_RUNGS.map((rung) => [rung, 0])) as Record<LadderRung, number>;
}

/** The newest good version that is not the one running. */
export function rollbackTarget(s: LadderState): string | null {
  for (let i = s.codeVersions.length - 1; i >= 0; i -= 1) {
    const entry = s.codeVersions[i];
    if (entry !== undefined && entry.verdict === 'good' && entry.version !== s.runningVersion) return entry.version;
  }
  return null;
}

export function setVerdict(s: LadderState, version: string, verdict: VersionVerdict, time: number): void {
  const entry = s.codeVersions.find((candidate) => candidate.version === version);
  if (entry === undefined || entry.verdict === verdict) return;
  entry.verdict = verdict;
  entry.verdictAt = time;
}

export interface StepExtra {
  nodes?: string[];
  version?: string;
  gpu?: string;
  spares?: string[];
}

export function step(ctx: Ctx, verb: StepVerb, reason: string, citation: string, extra: StepExtra = {}): Step {
  const out: Step = { verb, job: ctx.s.job, reason, citation };
  if (extra.nodes !== undefined && extra.nodes.length > 0) out.nodes = [...extra.nodes];
  if (extra.spares !== undefined && extra.spares.length > 0) out.spares = [...extra.spares];
  if (extra.version !== undefined) out.version = extra.version;
  if (extra.gpu !== undefined) out.gpu = extra.gpu;
  return out;
}

export function emit(ctx: Ctx, verb: StepVerb, reason: string, citation: string, extra: StepExtra = {}): void {
  ctx.steps.push(step(ctx, verb, reason, citation, extra));
}

export function appendTime(entries: NodeTimes[], node: string, time: number): NodeTimes[] {
  const found = entries.find((entry) => entry.node === node);
  if (found === undefined) return [...entries, { node, times: [time] }];
  return entries.map((entry) => (entry === found ? { node, times: [...entry.times, time] } : entry));
}

export function timesOf(entries: NodeTimes[], node: string): number[] {
  return entries.find((entry) => entry.node === node)?.times ?? [];
}

/** Drops network alerts and exclusions older than their windows, so the state stays small. */
export function prune(ctx: Ctx): void {
  const { s, time, config } = ctx;
  const keep = (entries: NodeTimes[], windowMs: number): NodeTimes[] =>
    entries.map((entry) => ({ node: entry.node, times: entry.times.filter((at) => at >= time - windowMs) })).filter((entry) => entry.times.length > 0);
  s.networkAlerts = keep(s.networkAlerts, config.networkAlertWindowMs);
  s.exclusions = keep(s.exclusions, config.exclusionWindowMs);
  s.gpuResets = keep(s.gpuResets, RESET_REJOIN_MS);
}

/** How long after a GPU reset in place a report of the same fault on the node joins that reset. */
export const RESET_REJOIN_MS = 10 * MINUTE;

/** The key of a reset in LadderState.gpuResets. */
export function resetKey(node: string, signature: string | undefined): string {
  return `${node}|${signature ?? ''}`;
}

export function unique(values: readonly string[]): string[] {
  return [...new Set(values)];
}

export function minutes(ms: number): string {
  return `${Math.round(ms / MINUTE)} min`;
}

export function hours(ms: number): string {
  return ms % DAY === 0 ? `${ms / DAY} d` : `${Math.round(ms / HOUR)} h`;
}

/** The last rung: a person takes the incident; automation only records from here on. */
export function pageHuman(ctx: Ctx, why: string, citation: string): void {
  enterRung(ctx, 'human', 'waiting_for_human');
  ctx.s.scheduled = null;
  emit(ctx, 'page_human', why, citation);
}
