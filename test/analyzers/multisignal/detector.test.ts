import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { MultiSignalDetector, scoreMoment } from '../../../analyzers/multisignal/detector.js';
import { multiSignalSettings, type FeatureSpec, type MultiSignalOptions } from '../../../analyzers/multisignal/settings.js';
import type { Evaluation, FeatureMatrix } from '../../../analyzers/multisignal/types.js';
import { InputError } from '../../../core/errors.js';
import { peerAnomalous } from '../../../analyzers/multisignal/scoring.js';

const FEATURES: FeatureSpec[] = [
  { name: 'temperature', direction: 'higher', minSpread: 1 },
  { name: 'power', direction: 'lower', minSpread: 10 },
  { name: 'iteration', direction: 'higher', minSpread: 0.02 },
  { name: 'clock_skew', direction: 'both', minSpread: 5 },
];

/** A healthy fleet: every node near the same values, with a small spread (MAD > 0). */
function fleet(nodes = 10): Record<string, Record<string, number | undefined>> {
  const matrix: Record<string, Record<string, number | undefined>> = {};
  for (let index = 0; index < nodes; index += 1) {
    const wobble = (index % 5) - 2; // -2..2
    matrix[`n${index}`] = { temperature: 62 + wobble, power: 650 + 8 * wobble, iteration: 4.2 + 0.01 * wobble, clock_skew: 3 * wobble };
  }
  return matrix;
}

/** `node` changed by `changes` in a copy of `matrix`. */
function withNode(matrix: FeatureMatrix, node: string, changes: Record<string, number | undefined>): FeatureMatrix {
  return { ...matrix, [node]: { ...matrix[node], ...changes } };
}

const immediate: Partial<MultiSignalOptions> = { persistence: { k: 1, n: 1 } };

function detector(options: Partial<MultiSignalOptions> = {}): MultiSignalDetector {
  return new MultiSignalDetector({ features: FEATURES, ...options });
}

describe('multi-signal scoring against the peers', () => {
  it('does not raise a node that is moderately off on one feature only, but does when that one feature is far off', () => {
    const settings = multiSignalSettings({ features: FEATURES });
    const mild = scoreMoment(withNode(fleet(), 'n3', { temperature: 72 }), settings).nodes.find((score) => score.node === 'n3');
    // The feature is hot and shows as evidence, but one metric a few σ off stays below the combination rule.
    expect(mild?.evidence.map((item) => item.feature)).toEqual(['temperature']);
    expect(mild && peerAnomalous(mild, settings)).toBe(false);
    const watching = detector();
    for (let minute = 0; minute < 10; minute += 1)
      expect(watching.evaluate(minute * 60_000, withNode(fleet(), 'n3', { temperature: 72 })).suspects).toEqual([]);
    // One strong signal is enough (strongZ): 200 °C among 62 °C peers.
    expect(
      detector(immediate)
        .evaluate(0, withNode(fleet(), 'n3', { temperature: 200 }))
        .suspects.map((suspect) => suspect.node),
    ).toEqual(['n3']);
  });

  it('raises a node that deviates on several features, with evidence naming each of them', () => {
    const matrix = withNode(fleet(), 'n7', { temperature: 75, power: 520, iteration: 4.2 });
    const result = detector(immediate).evaluate(0, matrix);
    expect(result.suspects.map((suspect) => suspect.node)).toEqual(['n7']);
    const [suspect] = result.suspects;
    expect(suspect?.evidence.map((item) => item.feature).sort()).toEqual(['power', 'temperature']);
    const power = suspect?.evidence.find((item) => item.feature === 'power');
    expect(power).toMatchObject({ value: 520, peerMedian: 646 }); // the median of all ten nodes, n7 included
    expect(power?.robustZ).toBeLessThan(-3.5); // below the peers: the bad side for power
    expect(suspect?.score).toBeGreaterThanOrEqual(8);
    expect(suspect?.score).toBeLessThanOrEqual(12); // two features, each clipped at 6
  });

  it('ignores deviations in the harmless direction', () => {
    const matrix = withNode(fleet(), 'n2', { temperature: 40, power: 900, iteration: 3 });
    expect(detector(immediate).evaluate(0, matrix).suspects).toEqual([]);
  });

  it('counts a two-sided feature on either side', () => {
    const matrix = withNode(fleet(), 'n4', { clock_skew: -80, iteration: 6 });
    expect(
      detector(immediate)
        .evaluate(0, matrix)
        .suspects.map((suspect) => suspect.node),
    ).toEqual(['n4']);
  });

  it('does not blow up tiny differences on a flat fleet (MAD 0): the spread floor holds', () => {
    const flat: Record<string, Record<string, number>> = {};
    for (let index = 0; index < 8; index += 1) flat[`n${index}`] = { temperature: 60, power: 650, iteration: 4.2, clock_skew: 0 };
    const nudged = withNode(flat, 'n0', { temperature: 60.5, power: 640, iteration: 4.25, clock_skew: 4 });
    const moment = scoreMoment(nudged, multiSignalSettings({ features: FEATURES }));
    expect(moment.nodes.find((score) => score.node === 'n0')).toMatchObject({ score: 0, hotFeatures: 0, evidence: [] });
    // The same fleet still raises a node that is far off by the floors' measure.
    const broken = withNode(flat, 'n0', { temperature: 70, power: 560 });
    expect(
      detector(immediate)
        .evaluate(0, broken)
        .suspects.map((suspect) => suspect.node),
    ).toEqual(['n0']);
  });

  it('gives no verdict with fewer nodes than minPeers, and drops features too few nodes report', () => {
    const small = withNode(fleet(4), 'n1', { temperature: 120, power: 100, iteration: 30 });
    const result = detector(immediate).evaluate(0, small);
    expect(result.suspects).toEqual([]);
    expect(result.skipped).toMatch(/4 of 4 node\(s\) reported; at least 5/);
    expect(result.groups).toMatchObject([{ group: 'all', peerScored: false }]);

    // Ten nodes, but only four report the iteration time: that feature cannot count.
    const sparse: Record<string, Record<string, number | undefined>> = fleet(10);
    for (const node of Object.keys(sparse).slice(4)) sparse[node] = { ...sparse[node], iteration: undefined };
    const hot = withNode(sparse, 'n0', { temperature: 68, iteration: 40 });
    const sparseResult = detector(immediate).evaluate(0, hot);
    expect(sparseResult.skippedFeatures).toEqual(['iteration']);
    expect(sparseResult.suspects).toEqual([]);
  });

  it('tolerates missing and non-finite values: a node is judged on what it reports', () => {
    const matrix = withNode(withNode(fleet(), 'n5', { temperature: undefined, clock_skew: Number.NaN }), 'n6', {
      power: 500,
      iteration: 5,
      temperature: Number.POSITIVE_INFINITY,
    });
    const result = detector(immediate).evaluate(0, matrix);
    expect(result.suspects.map((suspect) => suspect.node)).toEqual(['n6']);
    expect(result.suspects[0]?.evidence.map((item) => item.feature).sort()).toEqual(['iteration', 'power']);
  });
});

describe('persistence: raised after k anomalous evaluations of the last n', () => {
  const anomalous = withNode(fleet(), 'n1', { temperature: 80, power: 450 });
  const healthy = fleet();
  const raisedAt = (evaluation: Evaluation) => evaluation.suspects.map((suspect) => suspect.node);

  it('raises on the k-th anomalous evaluation within n, through a dip, and releases below k', () => {
    const watching = detector({ persistence: { k: 3, n: 5 } });
    const pattern = [anomalous, healthy, anomalous, healthy, anomalous, healthy, healthy];
    const raised = pattern.map((matrix, minute) => raisedAt(watching.evaluate(minute * 60_000, matrix)));
    expect(raised).toEqual([[], [], [], [], ['n1'], [], []]);
  });

  it('reports when the episode started and in how many of the last n evaluations the node was anomalous', () => {
    const watching = detector({ persistence: { k: 2, n: 4 } });
    watching.evaluate(0, anomalous);
    const second = watching.evaluate(60_000, anomalous);
    const third = watching.evaluate(120_000, healthy);
    expect(second.suspects[0]).toMatchObject({ node: 'n1', since: 60_000, anomalousIn: 2 });
    // Still 2 of the last 4: still raised, since unchanged, evidence from the last anomalous moment.
    expect(third.suspects[0]).toMatchObject({ node: 'n1', since: 60_000, anomalousIn: 2 });
    expect(third.suspects[0]?.evidence.map((item) => item.feature).sort()).toEqual(['power', 'temperature']);
    expect(third.anomalous).toEqual([]);
  });

  it('counts an evaluation repeated at the same time once (a retried job)', () => {
    const watching = detector({ persistence: { k: 2, n: 3 } });
    expect(raisedAt(watching.evaluate(0, anomalous))).toEqual([]);
    expect(raisedAt(watching.evaluate(0, anomalous))).toEqual([]);
    expect(raisedAt(watching.evaluate(60_000, anomalous))).toEqual(['n1']);
  });

  it('refuses time going backwards, and counts a moment with too few peers as no evidence', () => {
    const watching = detector({ persistence: { k: 2, n: 3 } });
    watching.evaluate(60_000, anomalous);
    expect(() => watching.evaluate(0, anomalous)).toThrow(InputError);
    expect(watching.evaluate(120_000, fleet(3)).skipped).toBeDefined();
    expect(raisedAt(watching.evaluate(180_000, anomalous))).toEqual(['n1']);
  });
});

describe('detector options', () => {
  it('refuses bad options with a message naming the field', () => {
    expect(() => detector({ persistence: { k: 4, n: 3 } })).toThrow(/persistence: k must not exceed n/);
    expect(() => detector({ hotZ: 7, clipZ: 6 })).toThrow(/clipZ: clipZ must be at least hotZ/);
    expect(() => new MultiSignalDetector({ features: [...FEATURES, { name: 'power', direction: 'lower', minSpread: 1 }] })).toThrow(
      /features: feature names must be unique/,
    );
    expect(() => new MultiSignalDetector({ features: [{ name: 'x', direction: 'up' as 'higher', minSpread: 1 }] })).toThrow(InputError);
    expect(() => new MultiSignalDetector({ features: [{ name: 'x', direction: 'higher', minSpread: 0 }] })).toThrow(/features\.0\.minSpread/);
  });
});

describe('verdicts do not depend on units or on node order (property)', () => {
  // Mostly a tight fleet, some wild values, some gaps: enough for nodes to be raised now and then.
  // Wild values stay rare: where more than 30 % of a fleet stands out at once the detector takes
  // it for a job-wide phase and raises nobody, which would leave the properties little to compare.
  const value = fc.oneof(
    { arbitrary: fc.integer({ min: 95, max: 105 }), weight: 12 },
    { arbitrary: fc.integer({ min: -1000, max: 1000 }), weight: 2 },
    { arbitrary: fc.constant(undefined), weight: 1 },
  );
  const row = fc.record({ temperature: value, power: value, iteration: value, clock_skew: value });
  const fleets = fc.array(row, { minLength: 3, maxLength: 14 });
  const frames = fc.array(fleets, { minLength: 2, maxLength: 4 });
  /** Powers of two: scaling by them is exact in floating point, so the comparison can be exact. */
  const factors = fc.tuple(...FEATURES.map(() => fc.integer({ min: -8, max: 8 }).map((exponent) => 2 ** exponent)));

  const asMatrix = (rows: readonly Record<string, number | undefined>[], scale: readonly number[] = FEATURES.map(() => 1)): FeatureMatrix =>
    Object.fromEntries(
      rows.map((values, index) => [
        `node-${index}`,
        Object.fromEntries(
          FEATURES.map((feature, at) => [
            feature.name,
            values[feature.name] === undefined ? undefined : (values[feature.name] as number) * (scale[at] as number),
          ]),
        ),
      ]),
    );
  const verdicts = (evaluation: Evaluation) =>
    evaluation.suspects.map((suspect) => ({ node: suspect.node, score: suspect.score, z: suspect.evidence.map((item) => [item.feature, item.robustZ]) }));
  const run = (matrices: readonly FeatureMatrix[], features: FeatureSpec[]) => {
    const watching = new MultiSignalDetector({ features, persistence: { k: 2, n: 3 } });
    return matrices.map((matrix, minute) => verdicts(watching.evaluate(minute * 60_000, matrix)));
  };

  it('scaling each feature (and its spread floor) by one factor for every node changes no verdict', () => {
    fc.assert(
      fc.property(frames, factors, (rowsPerFrame, scale) => {
        const scaledFeatures = FEATURES.map((feature, at) => ({ ...feature, minSpread: feature.minSpread * (scale[at] as number) }));
        expect(
          run(
            rowsPerFrame.map((rows) => asMatrix(rows, scale)),
            scaledFeatures,
          ),
        ).toEqual(
          run(
            rowsPerFrame.map((rows) => asMatrix(rows)),
            FEATURES,
          ),
        );
      }),
      { numRuns: 200 },
    );
  });

  it('permuting the order in which nodes are listed changes no verdict', () => {
    fc.assert(
      fc.property(frames, fc.infiniteStream(fc.nat()), (rowsPerFrame, randoms) => {
        const original = rowsPerFrame.map((rows) => asMatrix(rows));
        const shuffled = original.map((matrix) => {
          const entries = Object.entries(matrix);
          for (let index = entries.length - 1; index > 0; index -= 1) {
            const other = (randoms.next().value as number) % (index + 1);
            [entries[index], entries[other]] = [entries[other] as [string, FeatureMatrix[string]], entries[index] as [string, FeatureMatrix[string]]];
          }
          return Object.fromEntries(entries);
        });
        expect(run(shuffled, FEATURES)).toEqual(run(original, FEATURES));
      }),
      { numRuns: 200 },
    );
  });

  it('the generated fleets do raise nodes, so the properties are not vacuous', () => {
    const raised = fc.sample(frames, { numRuns: 300, seed: 42 }).filter((rowsPerFrame) =>
      run(
        rowsPerFrame.map((rows) => asMatrix(rows)),
        FEATURES,
      ).some((frame) => frame.length > 0),
    );
    expect(raised.length).toBeGreaterThan(10);
  });
});
