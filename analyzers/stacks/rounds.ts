import type { StackAggregation, SuspectKind } from './aggregate.js';

/**
 * Fail-slow mode of stack aggregation (ByteRobust §5.1): when MFU declines the job still runs, so
 * one snapshot of stacks catches the slow machine only by chance. Aggregation is repeated every
 * 10 s; each round flags the parallel group with the most outliers (the round's suspect group,
 * see findSuspectGroup), and after 5 rounds the group flagged most often is the degrader to
 * over-evict. Pure: the caller takes the snapshots and feeds one aggregation per round.
 */

/** ByteRobust §5.1: rounds every 10 s, verdict over 5 rounds. */
export const FAIL_SLOW_ROUNDS = 5;
export const FAIL_SLOW_ROUND_INTERVAL_SECONDS = 10;

export interface FlaggedGroupCount {
  readonly kind: SuspectKind;
  /** Ranks of the groups of this kind flagged on these machines (e.g. both TP halves of one pipeline). */
  readonly ranks: readonly number[];
  readonly nodes: readonly string[];
  /** Rounds, within the window, that flagged this group. */
  readonly flags: number;
  /** Outliers it covered, summed over those rounds. */
  readonly outliers: number;
  /** Index (from 0, over all rounds ever added) of the first round in the window that flagged it. */
  readonly firstRound: number;
}

export interface FailSlowVerdict {
  readonly roundsSeen: number;
  readonly roundsNeeded: number;
  /** Rounds in the window that found no outliers. */
  readonly quietRounds: number;
  /** Most flags first, then most outliers, then flagged earliest. */
  readonly counts: readonly FlaggedGroupCount[];
  /** Named once a full window of rounds is in; null before, or when no round flagged anything. */
  readonly degrader: FlaggedGroupCount | null;
  /** The degrader's machines. */
  readonly evict: readonly string[];
}

interface Round {
  readonly index: number;
  readonly flagged: { key: string; kind: SuspectKind; ranks: readonly number[]; nodes: readonly string[]; outliers: number } | null;
}

/**
 * Keeps the last `rounds` rounds (a sliding window): a job that stays slow keeps being judged on
 * its most recent 50 s, and a new round can change the verdict as the evidence changes.
 */
export class FailSlowRounds {
  private readonly window: Round[] = [];
  private added = 0;

  constructor(private readonly rounds: number = FAIL_SLOW_ROUNDS) {
    if (!Number.isInteger(rounds) || rounds < 1) throw new RangeError(`rounds must be a whole number of at least 1, got ${rounds}`);
  }

  /** Records one round's aggregation and returns the verdict so far. */
  add(result: StackAggregation): FailSlowVerdict {
    const suspect = result.suspectGroup;
    this.window.push({
      index: this.added,
      flagged:
        suspect === null
          ? null
          : {
              // Eviction is per machine: the two TP halves of one pipeline on the same machines are
              // one suspect, so a flag is keyed by kind and machines, not by ranks.
              key: `${suspect.kind}:${[...suspect.nodes].sort().join(',')}`,
              kind: suspect.kind,
              ranks: suspect.ranks,
              nodes: suspect.nodes,
              outliers: suspect.coveredOutliers,
            },
    });
    this.added += 1;
    if (this.window.length > this.rounds) this.window.shift();
    return this.verdict();
  }

  verdict(): FailSlowVerdict {
    const counts = new Map<string, FlaggedGroupCount>();
    let quietRounds = 0;
    for (const round of this.window) {
      const flagged = round.flagged;
      if (flagged === null) {
        quietRounds += 1;
        continue;
      }
      const seen = counts.get(flagged.key);
      counts.set(flagged.key, {
        kind: flagged.kind,
        ranks: seen ? [...new Set([...seen.ranks, ...flagged.ranks])].sort((a, b) => a - b) : flagged.ranks,
        nodes: flagged.nodes,
        flags: (seen?.flags ?? 0) + 1,
        outliers: (seen?.outliers ?? 0) + flagged.outliers,
        firstRound: seen?.firstRound ?? round.index,
      });
    }
    const ordered = [...counts.values()].sort((a, b) => b.flags - a.flags || b.outliers - a.outliers || a.firstRound - b.firstRound);
    const complete = this.window.length >= this.rounds;
    const degrader = complete ? (ordered[0] ?? null) : null;
    return {
      roundsSeen: this.added,
      roundsNeeded: this.rounds,
      quietRounds,
      counts: ordered,
      degrader,
      evict: degrader?.nodes ?? [],
    };
  }
}
