/**
 * What the multi-signal detector reads and answers: the feature matrix of one moment, and the
 * verdicts, suspects and group reports of an evaluation. Types only, shared by the detector,
 * its scoring, its Prometheus source and its window, none of which needs the others for them.
 */

/** One node's reading of a feature: a number (node-wide), or one number per device (GPU, port, mount). */
export type FeatureValue = number | readonly number[];
/** One moment's readings: node → feature → value; a missing or non-finite value is simply absent. */
export type FeatureValues = Readonly<Record<string, FeatureValue | undefined>>;
export type FeatureMatrix = Readonly<Record<string, FeatureValues>>;

export interface Evidence {
  readonly feature: string;
  /** Which of the node's values (GPU, port, mount index in the reading; 0 for a node-wide value). */
  readonly device?: number;
  readonly value: number;
  /** The group's median (NaN for evidence that needs no peers). */
  readonly peerMedian: number;
  /** How far the node moved from its own normal against its peers, in robust σ, signed (NaN for evidence that needs no peers). */
  readonly robustZ: number;
  /** peer: unlike its peers; alarm: a known-meaning level; raise: a raise-at-once level; silence: stopped reporting. */
  readonly kind?: 'peer' | 'alarm' | 'raise' | 'silence';
}

export type RaiseReason = 'persistent' | 'episodes' | 'raise' | 'silence' | 'activity';

export interface NodeVerdict {
  readonly node: string;
  /** The node's peer group; undefined when it could not be grouped. */
  readonly group: string | undefined;
  readonly score: number;
  readonly anomalous: boolean;
  readonly evidence: readonly Evidence[];
}

export interface Suspect {
  readonly node: string;
  readonly group: string | undefined;
  /** Score and evidence of the node's latest anomalous evaluation. */
  readonly score: number;
  readonly evidence: readonly Evidence[];
  /** When the node was first raised in this episode (the evaluation time, as given). */
  readonly since: number;
  /** Anomalous evaluations among the last n. */
  readonly anomalousIn: number;
  readonly reason: RaiseReason;
}

export interface GroupReport {
  readonly group: string;
  /** Members reporting at this moment. */
  readonly nodes: number;
  readonly members: number;
  readonly peerScored: boolean;
  /** More than maxAnomalousShare stood out at once: a job-wide phase, no peer evidence counted. */
  readonly phase: boolean;
  /** Why the group was not peer-scored. */
  readonly reason?: string;
}

export interface Evaluation {
  readonly time: number;
  /** Nodes raised and present in this matrix (or silent members), highest score first. */
  readonly suspects: readonly Suspect[];
  /** Nodes anomalous at this moment, before persistence, in name order. */
  readonly anomalous: readonly string[];
  /** Every node judged at this moment, in name order. */
  readonly verdicts: readonly NodeVerdict[];
  readonly groups: readonly GroupReport[];
  /** Nodes of the matrix with no group: judged on known-meaning levels only. */
  readonly ungrouped: readonly string[];
  /** Members of a reporting group with no reading at all at this moment. */
  readonly silent: readonly string[];
  readonly skippedFeatures: readonly string[];
  /** Why no node could be peer-scored, when none could. */
  readonly skipped?: string;
}

/** Who is whose peer: node → group (a training job) for every node expected to report. */
export interface EvaluationContext {
  readonly groups?: Readonly<Record<string, string>>;
}
