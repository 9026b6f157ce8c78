import { describe, expect, it } from 'vitest';
import { MultiSignalDetector } from '../../../analyzers/multisignal/detector.js';
import type { FeatureSpec } from '../../../analyzers/multisignal/settings.js';
import type { FeatureMatrix } from '../../../analyzers/multisignal/types.js';

const FEATURES: FeatureSpec[] = [
  { name: 'temperature', direction: 'higher', minSpread: 1 },
  { name: 'power', direction: 'lower', minSpread: 10 },
  { name: 'ecc', direction: 'higher', minSpread: 2, alarmAt: 20 },
  { name: 'xid_fatal', direction: 'higher', minSpread: 0.25, raiseAt: 1 },
];
const MINUTE = 60_000;
const nodes = (count: number, prefix = 'n') => Array.from({ length: count }, (_, index) => `${prefix}${index}`);

/** A busy job: eight GPUs each, small differences. */
function moment(names: string[], change: Record<string, Partial<Record<string, number | number[]>>> = {}): FeatureMatrix {
  return Object.fromEntries(
    names.map((node, index) => [node, { temperature: 62 + (index % 3), power: 650 + 5 * (index % 4), ecc: Array(8).fill(0), xid_fatal: 0, ...change[node] }]),
  );
}

describe('multi-signal detection: what a user relies on', () => {
  it('learns a node that always runs warmer and stops flagging it, yet raises it when it warms further', () => {
    const detector = new MultiSignalDetector({ features: FEATURES });
    const job = nodes(8);
    const warm = { n2: { temperature: 72, power: 600 } };
    let raisedWhileLearnt = 0;
    for (let minute = 0; minute < 240; minute += 1) {
      const evaluation = detector.evaluate(minute * MINUTE, moment(job, warm), { groups: Object.fromEntries(job.map((node) => [node, 'job'])) });
      if (minute >= 60 && evaluation.suspects.length > 0) raisedWhileLearnt += 1;
    }
    expect(raisedWhileLearnt).toBe(0);
    let raised: string[] = [];
    for (let minute = 240; minute < 260; minute += 1)
      raised = detector
        .evaluate(minute * MINUTE, moment(job, { n2: { temperature: 84, power: 520 } }), { groups: Object.fromEntries(job.map((node) => [node, 'job'])) })
        .suspects.map((suspect) => suspect.node);
    expect(raised).toEqual(['n2']);
  });

  it('does not raise a node that usually runs cooler for matching its peers when the whole job idles, yet raises it when it runs hotter than they do', () => {
    const detector = new MultiSignalDetector({ features: FEATURES });
    const job = nodes(8);
    const groups = Object.fromEntries(job.map((node) => [node, 'job']));
    // n5 runs a lighter pipeline stage (or sits in the cold aisle): 13 °C cooler and 60 W lower than its peers while the job trains.
    const training = { n5: { temperature: 50, power: 590 } };
    for (let minute = 0; minute < 120; minute += 1) detector.evaluate(minute * MINUTE, moment(job, training), { groups });
    // The job restarts: every GPU idles at the same temperature and power, n5 with them (for 15 minutes).
    const idle = (names: string[]) =>
      Object.fromEntries(
        Object.entries(moment(names)).map(([node, row], index) => [node, { ...row, temperature: 34 + (index % 3) * 0.2, power: 90 + (index % 2) }]),
      );
    let anomalous = 0;
    for (let minute = 120; minute < 135; minute += 1) {
      const evaluation = detector.evaluate(minute * MINUTE, idle(job), { groups });
      expect(evaluation.suspects).toEqual([]);
      if (evaluation.anomalous.includes('n5')) anomalous += 1;
    }
    expect(anomalous).toBe(0);
    // Back at work, n5 runs 10 °C hotter than its peers and draws less: raised.
    let raised: string[] = [];
    for (let minute = 135; minute < 150; minute += 1)
      raised = detector.evaluate(minute * MINUTE, moment(job, { n5: { temperature: 74, power: 520 } }), { groups }).suspects.map((suspect) => suspect.node);
    expect(raised).toEqual(['n5']);
  });

  it('compares nodes only within their training job, lists nodes of no job, and ignores a phase of a whole job', () => {
    const detector = new MultiSignalDetector({ features: FEATURES, persistence: { k: 1, n: 1 } });
    const a = nodes(6, 'a');
    const b = nodes(6, 'b');
    // Job b is idle (an evaluation phase, a checkpoint): cool and drawing little, all of it.
    const idleB = Object.fromEntries(b.map((node) => [node, { temperature: 40, power: 150 }]));
    const matrix = { ...moment(a), ...moment(b, idleB), spare: { temperature: 35, power: 90, ecc: Array(8).fill(0), xid_fatal: 0 } };
    const evaluation = detector.evaluate(0, matrix, {
      groups: { ...Object.fromEntries(a.map((node) => [node, 'job-a'])), ...Object.fromEntries(b.map((node) => [node, 'job-b'])) },
    });
    expect(evaluation.suspects).toEqual([]);
    expect(evaluation.ungrouped).toEqual(['spare']);
    expect(evaluation.groups.map((group) => [group.group, group.peerScored])).toEqual([
      ['job-a', true],
      ['job-b', true],
      ['', false],
    ]);
    // A third of job a stands out at once: that is the job, not two machines.
    const half = Object.fromEntries(a.slice(0, 2).map((node) => [node, { temperature: 80, power: 300 }]));
    const phase = detector.evaluate(
      MINUTE,
      { ...moment(a, half), ...moment(b) },
      { groups: { ...Object.fromEntries(a.map((node) => [node, 'job-a'])), ...Object.fromEntries(b.map((node) => [node, 'job-b'])) } },
    );
    expect(phase.groups.find((group) => group.group === 'job-a')?.phase).toBe(true);
    expect(phase.suspects).toEqual([]);
  });

  it('scores each GPU: one GPU of eight with climbing ECC counts is not diluted, and an alarm level needs no peers', () => {
    const detector = new MultiSignalDetector({ features: FEATURES, persistence: { k: 2, n: 3 } });
    const job = nodes(6);
    const groups = Object.fromEntries(job.map((node) => [node, 'job']));
    const oneGpu = { n4: { ecc: [0, 0, 0, 25, 0, 0, 0, 0] } };
    detector.evaluate(0, moment(job, oneGpu), { groups });
    const evaluation = detector.evaluate(MINUTE, moment(job, oneGpu), { groups });
    expect(evaluation.suspects.map((suspect) => suspect.node)).toEqual(['n4']);
    expect(evaluation.suspects[0]?.evidence[0]).toMatchObject({ feature: 'ecc', device: 3, value: 25, kind: 'alarm' });
  });

  it('raises a fatal Xid at once, whatever the peers read, on a node of no job too', () => {
    const detector = new MultiSignalDetector({ features: FEATURES });
    const job = nodes(6);
    const evaluation = detector.evaluate(
      0,
      { ...moment(job, { n1: { xid_fatal: 1 } }), lone: { xid_fatal: 2 } },
      { groups: Object.fromEntries(job.map((node) => [node, 'job'])) },
    );
    expect(evaluation.suspects.map((suspect) => [suspect.node, suspect.reason]).sort()).toEqual([
      ['lone', 'raise'],
      ['n1', 'raise'],
    ]);
  });

  it('adds up short episodes that keep coming back, and raises a member that stops reporting while its job reports', () => {
    const detector = new MultiSignalDetector({ features: FEATURES });
    const job = nodes(8);
    const groups = Object.fromEntries(job.map((node) => [node, 'job']));
    const raisedAt: number[] = [];
    for (let minute = 0; minute < 60; minute += 1) {
      const braking: Record<string, Record<string, number>> = minute % 6 < 2 ? { n5: { power: 350, temperature: 70 } } : {};
      if (
        detector.evaluate(minute * MINUTE, moment(job, braking), { groups }).suspects.some((suspect) => suspect.node === 'n5' && suspect.reason === 'episodes')
      )
        raisedAt.push(minute);
    }
    expect(raisedAt.length).toBeGreaterThan(0);

    const quiet = new MultiSignalDetector({ features: FEATURES });
    const present = job.filter((node) => node !== 'n6');
    const reasons: string[][] = [];
    for (let minute = 0; minute < 6; minute += 1)
      reasons.push(
        quiet.evaluate(minute * MINUTE, moment(minute === 0 ? job : present), { groups }).suspects.map((suspect) => `${suspect.node}:${suspect.reason}`),
      );
    expect(reasons.slice(0, 4)).toEqual([[], [], [], []]);
    expect(reasons[4]).toEqual(['n6:silence']);
  });

  it('starts a node back from repair clean: what it showed before it was drained does not raise it again', () => {
    const detector = new MultiSignalDetector({ features: FEATURES, persistence: { k: 3, n: 4 } });
    const job = nodes(8);
    const groups = (members: string[]) => ({ groups: Object.fromEntries(members.map((node) => [node, 'job'])) });
    const stalled = { n3: { temperature: 40, power: 90 } };
    const raisedAt: string[][] = [];
    let minute = 0;
    for (; minute < 5; minute += 1)
      raisedAt.push(detector.evaluate(minute * MINUTE, moment(job, stalled), groups(job)).suspects.map((suspect) => suspect.node));
    expect(raisedAt.at(-1)).toEqual(['n3']);
    // Drained: out of the job and the readings for an hour.
    const others = job.filter((node) => node !== 'n3');
    for (; minute < 65; minute += 1) detector.evaluate(minute * MINUTE, moment(others), groups(others));
    // Back, healthy: not raised on its old evidence.
    expect(detector.evaluate(minute * MINUTE, moment(job), groups(job)).suspects).toEqual([]);
    // A scrape gap shorter than the persistence window keeps the verdicts of a node that was failing.
    for (minute += 1; minute < 72; minute += 1) detector.evaluate(minute * MINUTE, moment(job, stalled), groups(job));
    detector.evaluate(minute * MINUTE, moment(others), groups(others));
    minute += 1;
    expect(detector.evaluate(minute * MINUTE, moment(job, stalled), groups(job)).suspects.map((suspect) => suspect.node)).toEqual(['n3']);
  });
});
