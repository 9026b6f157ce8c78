import { DAY, MINUTE, type Confuser, type FaultLabel } from './fleet.js';

/**
 * Scoring against the labels. A fault counts as found when its node is raised between the
 * start of its precursor and GRACE_MS after its failure (a raise that soon still spares the
 * job most of a hang timeout); before the failure when the first such raise precedes it. Any
 * other raise is false, and false raises of a node closer together than EPISODE_GAP_MS make one
 * episode — the unit an operator sees (the controller itself re-raises a node once an hour).
 */

export const GRACE_MS = 10 * MINUTE;
export const EPISODE_GAP_MS = 65 * MINUTE;

export interface Raise {
  readonly node: string;
  readonly time: number;
  /** What the detector gave as its reasons, for the verbose listing. */
  readonly why?: string;
}

export interface FaultOutcome {
  /** First raise of the fault's node inside its window, ms; undefined: not found. */
  readonly firstRaise?: number;
}

export interface Score {
  readonly outcomes: ReadonlyMap<string, FaultOutcome>;
  readonly eligible: number;
  readonly found: number;
  readonly foundBefore: number;
  /** Median minutes from the first raise to the failure, over faults found before it. */
  readonly medianLeadMinutes: number | undefined;
  readonly falseEpisodes: number;
  readonly falseEpisodesPerDay: number;
  /** The first raise of every false episode. */
  readonly falseStarts: readonly Raise[];
}

/** Whether a raise of `fault`'s node at `time` belongs to the fault (precursor to the end of its repair). */
function explainedBy(fault: FaultLabel, time: number): boolean {
  return time >= fault.precursorStart && time <= fault.repairedAt + GRACE_MS;
}

export function score(raises: readonly Raise[], faults: readonly FaultLabel[], eligible: readonly FaultLabel[], evaluatedMs: number): Score {
  const outcomes = new Map<string, FaultOutcome>();
  let foundBefore = 0;
  const leads: number[] = [];
  for (const fault of eligible) {
    const inWindow = raises.filter((raise) => raise.node === fault.node && raise.time >= fault.precursorStart && raise.time <= fault.failure + GRACE_MS);
    const firstRaise = inWindow.length > 0 ? Math.min(...inWindow.map((raise) => raise.time)) : undefined;
    outcomes.set(fault.id, firstRaise === undefined ? {} : { firstRaise });
    if (firstRaise !== undefined && firstRaise < fault.failure) {
      foundBefore += 1;
      leads.push((fault.failure - firstRaise) / MINUTE);
    }
  }
  const falseByNode = new Map<string, Raise[]>();
  for (const raise of raises) {
    if (faults.some((fault) => fault.node === raise.node && explainedBy(fault, raise.time))) continue;
    falseByNode.set(raise.node, [...(falseByNode.get(raise.node) ?? []), raise]);
  }
  const falseStarts: Raise[] = [];
  for (const list of falseByNode.values()) {
    list.sort((a, b) => a.time - b.time);
    list.forEach((raise, index) => {
      if (index === 0 || raise.time - (list[index - 1] as Raise).time > EPISODE_GAP_MS) falseStarts.push(raise);
    });
  }
  const falseEpisodes = falseStarts.length;
  leads.sort((a, b) => a - b);
  const found = [...outcomes.values()].filter((outcome) => outcome.firstRaise !== undefined).length;
  return {
    outcomes,
    eligible: eligible.length,
    found,
    foundBefore,
    medianLeadMinutes: leads.length > 0 ? leads[Math.floor((leads.length - 1) / 2)] : undefined,
    falseEpisodes,
    falseEpisodesPerDay: falseEpisodes / (evaluatedMs / DAY),
    falseStarts: falseStarts.sort((a, b) => a.time - b.time),
  };
}

/** "−12" (minutes before the failure), "+3" (after), or "—" when not found. */
export function leadText(fault: FaultLabel, outcome: FaultOutcome | undefined): string {
  if (outcome?.firstRaise === undefined) return '—';
  const minutes = Math.round((outcome.firstRaise - fault.failure) / MINUTE);
  return minutes <= 0 ? `${minutes === 0 ? '±0' : `−${-minutes}`}` : `+${minutes}`;
}

/** How long after a benign event ends a raise of its node is put down to it. */
export const AFTERMATH_MS = 30 * MINUTE;

/**
 * The benign events (plan.confusers) a false raise of a node can be put down to: those of its
 * node that began at most 5 minutes after the raise and ended at most AFTERMATH_MS before it
 * (a one-sample event ends where it begins; an uneven pipeline stage spans its job). Job-wide
 * phases and warm nodes are not in the list: every node of a job, or every day, shares them.
 */
export function benignAround(confusers: readonly Confuser[], raise: Raise): Confuser['kind'][] {
  const kinds = confusers
    .filter(
      (confuser) =>
        confuser.node === raise.node && confuser.at <= raise.time + 5 * MINUTE && raise.time <= ('to' in confuser ? confuser.to : confuser.at) + AFTERMATH_MS,
    )
    .map((confuser) => confuser.kind);
  return [...new Set(kinds)];
}

/** "loader_stall 2, none 1": false episodes by the benign event they can be put down to. */
export function benignCounts(confusers: readonly Confuser[], falseStarts: readonly Raise[]): string {
  const counts = new Map<string, number>();
  for (const raise of falseStarts) {
    const kinds = benignAround(confusers, raise);
    for (const kind of kinds.length > 0 ? kinds : ['none']) counts.set(kind, (counts.get(kind) ?? 0) + 1);
  }
  return (
    [...counts]
      .sort((a, b) => b[1] - a[1])
      .map(([kind, count]) => `${kind} ${count}`)
      .join(', ') || '—'
  );
}
