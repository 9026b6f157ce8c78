import { seededUniform } from '../../core/random.js';
import { SYMPTOMS, symptomById, type RootCause, type SignalKind, type Symptom } from './model.js';
import { type EttrParams } from './params.js';

/**
 * The incidents one simulated job meets, drawn in advance from a seed so every strategy (and every
 * pool size or checkpoint interval) meets exactly the same ones: common random numbers, so a
 * difference in ETTR is the strategy's and not the dice's.
 *
 * Each Table 1 row is its own Poisson process, in training time: failures at the job-level rate
 * times the row's share, manual restarts at theirs (ByteRobust Table 1, Table 4; see model.ts).
 * Their superposition is one Poisson process whose events pick a row by weight, which is how they
 * are drawn. Faults arrive while the job trains; one that would have hit a node during an outage
 * is met after the restart.
 */

export interface Incident {
  readonly index: number;
  readonly symptom: Symptom;
  readonly signal: SignalKind;
  readonly root: RootCause;
  /** Training time after the previous incident fired (or after the start). */
  readonly uptimeGapSeconds: number;
  /** Which node of the job is the culprit (or the reporter, for faults without one), as a fraction of the job. */
  readonly nodePick: number;
  /** Whether stop-time diagnostics (bit-wise alignment for NaN, §4.3) catch a culprit machine. */
  readonly diagnosticsFind: boolean;
  /** A code update applied at once (§6.1 urgent) rather than lazily. */
  readonly urgent: boolean;
}

export interface IncidentSource {
  /** The next incident; its gap is Infinity when no more come. */
  next(): Incident;
}

/** Draws incidents forever from a seed; the n-th incident does not depend on who asks or when. */
export class IncidentStream implements IncidentSource {
  private readonly random: () => number;
  private readonly weights: { symptom: Symptom; perDay: number }[];
  private readonly perDay: number;
  private index = 0;

  constructor(private readonly params: EttrParams) {
    this.random = seededUniform(params.seed);
    const failureCount = SYMPTOMS.filter((symptom) => symptom.category !== 'manual').reduce((sum, symptom) => sum + symptom.count, 0);
    this.weights = SYMPTOMS.map((symptom) => ({
      symptom,
      perDay: symptom.category === 'manual' ? params.manualRestartsPerDay : (params.failuresPerDay * symptom.count) / failureCount,
    }));
    this.perDay = this.weights.reduce((sum, entry) => sum + entry.perDay, 0);
  }

  next(): Incident {
    // A fixed number of draws per incident keeps the stream aligned whatever is used.
    const [gapDraw, symptomDraw, variantDraw, nodePick, diagnosticsDraw, urgentDraw] = [
      this.random(),
      this.random(),
      this.random(),
      this.random(),
      this.random(),
      this.random(),
    ] as const;
    const uptimeGapSeconds = this.perDay > 0 ? (-Math.log1p(-gapDraw) / this.perDay) * 86_400 : Infinity;
    const symptom = pickWeighted(this.weights, symptomDraw * this.perDay);
    const variant = pickVariant(symptom, variantDraw);
    const catchProbability = variant.signal === 'numerical' ? this.params.bitwiseCatchProbability : this.params.diagnosticsCatchProbability;
    const incident: Incident = {
      index: this.index,
      symptom,
      signal: variant.signal,
      root: variant.root,
      uptimeGapSeconds,
      nodePick,
      diagnosticsFind: diagnosticsDraw < catchProbability,
      urgent: urgentDraw < this.params.urgentUpdateShare,
    };
    this.index += 1;
    return incident;
  }
}

function pickWeighted(weights: readonly { symptom: Symptom; perDay: number }[], target: number): Symptom {
  let cumulative = 0;
  for (const entry of weights) {
    cumulative += entry.perDay;
    if (target < cumulative) return entry.symptom;
  }
  return (weights[weights.length - 1] as { symptom: Symptom }).symptom;
}

function pickVariant(symptom: Symptom, draw: number): Symptom['variants'][number] {
  let cumulative = 0;
  for (const variant of symptom.variants) {
    cumulative += variant.share;
    if (draw < cumulative) return variant;
  }
  return symptom.variants[symptom.variants.length - 1] as Symptom['variants'][number];
}

export interface ScriptedIncident {
  readonly symptom: string;
  readonly gapSeconds: number;
  /** Which of the symptom's variants (model.ts), by signal and root cause; the first when omitted. */
  readonly signal?: SignalKind;
  readonly root?: RootCause;
  readonly nodePick?: number;
  readonly diagnosticsFind?: boolean;
  readonly urgent?: boolean;
}

/** A fixed list of incidents, then none: for tests and worked examples. */
export class ScriptedIncidents implements IncidentSource {
  private index = 0;

  constructor(private readonly script: readonly ScriptedIncident[]) {}

  next(): Incident {
    const entry = this.script[this.index];
    const index = this.index;
    this.index += 1;
    if (entry === undefined) {
      return {
        index,
        symptom: symptomById('code_adjustment'),
        signal: 'code_update',
        root: 'none',
        uptimeGapSeconds: Infinity,
        nodePick: 0,
        diagnosticsFind: false,
        urgent: false,
      };
    }
    const symptom = symptomById(entry.symptom);
    const variant = symptom.variants.find(
      (candidate) => (entry.signal === undefined || candidate.signal === entry.signal) && (entry.root === undefined || candidate.root === entry.root),
    );
    if (variant === undefined) throw new Error(`symptom ${entry.symptom} has no variant ${entry.signal ?? '*'}/${entry.root ?? '*'}`);
    return {
      index,
      symptom,
      signal: variant.signal,
      root: variant.root,
      uptimeGapSeconds: entry.gapSeconds,
      nodePick: entry.nodePick ?? 0.5,
      diagnosticsFind: entry.diagnosticsFind ?? true,
      urgent: entry.urgent ?? true,
    };
  }
}
