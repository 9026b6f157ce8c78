import type { Baselines } from './memory.js';
import type { Direction, MultiSignalSettings } from './settings.js';
import type { Evidence, FeatureMatrix } from './types.js';

/**
 * One moment of one peer group, scored: the pure part of analyzers/multisignal/detector.ts (see its module
 * comment for why). Every value is a device's (a GPU, a port, a mount; a plain number is a
 * node-wide value, one device), compared with the same feature on every device of the group's
 * nodes, so one GPU in eight that goes wrong is not averaged away by its seven healthy siblings
 * (the 504-GPU report, first finding: the precursors it found were one GPU's ECC and one link's
 * replays, not a node mean).
 */

/** 1.4826·MAD is the standard deviation's consistent estimate for normal data. */
const MAD_TO_SIGMA = 1.4826;

export interface NodeMoment {
  readonly node: string;
  /** Sum of the hot features' badness, each clipped at clipZ. */
  readonly score: number;
  /** Features hot against the peers (badness ≥ hotZ). */
  readonly hotFeatures: number;
  /** The worst badness of any feature against the peers. */
  readonly worst: number;
  /** Hot features that mean hardware (not `activity` features). */
  readonly hardwareHot: number;
  /** The worst badness of a hardware feature against the peers. */
  readonly hardwareWorst: number;
  /** A feature at its known-meaning alarm level (alarmAt): strong evidence whatever the peers read. */
  readonly alarm: boolean;
  /** A feature at its raiseAt level (a fatal or repeated Xid): a suspect at once. */
  readonly raise: boolean;
  /** Hot, alarm and raise evidence, worst first. */
  readonly evidence: readonly Evidence[];
  /** Per device key (feature#device) its peer z before the node's own normal was taken off: what the baselines learn. */
  readonly peerZ: ReadonlyMap<string, number>;
}

export interface GroupMoment {
  readonly nodes: readonly NodeMoment[];
  /** Features left out because fewer than minPeers of the group's nodes reported them. */
  readonly skippedFeatures: readonly string[];
  /** Whether the group was peer-scored at all (enough nodes). */
  readonly peerScored: boolean;
}

export const deviceKey = (feature: string, device: number): string => `${feature}#${device}`;

function median(sorted: Float64Array): number {
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? (sorted[middle] as number) : ((sorted[middle - 1] as number) + (sorted[middle] as number)) / 2;
}

/** Median and MAD of `values` (reordered in place). */
function medianAndMad(values: Float64Array): { median: number; mad: number } {
  values.sort();
  const center = median(values);
  for (let index = 0; index < values.length; index += 1) values[index] = Math.abs((values[index] as number) - center);
  values.sort();
  return { median: center, mad: median(values) };
}

export function badness(z: number, direction: Direction): number {
  if (direction === 'higher') return z > 0 ? z : 0;
  if (direction === 'lower') return z < 0 ? -z : 0;
  return Math.abs(z);
}

function crosses(value: number, level: number | undefined, direction: Direction): boolean {
  if (level === undefined) return false;
  return direction === 'lower' ? value <= level : value >= level;
}

/** A feature's values on one node, one per device; a non-finite value is no reading. */
export function deviceValues(value: number | readonly number[] | undefined): (number | undefined)[] {
  if (value === undefined) return [];
  const list = typeof value === 'number' ? [value] : value;
  return list.map((item) => (typeof item === 'number' && Number.isFinite(item) ? item : undefined));
}

interface Accumulator {
  score: number;
  hot: number;
  worst: number;
  hardwareHot: number;
  hardwareWorst: number;
  alarm: boolean;
  raise: boolean;
  evidence: { entry: Evidence; badness: number }[];
  peerZ: Map<string, number>;
}

/**
 * Scores `nodes` (one peer group) at one moment. With `peers` false the nodes are judged only on
 * what needs no peers: the known-meaning alarm and raise levels. `baseline(node, key)` is the
 * node's own usual peer z on that device (0 while unknown): what is scored is the node becoming
 * unlike its peers, z − baseline, rescaled by how much that residual spreads across the group.
 */
export function scoreGroup(
  nodes: readonly string[],
  matrix: FeatureMatrix,
  settings: MultiSignalSettings,
  baselines: Baselines | undefined,
  peers: boolean,
): GroupMoment {
  const accumulators: Accumulator[] = nodes.map(() => ({
    score: 0,
    hot: 0,
    worst: 0,
    hardwareHot: 0,
    hardwareWorst: 0,
    alarm: false,
    raise: false,
    evidence: [],
    peerZ: new Map(),
  }));
  const skippedFeatures: string[] = [];
  const peerScored = peers && nodes.length >= settings.minPeers;

  for (const feature of settings.features) {
    const owners: number[] = [];
    const devices: number[] = [];
    const values: number[] = [];
    let reporting = 0;
    nodes.forEach((node, index) => {
      const readings = deviceValues(matrix[node]?.[feature.name]);
      let any = false;
      readings.forEach((value, device) => {
        if (value === undefined) return;
        any = true;
        owners.push(index);
        devices.push(device);
        values.push(value);
      });
      if (any) reporting += 1;
    });

    // Known meaning first: a level that is evidence by itself needs no peers.
    for (let at = 0; at < values.length; at += 1) {
      const value = values[at] as number;
      const owner = accumulators[owners[at] as number] as Accumulator;
      const raise = crosses(value, feature.raiseAt, feature.direction);
      const alarm = raise || crosses(value, feature.alarmAt, feature.direction);
      if (!alarm) continue;
      owner.alarm = true;
      owner.raise ||= raise;
      owner.evidence.push({
        entry: { feature: feature.name, device: devices[at] as number, value, peerMedian: Number.NaN, robustZ: Number.NaN, kind: raise ? 'raise' : 'alarm' },
        badness: Number.POSITIVE_INFINITY,
      });
    }

    // A count with a raise-at-once level (Xids) is judged on that level alone: one application
    // Xid more than the peers had says nothing about the hardware.
    if (!peerScored || feature.raiseAt !== undefined) continue;
    if (reporting < settings.minPeers) {
      skippedFeatures.push(feature.name);
      continue;
    }
    const pooled = Float64Array.from(values);
    const { median: peerMedian, mad } = medianAndMad(pooled);
    const scale = Math.max(MAD_TO_SIGMA * mad, (feature.relativeSpread ?? settings.relativeSpread) * Math.abs(peerMedian), feature.minSpread);
    const residuals = new Float64Array(values.length);
    const peerZs = new Float64Array(values.length);
    for (let at = 0; at < values.length; at += 1) {
      const z = ((values[at] as number) - peerMedian) / scale;
      const key = deviceKey(feature.name, devices[at] as number);
      (accumulators[owners[at] as number] as Accumulator).peerZ.set(key, z);
      peerZs[at] = z;
      residuals[at] = z - (baselines?.usual(nodes[owners[at] as number] as string, key) ?? 0);
    }
    // The residuals' own spread: once nodes' lasting offsets are taken off, what is left is
    // drift and noise, and a node is judged against that (never finer than minSpread).
    const { median: residualMedian, mad: residualMad } = medianAndMad(Float64Array.from(residuals));
    const residualScale = Math.max(MAD_TO_SIGMA * residualMad, feature.minSpread / scale);
    const worstOfNode = new Map<number, { z: number; bad: number; at: number }>();
    for (let at = 0; at < values.length; at += 1) {
      const z = ((residuals[at] as number) - residualMedian) / residualScale;
      // Worse than its own normal counts only where the device is also worse than its peers now:
      // a node that usually runs cooler or lighter than its peers is not a suspect for matching
      // them when the whole job idles (a restart) or changes pace.
      const peerZ = peerZs[at] as number;
      const sameSide = feature.direction !== 'both' || Math.sign(peerZ) === Math.sign(z);
      const bad = sameSide && badness(peerZ, feature.direction) >= settings.minPeerZ ? badness(z, feature.direction) : 0;
      const owner = owners[at] as number;
      const seen = worstOfNode.get(owner);
      if (!seen || bad > seen.bad) worstOfNode.set(owner, { z, bad, at });
    }
    for (const [owner, { z, bad, at }] of worstOfNode) {
      if (bad < settings.hotZ) continue;
      const accumulator = accumulators[owner] as Accumulator;
      accumulator.score += Math.min(bad, settings.clipZ);
      accumulator.hot += 1;
      accumulator.worst = Math.max(accumulator.worst, bad);
      if (feature.activity !== true) {
        accumulator.hardwareHot += 1;
        accumulator.hardwareWorst = Math.max(accumulator.hardwareWorst, bad);
      }
      accumulator.evidence.push({
        entry: { feature: feature.name, device: devices[at] as number, value: values[at] as number, peerMedian, robustZ: z, kind: 'peer' },
        badness: bad,
      });
    }
  }

  return {
    nodes: nodes.map((node, index) => {
      const accumulator = accumulators[index] as Accumulator;
      accumulator.evidence.sort((a, b) => b.badness - a.badness || (a.entry.feature < b.entry.feature ? -1 : 1));
      return {
        node,
        score: accumulator.score,
        hotFeatures: accumulator.hot,
        worst: accumulator.worst,
        hardwareHot: accumulator.hardwareHot,
        hardwareWorst: accumulator.hardwareWorst,
        alarm: accumulator.alarm,
        raise: accumulator.raise,
        evidence: accumulator.evidence.map((item) => item.entry),
        peerZ: accumulator.peerZ,
      };
    }),
    skippedFeatures,
    peerScored,
  };
}

/**
 * Whether a node stands out from its peers at all: several hot features, or one strong one
 * (504-GPU report: no single metric dominant, but some mean one thing). What a job-wide phase is
 * counted on.
 */
export function peerOutlier(moment: NodeMoment, settings: MultiSignalSettings): boolean {
  return (moment.hotFeatures >= settings.minHotFeatures && moment.score >= settings.minScore) || moment.worst >= settings.strongZ;
}

/**
 * Whether a node's peer evidence makes the moment anomalous: it stands out, and hardware is part
 * of why — a hot feature that means hardware among several, or one that is strong by itself.
 * What only ordinary activity features show (a utilization dip, less traffic: a checkpoint, an
 * evaluation, a data-loader stall, an uneven pipeline stage on one node) is not, on its own
 * (activityOnly: it counts only when it lasts).
 */
export function peerAnomalous(moment: NodeMoment, settings: MultiSignalSettings): boolean {
  return (
    (moment.hotFeatures >= settings.minHotFeatures && moment.score >= settings.minScore && moment.hardwareHot >= 1) || moment.hardwareWorst >= settings.strongZ
  );
}

/** A node that stands out from its peers on ordinary activity features alone. */
export function activityOnly(moment: NodeMoment, settings: MultiSignalSettings): boolean {
  return peerOutlier(moment, settings) && !peerAnomalous(moment, settings);
}
