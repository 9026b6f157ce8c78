import { cpus } from 'node:os';
import { Bocd } from '../analyzers/bocd.js';
import { RankSlowdownTracker, median } from '../analyzers/slowdown-tracker.js';
import { seededUniform } from '../core/random.js';

/**
 * Fail-slow tracking cost (Greyhound §4.2): every rank's iteration time goes through BOCD and
 * the ≥ 10 % verification, one update per rank per iteration.
 *
 * Part 1 feeds STREAMS rank streams round-robin, as a monitor would — one iteration of every
 * rank, then the next — and reports updates per second and the time to absorb one iteration of
 * the whole job, for:
 *   - the tracker (BOCD with at most 64 run-length hypotheses, plus verification),
 *   - BOCD alone with the same cap,
 *   - the sliding-window baseline of Greyhound §7.2: report when an iteration is more than 10 %
 *     off the median of the previous WINDOW ones (cheap, and what BOCD + verification beats on
 *     accuracy in their Table 3).
 * 1 % of the ranks slow down 1.3× at iteration SLOW_FROM; the tracker must find exactly those.
 *
 * Part 2 is the ratio against exact BOCD (no pruning, no cap), whose update costs O(t) after t
 * iterations: per-update time of one stream, measured after HISTORIES iterations of history.
 * Streams are iteration seconds with 2 % log-normal jitter, drawn by a seeded generator.
 */

const STREAMS = 10_000;
const ITERATIONS = 240;
const SLOW_FROM = 120;
const WINDOW = 20;
const HISTORIES = [1_000, 10_000];
const TIMED_UPDATES = 200;

/** seconds[iteration * STREAMS + rank]; every 100th rank slows down 1.3× at SLOW_FROM. */
function jobStreams(): Float64Array {
  const random = seededUniform(2024);
  const seconds = new Float64Array(ITERATIONS * STREAMS);
  for (let iteration = 0; iteration < ITERATIONS; iteration += 1) {
    for (let rank = 0; rank < STREAMS; rank += 1) {
      const noise = Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
      const level = rank % 100 === 0 && iteration >= SLOW_FROM ? 1.3 : 1;
      seconds[iteration * STREAMS + rank] = level * Math.exp(0.02 * noise);
    }
  }
  return seconds;
}

interface Figures {
  readonly name: string;
  readonly seconds: number;
  readonly reports: number;
}

function roundRobin(name: string, seconds: Float64Array, update: (rank: number, iteration: number, value: number) => boolean): Figures {
  let reports = 0;
  const started = process.hrtime.bigint();
  for (let iteration = 0; iteration < ITERATIONS; iteration += 1) {
    for (let rank = 0; rank < STREAMS; rank += 1) {
      if (update(rank, iteration, seconds[iteration * STREAMS + rank] as number)) reports += 1;
    }
  }
  return { name, seconds: Number(process.hrtime.bigint() - started) / 1e9, reports };
}

function windowedBaseline(seconds: Float64Array): Figures {
  const windows = Array.from({ length: STREAMS }, () => new Float64Array(WINDOW));
  return roundRobin(`sliding ${WINDOW}-iteration median, > 10 % off (Greyhound §7.2 baseline)`, seconds, (rank, iteration, value) => {
    const window = windows[rank] as Float64Array;
    const full = iteration >= WINDOW;
    const off = full && Math.abs(value / median(Array.from(window)) - 1) > 0.1;
    window[iteration % WINDOW] = value;
    return off;
  });
}

/** Microseconds per update of one stream after `history` iterations. */
function perUpdateAfter(history: number, options: ConstructorParameters<typeof Bocd>[0]): { micros: number; hypotheses: number } {
  const random = seededUniform(history);
  const next = (): number => 0.02 * Math.sqrt(-2 * Math.log(1 - random())) * Math.cos(2 * Math.PI * random());
  const bocd = new Bocd(options);
  for (let iteration = 0; iteration < history; iteration += 1) bocd.update(next());
  const values = Array.from({ length: TIMED_UPDATES }, next);
  const started = process.hrtime.bigint();
  for (const value of values) bocd.update(value);
  return { micros: Number(process.hrtime.bigint() - started) / 1e3 / TIMED_UPDATES, hypotheses: bocd.hypotheses };
}

function main(): void {
  const cpu = cpus()[0]?.model ?? 'unknown CPU';
  process.stdout.write(`\nFail-slow tracking cost: ${STREAMS} rank streams × ${ITERATIONS} iterations, round-robin, one thread\n`);
  process.stdout.write(`machine: ${cpus().length} × ${cpu}, Node ${process.version}\n\n`);
  const seconds = jobStreams();

  const heapBefore = process.memoryUsage().heapUsed;
  const trackers = Array.from({ length: STREAMS }, (_, rank) => new RankSlowdownTracker(rank));
  const found = new Set<number>();
  let falseChanges = 0;
  const tracker = roundRobin('tracker: BOCD (≤ 64 run lengths) + 10 % verification', seconds, (rank, iteration, value) => {
    const change = (trackers[rank] as RankSlowdownTracker).update(iteration, value);
    if (!change) return false;
    if (rank % 100 === 0 && change.direction === 'slowdown' && Math.abs(change.iteration - SLOW_FROM) <= 3) found.add(rank);
    else falseChanges += 1;
    return true;
  });
  const bytesPerTracker = (process.memoryUsage().heapUsed - heapBefore) / STREAMS;

  const detectors = Array.from({ length: STREAMS }, () => new Bocd());
  const proposing = new Uint8Array(STREAMS);
  const bocdAlone = roundRobin('BOCD alone (≤ 64 run lengths), unverified proposals', seconds, (rank, iteration, value) => {
    const bocd = detectors[rank] as Bocd;
    bocd.update(Math.log(value));
    // A proposal is the posterior turning to "the run began within 16 iterations"; every run
    // is that young during the first 16 iterations, so those do not count.
    const now = iteration > 16 && bocd.recentChange(16).probability >= 0.9;
    const rising = now && proposing[rank] === 0;
    proposing[rank] = now ? 1 : 0;
    return rising;
  });
  const baseline = windowedBaseline(seconds);

  const updates = STREAMS * ITERATIONS;
  process.stdout.write('| detector | updates/s | µs per update | one iteration of all ranks (ms) | reports |\n');
  process.stdout.write('|---|---|---|---|---|\n');
  for (const figures of [tracker, bocdAlone, baseline]) {
    process.stdout.write(
      `| ${figures.name} | ${Math.round(updates / figures.seconds).toLocaleString('en-US')} | ${((figures.seconds / updates) * 1e6).toFixed(2)} | ${((figures.seconds / ITERATIONS) * 1e3).toFixed(1)} | ${figures.reports} |\n`,
    );
  }
  process.stdout.write(
    `\ntracker / sliding-window time: ${(tracker.seconds / baseline.seconds).toFixed(1)}×; about ${Math.round(bytesPerTracker).toLocaleString('en-US')} bytes of heap per tracker\n`,
  );
  const slowRanks = Math.ceil(STREAMS / 100);
  process.stdout.write(`tracker: found ${found.size} of ${slowRanks} slowed ranks within 3 iterations, ${falseChanges} other change points\n`);
  process.stdout.write('(reports: verified change points; BOCD proposals; iterations the sliding window flagged)\n\n');

  process.stdout.write(`| history (iterations) | exact BOCD µs/update (hypotheses after) | pruned BOCD µs/update (hypotheses after) | exact / pruned |\n`);
  process.stdout.write('|---|---|---|---|\n');
  for (const history of HISTORIES) {
    const exact = perUpdateAfter(history, { pruneBelow: 0, maxRunLengths: Number.POSITIVE_INFINITY });
    const pruned = perUpdateAfter(history, {});
    process.stdout.write(
      `| ${history.toLocaleString('en-US')} | ${exact.micros.toFixed(1)} (${exact.hypotheses}) | ${pruned.micros.toFixed(2)} (${pruned.hypotheses}) | ${(exact.micros / pruned.micros).toFixed(0)}× |\n`,
    );
  }
  if (found.size !== slowRanks || falseChanges > 0) process.exitCode = 1;
}

main();
