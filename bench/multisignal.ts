import { cpus } from 'node:os';
import { performance } from 'node:perf_hooks';
import { MultiSignalDetector } from '../analyzers/multisignal/detector.js';
import type { FeatureMatrix } from '../analyzers/multisignal/types.js';
import { detectorFeatures } from '../analyzers/multisignal/features.js';
import { DEFAULT_THRESHOLDS } from '../rules/thresholds.js';
import { ClusterReplay, DEFAULT_REPLAY } from './multisignal/cluster-replay.js';
import { ThresholdBaseline, XidCounterBaseline, runReplay, type ReplayReport, type SuspectDetector } from './multisignal/evaluation.js';
import { REPLAY_FEATURES } from './multisignal/labels.js';

/**
 * The multi-signal detector (analyzers/multisignal/detector.ts) on the labelled replay
 * (bench/multisignal/): 63 nodes in three training jobs (24, 16, 16) and 7 idle, 14 days, one
 * sample a minute, 15 faults per seed of seven kinds in turn (thermal, memory, PCIe, slowdown,
 * sudden, power brake, hang: a hang logs no Xid, its node goes silent; its "Xid" time is the
 * labelled failure). The confusers: per-job phases and job-wide slowdowns, nodes that are simply
 * different, one-node blips (application Xids included), benign transients, scrape gaps, nodes
 * returning from repair. Seed 1 is the seed the detector's defaults were tuned on and is shown
 * apart; seeds 2-5 were not looked at while tuning. Two baselines run on the same frames in the
 * same pass: the Xid counter alone, and the SteadfastGpuTemperatureHigh rule's threshold and
 * `for:` (rules/thresholds.ts). The 504-GPU report's own figures (002: 10/10 found, 2/10 before
 * the Xid, ~0.84 false positives a day on 63 nodes) come from a real cluster and another method;
 * they are the targets, not a like-for-like comparison.
 */

const TUNING_SEED = 1;
const HELD_OUT_SEEDS = [2, 3, 4, 5];
const DETECTORS = ['multi-signal', 'Xid counter alone', 'temperature threshold'] as const;

function minutesOf(duration: string): number {
  const match = /^(\d+)(s|m|h)$/.exec(duration);
  if (!match) throw new Error(`cannot read duration ${duration}`);
  return Number(match[1]) * ({ s: 1 / 60, m: 1, h: 60 } as Record<string, number>)[match[2] as string]!;
}

function detectors(): SuspectDetector[] {
  const gpu = DEFAULT_THRESHOLDS.gpu;
  return [
    new MultiSignalDetector({ features: detectorFeatures() }),
    new XidCounterBaseline(),
    new ThresholdBaseline(REPLAY_FEATURES.temp, gpu.temperatureCelsius, Math.round(minutesOf(gpu.temperatureFor) / (DEFAULT_REPLAY.stepSeconds / 60))),
  ];
}

const fixed = (value: number | undefined, digits = 1) => (value === undefined ? '—' : value.toFixed(digits));

function row(label: string, name: string, reports: readonly ReplayReport[]): string {
  const faults = reports.flatMap((report) => report.faults);
  const leads = faults.flatMap((fault) => (fault.leadMinutes === undefined ? [] : [fault.leadMinutes])).sort((a, b) => a - b);
  const found = leads.length;
  const before = leads.filter((lead) => lead > 0).length;
  const falseEpisodes = reports.reduce((sum, report) => sum + report.falseEpisodes, 0);
  const onBenign = reports.reduce((sum, report) => sum + report.falseEpisodesOnBenignTransients, 0);
  const nodeDays = reports.reduce((sum, report) => sum + report.nodeDays, 0);
  const middle = leads.length >> 1;
  const median = leads.length === 0 ? undefined : leads.length % 2 ? leads[middle] : ((leads[middle - 1] as number) + (leads[middle] as number)) / 2;
  const mean = leads.length === 0 ? undefined : leads.reduce((sum, lead) => sum + lead, 0) / leads.length;
  const perNodeDay = falseEpisodes / nodeDays;
  return `| ${label} | ${name} | ${found}/${faults.length} | ${before}/${faults.length} (${((100 * before) / faults.length).toFixed(0)} %) | ${fixed(median)} | ${fixed(mean)} | ${falseEpisodes} (${onBenign}) | ${perNodeDay.toFixed(4)} | ${(perNodeDay * 63).toFixed(2)} |\n`;
}

/** Evaluations per second of the detector alone on `matrix`, repeated (time advancing a minute each). */
function throughput(matrix: FeatureMatrix, evaluations: number): number {
  const detector = new MultiSignalDetector({ features: detectorFeatures() });
  for (let warm = 0; warm < 200; warm += 1) detector.evaluate(warm * 60_000, matrix);
  const started = performance.now();
  for (let index = 0; index < evaluations; index += 1) detector.evaluate((200 + index) * 60_000, matrix);
  return evaluations / ((performance.now() - started) / 1000);
}

function main(): void {
  const out = (text: string) => process.stdout.write(text);
  out(
    `\nMulti-signal suspect detection on the labelled replay: ${DEFAULT_REPLAY.nodes} nodes, ${DEFAULT_REPLAY.days} days a seed, one sample every ${DEFAULT_REPLAY.stepSeconds} s, ${DEFAULT_REPLAY.faults} faults a seed\n`,
  );
  out(`machine: ${cpus().length} × ${cpus()[0]?.model ?? 'unknown CPU'}, Node ${process.version}\n\n`);
  out(
    'Lead = minutes from the first raise to the Xid (negative: after it). False episodes: raises on nodes with no fault at the time, one per episode (raises < 15 min apart), in brackets those on a labelled benign transient.\n\n',
  );
  out(
    '| seeds | detector | found | found before Xid | median lead (min) | mean lead (min) | false episodes (benign) | FP / node-day | FP / day on 63 nodes |\n',
  );
  out('|---|---|---|---|---|---|---|---|---|\n');

  const bySeed = new Map<number, ReplayReport[]>();
  let lastFrame: FeatureMatrix = {};
  for (const seed of [TUNING_SEED, ...HELD_OUT_SEEDS]) {
    const replay = new ClusterReplay({ seed });
    const reports = runReplay(replay, detectors());
    bySeed.set(seed, reports);
    const label = seed === TUNING_SEED ? `${seed} (tuning)` : `${seed}`;
    reports.forEach((report, index) => out(row(label, DETECTORS[index] as string, [report])));
    if (seed === TUNING_SEED) for (const frame of new ClusterReplay({ seed, days: 0.01, faults: 0 }).frames()) lastFrame = frame.matrix;
  }
  DETECTORS.forEach((name, index) =>
    out(
      row(
        `${HELD_OUT_SEEDS.join(', ')} together`,
        name,
        HELD_OUT_SEEDS.map((seed) => (bySeed.get(seed) as ReplayReport[])[index] as ReplayReport),
      ),
    ),
  );
  out('| 504-GPU report (002), real cluster, 55 days | its own method | 10/10 | 2/10 (20 %) | — | — | — | ≈ 0.0133 | ≈ 0.84 |\n');

  const byKind = (reports: readonly ReplayReport[]) => {
    const kinds = new Map<string, { found: number; before: number; total: number }>();
    for (const fault of reports.flatMap((report) => report.faults)) {
      const entry = kinds.get(fault.kind) ?? { found: 0, before: 0, total: 0 };
      entry.total += 1;
      if (fault.leadMinutes !== undefined) entry.found += 1;
      if ((fault.leadMinutes ?? 0) > 0) entry.before += 1;
      kinds.set(fault.kind, entry);
    }
    return [...kinds].map(([kind, entry]) => `${kind} ${entry.found}/${entry.total} found, ${entry.before} before the Xid`).join('; ');
  };
  out(`\nMulti-signal, tuning seed, by fault kind: ${byKind([(bySeed.get(TUNING_SEED) as ReplayReport[])[0] as ReplayReport])}`);
  const fewer = [TUNING_SEED, ...HELD_OUT_SEEDS].filter((seed) => {
    const [multi, xid] = bySeed.get(seed) as ReplayReport[];
    return (multi?.found ?? 0) < (xid?.found ?? 0);
  });
  out(`\nSeeds where multi-signal found fewer faults than the Xid counter alone: ${fewer.length === 0 ? 'none' : fewer.join(', ')}`);
  out(`\nMulti-signal, held-out seeds, by fault kind: ${byKind(HELD_OUT_SEEDS.map((seed) => (bySeed.get(seed) as ReplayReport[])[0] as ReplayReport))}`);

  const inReplay = [...bySeed.values()].map((reports) => reports[0] as ReplayReport);
  const replayRate = inReplay.reduce((sum, report) => sum + report.evaluations, 0) / (inReplay.reduce((sum, report) => sum + report.evaluateMs, 0) / 1000);
  // 16 copies of one 63-node moment.
  const wide = Object.fromEntries(
    Array.from({ length: 16 }, (_, copy) => Object.entries(lastFrame).map(([node, values]) => [`${node}-${copy}`, values] as const)).flat(),
  );
  out(
    `\n\nDetector throughput (evaluate() alone, ${detectorFeatures().length} features): ${replayRate.toFixed(0)} evaluations/s over the replays at 63 nodes; `,
  );
  out(
    `${throughput(lastFrame, 5_000).toFixed(0)}/s on one 63-node moment repeated; ${throughput(wide, 500).toFixed(0)}/s at ${Object.keys(wide).length} nodes.\n`,
  );
}

main();
