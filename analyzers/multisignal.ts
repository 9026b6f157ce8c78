import { z } from 'zod';
import { InputError } from '../core/errors.js';
import { parseOrThrow } from '../core/validate.js';

/**
 * Multi-signal "suspect node" detection, after the 504-GPU operations report (002, first finding):
 * its statistical analysis over hundreds of Prometheus metrics found all 10 Xid-identified GPU
 * failures of a 63-node cluster, 2 of them before the Xid, at about 0.84 false positives a day,
 * and no single metric was dominant across failure types. So a node is judged on many signals at
 * once (GPU, Xid, RDMA, NFS, training), each against its peers at the same moment, and no one
 * signal can raise it alone.
 *
 * Why peers and not the node's own history: a synchronous training job puts the same load on
 * every node, so what moves the whole fleet at once (diurnal inlet temperature, evaluation
 * phases, a checkpoint stall on NFS, the 002 report's bandwidth paradox) is common mode and says
 * nothing about one machine, while a node that drifts away from its peers does.
 *
 * Per moment and feature:
 *  - peer median m and MAD (median absolute deviation) over the nodes that report the feature;
 *  - scale s = max(1.4826·MAD, relativeSpread·|m|, minSpread). 1.4826·MAD estimates σ for normal
 *    data; the two floors keep a flat fleet (MAD 0, e.g. all 0 errors or identical clocks) from
 *    turning a tiny or unit-sized difference into a huge z;
 *  - robust z = (value − m) / s, and its "badness" in the feature's bad direction (a power drop
 *    is bad, a power rise is not).
 * Combination: a feature is "hot" at badness ≥ hotZ; the node's moment score is the sum of its hot
 * features' badness, each clipped at clipZ. The node is anomalous at this moment when it has at
 * least minHotFeatures hot features and a score ≥ minScore. Clipping bounds what one metric can
 * add (an error counter jumping from 0 to 1 000 counts no more than a clear 6σ deviation), and
 * counting hot features means one metric, however extreme, never raises a node alone (002: no
 * single metric dominant). Only hot features are summed: adding every sub-threshold z of a dozen
 * features would add up the fleet's ordinary spread.
 *
 * Persistence: a node is raised (a suspect) once it was anomalous in k of the last n evaluations.
 * Benign one-node blips (a dataloader hiccup, one late checkpoint writer, a power sag) last one to
 * a few scrapes; precursors of a failure and the aftermath of an Xid last tens of minutes. k of n
 * rather than k in a row, because a precursor that grows near the threshold flickers across it and
 * a consecutive count would start over at every dip. At one evaluation a minute the default 7 of 9
 * outlasts blips of up to five minutes and their chance overlap with a late checkpoint writer,
 * forgives two dips, and costs seven minutes of delay. Chosen on the labelled replay's tuning seed
 * (bench/multisignal/cluster-replay.ts, seed 1, 14 days, 63 nodes): 4 of 6 raised 3.5 false episodes
 * a day, 5 of 7 1.4, 6 of 8 and 7 of 9 0.51, all of those on labelled benign transients; 8 of 10
 * lost one of the 8 (of 15) faults found before their Xid. 7 rather than 6 of 8 for margin: on
 * an earlier version of the replay 6 of 8 still let through chance overlaps of two benign blips.
 * bench/multisignal.ts reports seeds that were not used for the choice.
 */

export const DIRECTIONS = ['higher', 'lower', 'both'] as const;
/** Which deviations from the peers are bad: above them, below them, or either way. */
export type Direction = (typeof DIRECTIONS)[number];

export const featureSpecSchema = z
  .object({
    name: z.string().min(1).max(128),
    direction: z.enum(DIRECTIONS),
    /** Smallest scale, in the feature's own units: the difference that counts as one "σ" on a flat fleet. */
    minSpread: z.number().positive(),
    /** Smallest scale as a share of |peer median|; the detector's default when left out. */
    relativeSpread: z.number().min(0).optional(),
  })
  .strict();

export type FeatureSpec = z.input<typeof featureSpecSchema>;

const optionsSchema = z
  .object({
    features: z
      .array(featureSpecSchema)
      .min(1)
      .refine((features) => new Set(features.map((feature) => feature.name)).size === features.length, 'feature names must be unique'),
    /**
     * Fewest nodes that must report a feature (and that the matrix must hold) for any verdict.
     * The median and MAD stay put while fewer than half the values are wild; with 5 nodes two
     * deviating ones still leave the reference among the healthy three. Below that a node's own
     * value is a third or more of its reference, the MAD of three or four values is often 0 or
     * a fluke, and with two nodes there is no telling which of them is the odd one.
     */
    minPeers: z.int().min(3).default(5),
    hotZ: z.number().positive().default(3.5),
    clipZ: z.number().positive().default(6),
    minHotFeatures: z.int().min(1).default(2),
    minScore: z.number().min(0).default(8),
    persistence: z
      .object({ k: z.int().min(1), n: z.int().min(1).max(1000) })
      .strict()
      .refine((value) => value.k <= value.n, 'k must not exceed n')
      .default({ k: 7, n: 9 }),
    /** relativeSpread of features that do not set their own. */
    relativeSpread: z.number().min(0).default(0.01),
  })
  .strict()
  .refine((options) => options.clipZ >= options.hotZ, { message: 'clipZ must be at least hotZ', path: ['clipZ'] });

export type MultiSignalOptions = z.input<typeof optionsSchema>;
export type MultiSignalSettings = z.output<typeof optionsSchema>;

/** One moment's readings: node → feature → value; a missing or non-finite value is simply absent. */
export type FeatureValues = Readonly<Record<string, number | undefined>>;
export type FeatureMatrix = Readonly<Record<string, FeatureValues>>;

export interface Evidence {
  readonly feature: string;
  readonly value: number;
  readonly peerMedian: number;
  /** (value − peer median) / scale, signed: negative means below the peers. */
  readonly robustZ: number;
}

export interface MomentScore {
  readonly node: string;
  /** Sum of the hot features' badness, each clipped at clipZ. */
  readonly score: number;
  readonly anomalous: boolean;
  /** The hot features, worst first. */
  readonly evidence: readonly Evidence[];
}

export interface MomentResult {
  /** Every node of the matrix, in name order. */
  readonly nodes: readonly MomentScore[];
  /** Features left out because fewer than minPeers nodes reported them. */
  readonly skippedFeatures: readonly string[];
  /** Why nothing was judged (too few nodes), when nothing was. */
  readonly skipped?: string;
}

export interface Suspect {
  readonly node: string;
  /** Score and evidence of the node's latest anomalous evaluation. */
  readonly score: number;
  readonly evidence: readonly Evidence[];
  /** When the node was first raised in this episode (the evaluation time, as given). */
  readonly since: number;
  /** Anomalous evaluations among the last n. */
  readonly anomalousIn: number;
}

export interface Evaluation {
  readonly time: number;
  /** Nodes raised (anomalous in ≥ k of the last n evaluations) and present in this matrix, highest score first. */
  readonly suspects: readonly Suspect[];
  /** Nodes anomalous at this moment, before persistence, in name order. */
  readonly anomalous: readonly string[];
  readonly skippedFeatures: readonly string[];
  readonly skipped?: string;
}

export function multiSignalSettings(options: MultiSignalOptions): MultiSignalSettings {
  return parseOrThrow(optionsSchema, options, 'multi-signal detector options');
}

/** 1.4826·MAD is the standard deviation's consistent estimate for normal data. */
const MAD_TO_SIGMA = 1.4826;

function median(sorted: Float64Array): number {
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

function badness(z: number, direction: Direction): number {
  if (direction === 'higher') return z > 0 ? z : 0;
  if (direction === 'lower') return z < 0 ? -z : 0;
  return Math.abs(z);
}

/** Scores every node of one moment against its peers (pure; see the module comment). */
export function scoreMoment(matrix: FeatureMatrix, settings: MultiSignalSettings): MomentResult {
  const nodes = Object.keys(matrix).sort();
  if (nodes.length < settings.minPeers) {
    return { nodes: [], skippedFeatures: [], skipped: `${nodes.length} node(s) reported; at least ${settings.minPeers} are needed to judge a node against its peers` };
  }
  const rows = nodes.map((node) => matrix[node]);
  const scores = new Float64Array(nodes.length);
  const hotCounts = new Int32Array(nodes.length);
  const evidence: ({ entry: Evidence; badness: number }[] | undefined)[] = new Array(nodes.length);
  const skippedFeatures: string[] = [];
  const values = new Float64Array(nodes.length);
  const present = new Uint8Array(nodes.length);
  const sorted = new Float64Array(nodes.length);

  for (const feature of settings.features) {
    let count = 0;
    for (let index = 0; index < nodes.length; index += 1) {
      const value = rows[index]?.[feature.name];
      if (value !== undefined && Number.isFinite(value)) {
        present[index] = 1;
        values[index] = value;
        sorted[count++] = value;
      } else {
        present[index] = 0;
      }
    }
    if (count < settings.minPeers) {
      skippedFeatures.push(feature.name);
      continue;
    }
    const reported = sorted.subarray(0, count).sort();
    const peerMedian = median(reported);
    for (let index = 0; index < count; index += 1) reported[index] = Math.abs((reported[index] as number) - peerMedian);
    reported.sort();
    const scale = Math.max(MAD_TO_SIGMA * median(reported), (feature.relativeSpread ?? settings.relativeSpread) * Math.abs(peerMedian), feature.minSpread);
    for (let index = 0; index < nodes.length; index += 1) {
      if (!present[index]) continue;
      const value = values[index] as number;
      const robustZ = (value - peerMedian) / scale;
      const bad = badness(robustZ, feature.direction);
      if (bad < settings.hotZ) continue;
      scores[index] = (scores[index] as number) + Math.min(bad, settings.clipZ);
      hotCounts[index] = (hotCounts[index] as number) + 1;
      (evidence[index] ??= []).push({ entry: { feature: feature.name, value, peerMedian, robustZ }, badness: bad });
    }
  }

  return {
    nodes: nodes.map((node, index) => {
      const score = scores[index] as number;
      const hot = evidence[index] ?? [];
      hot.sort((a, b) => b.badness - a.badness || (a.entry.feature < b.entry.feature ? -1 : 1));
      return {
        node,
        score,
        anomalous: (hotCounts[index] as number) >= settings.minHotFeatures && score >= settings.minScore,
        evidence: hot.map((item) => item.entry),
      };
    }),
    skippedFeatures,
  };
}

interface NodeHistory {
  /** The last ≤ n evaluations, oldest first: the moment score where anomalous, else undefined. */
  readonly entries: { time: number; moment: MomentScore | undefined }[];
  raisedSince: number | undefined;
}

/**
 * Holds the per-node history that persistence needs; everything else is scoreMoment. Times must
 * not go backwards; an evaluation at the same time as the last one replaces it, so a retried job
 * does not count one moment twice toward k.
 */
export class MultiSignalDetector {
  readonly settings: MultiSignalSettings;
  private readonly history = new Map<string, NodeHistory>();
  private lastTime: number | undefined;

  constructor(options: MultiSignalOptions) {
    this.settings = multiSignalSettings(options);
  }

  evaluate(time: number, matrix: FeatureMatrix): Evaluation {
    if (!Number.isFinite(time)) throw new InputError(`evaluation time must be a finite number, got ${time}`, 'time');
    if (this.lastTime !== undefined && time < this.lastTime) {
      throw new InputError(`evaluation time ${time} is before the previous evaluation at ${this.lastTime}`, 'time');
    }
    const moment = scoreMoment(matrix, this.settings);
    // Too few peers: no verdict, and the history is left as it was rather than filled with
    // "not anomalous" moments nobody could judge.
    if (moment.skipped !== undefined) {
      return { time, suspects: [], anomalous: [], skippedFeatures: moment.skippedFeatures, skipped: moment.skipped };
    }
    const replacing = this.lastTime === time;
    this.lastTime = time;
    const byNode = new Map(moment.nodes.map((score) => [score.node, score]));
    const { k, n } = this.settings.persistence;
    const suspects: Suspect[] = [];

    for (const node of new Set([...this.history.keys(), ...byNode.keys()])) {
      let entry = this.history.get(node);
      if (!entry) {
        entry = { entries: [], raisedSince: undefined };
        this.history.set(node, entry);
      }
      if (replacing && entry.entries.at(-1)?.time === time) {
        entry.entries.pop();
        if (entry.raisedSince === time) entry.raisedSince = undefined;
      }
      const current = byNode.get(node);
      entry.entries.push({ time, moment: current?.anomalous ? current : undefined });
      while (entry.entries.length > n) entry.entries.shift();

      const anomalousEntries = entry.entries.filter((item) => item.moment !== undefined);
      if (anomalousEntries.length === 0 && current === undefined) {
        this.history.delete(node); // gone from the fleet and nothing left to remember
        continue;
      }
      if (anomalousEntries.length < k) {
        entry.raisedSince = undefined;
        continue;
      }
      entry.raisedSince ??= time;
      // A node missing from this moment (drained, a lost scrape) keeps its history but is not
      // reported: there is nothing current to show for it.
      if (current === undefined) continue;
      const latest = anomalousEntries.at(-1)?.moment as MomentScore;
      suspects.push({ node, score: latest.score, evidence: latest.evidence, since: entry.raisedSince, anomalousIn: anomalousEntries.length });
    }

    suspects.sort((a, b) => b.score - a.score || (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
    return {
      time,
      suspects,
      anomalous: moment.nodes.filter((score) => score.anomalous).map((score) => score.node),
      skippedFeatures: moment.skippedFeatures,
    };
  }
}
