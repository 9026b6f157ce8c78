import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { Bocd } from '../../../analyzers/bocd.js';
import { compareGroups } from '../../../analyzers/cross-group.js';
import { detectFailSlow, type FailSlowSample } from '../../../analyzers/failslow/detector.js';
import { estimateIterationPeriod, iterationDurations } from '../../../analyzers/iteration-period.js';
import { RankSlowdownTracker, type ChangePoint } from '../../../analyzers/slowdown-tracker.js';
import { InputError } from '../../../core/errors.js';
import { Topology } from '../../../core/topology.js';
import { seededUniform } from '../../../core/random.js';

const seeded = seededUniform;

function gaussian(random: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
}

/** Iteration seconds: `level(i)` times log-normal jitter, with rare garbage-collection pauses. */
function iterationStream(length: number, seed: number, level: (i: number) => number, jitter = 0.02, pauseRate = 0): number[] {
  const random = seeded(seed);
  return Array.from({ length }, (_, i) => {
    let seconds = level(i) * Math.exp(jitter * gaussian(random));
    if (random() < pauseRate) seconds *= 1.5 + random();
    return seconds;
  });
}

function track(stream: readonly number[], rank = 0): { changes: ChangePoint[]; tracker: RankSlowdownTracker } {
  const tracker = new RankSlowdownTracker(rank);
  const changes: ChangePoint[] = [];
  stream.forEach((seconds, i) => {
    const change = tracker.update(i, seconds);
    if (change) changes.push(change);
  });
  return { changes, tracker };
}

/** Call start times of a rank whose every iteration repeats `pattern` (gaps in seconds), jittered. */
function callTimes(pattern: readonly number[], iterations: number, seed: number, jitter = 0.02, start = 1_700_000_000): number[] {
  const random = seeded(seed);
  const times = [start];
  for (let i = 0; i < iterations; i += 1) {
    for (const gap of pattern) times.push((times[times.length - 1] as number) + gap * Math.exp(jitter * gaussian(random)));
  }
  return times;
}

describe('estimateIterationPeriod (ACF, Greyhound §4.2)', () => {
  it('recovers four calls per iteration and the 1 s period from jittered call times', () => {
    const times = callTimes([0.05, 0.02, 0.9, 0.03], 60, 7);
    const period = estimateIterationPeriod(times);
    expect(period.basis).toBe('acf');
    expect(period.callsPerIteration).toBe(4);
    expect(period.periodSeconds).toBeCloseTo(1.0, 1);
    expect(Math.abs((period.periodSeconds as number) - 1) / 1).toBeLessThan(0.01);
    expect(period.confidence).toBeGreaterThanOrEqual(0.95);
  });

  it('recovers the number of calls and the period for any pattern with one long compute gap', () => {
    const pattern = fc.tuple(
      fc.array(fc.double({ min: 0.005, max: 0.1, noNaN: true }), { minLength: 1, maxLength: 11 }),
      fc.double({ min: 0.5, max: 3, noNaN: true }),
      fc.integer({ min: 1, max: 2 ** 31 }),
    );
    fc.assert(
      fc.property(pattern, ([communication, compute, seed]) => {
        const gaps = [...communication, compute];
        const truth = gaps.reduce((sum, gap) => sum + gap, 0);
        const period = estimateIterationPeriod(callTimes(gaps, 12, seed, 0.01));
        expect(period.callsPerIteration).toBe(gaps.length);
        expect(Math.abs((period.periodSeconds as number) - truth) / truth).toBeLessThan(0.02);
      }),
      { numRuns: 200 },
    );
  });

  it('reads one call per iteration off evenly spaced calls, where the ACF has nothing to find', () => {
    const period = estimateIterationPeriod(callTimes([2.5], 40, 3));
    expect(period).toMatchObject({ basis: 'uniform-gaps', callsPerIteration: 1 });
    expect(period.periodSeconds).toBeCloseTo(2.5, 1);
  });

  it('answers without throwing for too few calls, unsorted calls and non-finite entries', () => {
    expect(estimateIterationPeriod([])).toMatchObject({ basis: 'too-few-calls', callsPerIteration: null, periodSeconds: null, confidence: 0 });
    expect(estimateIterationPeriod([1, 2, 3])).toMatchObject({ basis: 'too-few-calls', callsUsed: 3 });
    const times = callTimes([0.1, 0.7], 30, 11);
    const shuffled = [...times].reverse();
    shuffled.splice(5, 0, Number.NaN, Number.POSITIVE_INFINITY);
    const period = estimateIterationPeriod(shuffled);
    expect(period).toMatchObject({ basis: 'acf', callsPerIteration: 2, callsUsed: times.length, callsIgnored: 2 });
  });

  it('finds no period in calls at random (exponential) gaps', () => {
    const random = seeded(5);
    const times = [0];
    for (let i = 0; i < 400; i += 1) times.push((times[times.length - 1] as number) - Math.log(1 - random()));
    const period = estimateIterationPeriod(times);
    expect(period.basis).toBe('no-period');
    expect(period.callsPerIteration).toBeNull();
    expect(period.confidence).toBeLessThan(0.95);
  });

  it('turns the calls into one duration per iteration for the BOCD tracker', () => {
    const durations = iterationDurations([0, 0.1, 1, 1.1, 2.2, 2.3, 3.3], 2);
    expect(durations.map((d) => d.time)).toEqual([1, 2.2, 3.3]);
    expect(durations.map((d) => d.seconds)).toEqual([1, 2.2 - 1, 3.3 - 2.2]);
  });
});

describe('Bocd', () => {
  it('keeps a normalised posterior within the run-length cap', () => {
    const bocd = new Bocd({ maxRunLengths: 32 });
    for (const seconds of iterationStream(2000, 1, () => 1)) {
      bocd.update(Math.log(seconds));
      expect(bocd.hypotheses).toBeLessThanOrEqual(32);
    }
    const total = bocd.posterior().reduce((sum, entry) => sum + entry.probability, 0);
    expect(total).toBeCloseTo(1, 12);
  });

  it('agrees with the untruncated posterior on the most probable run length through a level shift', () => {
    const stream = iterationStream(600, 2, (i) => (i < 300 ? 1 : 1.3));
    const pruned = new Bocd();
    const exact = new Bocd({ pruneBelow: 0, maxRunLengths: Number.POSITIVE_INFINITY });
    stream.forEach((seconds, i) => {
      pruned.update(Math.log(seconds));
      exact.update(Math.log(seconds));
      if (i >= 305 && i % 5 === 0) expect(pruned.mostProbableRunLength()).toBe(exact.mostProbableRunLength());
    });
    // Only hypotheses whose probability underflowed to 0 are gone from the exact posterior.
    expect(exact.hypotheses).toBeGreaterThan(2 * pruned.hypotheses);
    expect(exact.mostProbableRunLength()).toBe(300);
  });

  it('rejects a non-finite value with an InputError', () => {
    expect(() => new Bocd().update(Number.NaN)).toThrow(InputError);
  });
});

describe('RankSlowdownTracker (BOCD + ≥ 10 % verification, Greyhound §4.2)', () => {
  it('finds a 1.3× slow-down within three iterations of where it began, on every seed', () => {
    for (let seed = 1; seed <= 20; seed += 1) {
      const { changes, tracker } = track(iterationStream(1000, seed, (i) => (i < 500 ? 1 : 1.3)));
      expect(changes).toHaveLength(1);
      const [change] = changes as [ChangePoint];
      expect(Math.abs(change.iteration - 500)).toBeLessThanOrEqual(3);
      expect(change.direction).toBe('slowdown');
      expect(change.ratio).toBeGreaterThan(1.25);
      expect(change.ratio).toBeLessThan(1.35);
      expect(tracker.slow).toBe(true);
      expect(tracker.healthySeconds).toBeCloseTo(1, 1);
    }
  });

  it('reports the recovery and clears the slow mark when the level returns', () => {
    const { changes, tracker } = track(iterationStream(1200, 4, (i) => (i >= 400 && i < 800 ? 1.5 : 1)));
    expect(changes.map((change) => change.direction)).toEqual(['slowdown', 'recovery']);
    expect(Math.abs((changes[1] as ChangePoint).iteration - 800)).toBeLessThanOrEqual(3);
    expect(tracker.slow).toBe(false);
  });

  it('treats a 5 % shift as jitter: the verification drops it', () => {
    for (let seed = 1; seed <= 20; seed += 1) {
      expect(track(iterationStream(1000, seed, (i) => (i < 500 ? 1 : 1.05))).changes).toEqual([]);
    }
  });

  it('reports nothing on long stationary streams with jitter and garbage-collection pauses', () => {
    for (let seed = 100; seed < 110; seed += 1) {
      expect(track(iterationStream(20_000, seed, () => 1, 0.02, 0.005)).changes).toEqual([]);
    }
  });

  it('needs the verification: BOCD alone proposes change points on the same streams, at the pauses', () => {
    let proposals = 0;
    for (let seed = 100; seed < 103; seed += 1) {
      const bocd = new Bocd();
      let proposing = false;
      for (const seconds of iterationStream(20_000, seed, () => 1, 0.02, 0.005)) {
        bocd.update(Math.log(seconds));
        const now = bocd.recentChange(16).probability >= 0.9;
        if (now && !proposing) proposals += 1;
        proposing = now;
      }
    }
    // About one per pause: 3 streams × 20,000 iterations × 0.5 %.
    expect(proposals).toBeGreaterThan(150);
  });
});

describe('compareGroups (cross-group comparison, Greyhound §4.3)', () => {
  // 16 ranks, 2 per node: tp 2, dp 4, pp 2.
  const topology = Topology.from({ nodes: ['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7'], ranksPerNode: 2, tp: 2, dp: 4, pp: 2 });
  const times = (slow: (rank: number) => number): Map<number, number> =>
    new Map(topology.ranks.map(({ rank }) => [rank, (1 + 0.01 * ((rank * 7) % 5)) * slow(rank)]));

  it('finds the one slow DP replica and nothing else when a whole replica is slow', () => {
    const slowGroups = compareGroups(
      times((rank) => (topology.placement(rank).coords.dp === 2 ? 1.25 : 1)),
      topology,
    );
    const replicas = slowGroups.filter((group) => group.kind === 'dp-replica');
    expect(replicas.map((group) => group.index)).toEqual([{ dp: 2 }]);
    expect(replicas[0]?.ratio).toBeGreaterThan(1.15);
    expect(slowGroups.filter((group) => group.kind === 'dp-group')).toEqual([]);
    const stages = slowGroups.filter((group) => group.kind === 'pp-stage').map((group) => group.index);
    expect(stages.sort((a, b) => (a.pp as number) - (b.pp as number))).toEqual([
      { dp: 2, pp: 0 },
      { dp: 2, pp: 1 },
    ]);
  });

  it('pins one slow rank by the intersection of its replica, stage and DP group', () => {
    const slowGroups = compareGroups(
      times((rank) => (rank === 13 ? 1.3 : 1)),
      topology,
    );
    const { coords } = topology.placement(13);
    expect(slowGroups.map((group) => [group.kind, group.index, group.slowestRank])).toEqual(
      expect.arrayContaining([
        ['dp-replica', { dp: coords.dp }, 13],
        ['pp-stage', { dp: coords.dp, pp: coords.pp }, 13],
        ['dp-group', { tp: coords.tp, cp: 0, ep: 0, pp: coords.pp }, 13],
      ]),
    );
    expect(slowGroups).toHaveLength(3);
  });

  it('does not flag a group exactly 10 % above the median: it must exceed it', () => {
    const flat = new Map([
      [0, 1],
      [1, 1],
      [2, 1],
      [3, 1.1],
    ]);
    expect(compareGroups(flat)).toEqual([]);
    flat.set(3, 1.1001);
    expect(compareGroups(flat).map((group) => [group.kind, group.index])).toEqual([['rank', { rank: 3 }]]);
  });
});

describe('detectFailSlow', () => {
  const topology = Topology.from({ nodes: ['n0', 'n1', 'n2', 'n3', 'n4', 'n5', 'n6', 'n7'], ranksPerNode: 2, tp: 2, dp: 4, pp: 2 });

  function samplesWithSlowRank(slowRank: number, from: number): FailSlowSample[] {
    const samples: FailSlowSample[] = [];
    for (const { rank } of topology.ranks) {
      let time = 0;
      iterationStream(600, 1000 + rank, (i) => (rank === slowRank && i >= from ? 1.3 : 1)).forEach((iterationSeconds) => {
        time += iterationSeconds;
        samples.push({ time, rank, iterationSeconds });
      });
    }
    return samples.reverse(); // order of arrival does not matter
  }

  it('reports the slow rank, its verified change point and its groups', () => {
    const report = detectFailSlow(samplesWithSlowRank(5, 300), { topology });
    expect(report.rankCount).toBe(16);
    expect(report.sampleCount).toBe(16 * 600);
    expect(report.changePoints.map((change) => change.rank)).toEqual([5]);
    const [change] = report.changePoints as [ChangePoint];
    expect(Math.abs(change.iteration - 300)).toBeLessThanOrEqual(3);
    expect(change).toMatchObject({ direction: 'slowdown' });
    expect(report.slowRanks).toEqual([5]);
    expect(report.slowGroups.filter((group) => group.kind === 'dp-replica').map((group) => group.index)).toEqual([{ dp: topology.placement(5).coords.dp }]);
    expect(report.ranks[5]).toMatchObject({ rank: 5, samples: 600 });
    expect(report.ranks[5]?.healthySeconds).toBeCloseTo(1, 1);
    expect(report.ranks[5]?.currentSeconds).toBeCloseTo(1.3, 1);
  });

  it('compares ranks with each other when no topology is given', () => {
    const report = detectFailSlow(samplesWithSlowRank(5, 300));
    expect(report.slowGroups.map((group) => [group.kind, group.index])).toEqual([['rank', { rank: 5 }]]);
  });

  it.each([
    { what: 'a negative time', sample: { time: -1, rank: 0, iterationSeconds: 1 }, field: 'samples.1.time' },
    { what: 'a fractional rank', sample: { time: 1, rank: 0.5, iterationSeconds: 1 }, field: 'samples.1.rank' },
    { what: 'a zero iteration time', sample: { time: 1, rank: 0, iterationSeconds: 0 }, field: 'samples.1.iterationSeconds' },
    { what: 'a rank outside the topology', sample: { time: 1, rank: 16, iterationSeconds: 1 }, field: 'samples.1.rank' },
  ])('rejects $what with an InputError naming $field', ({ sample, field }) => {
    let caught: unknown;
    try {
      detectFailSlow([{ time: 0, rank: 0, iterationSeconds: 1 }, sample], { topology });
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(InputError);
    expect((caught as InputError).field).toBe(field);
  });
});
