import { InputError } from '../core/errors.js';

/**
 * Bayesian online change-point detection (Adams & MacKay 2007), the detector Greyhound runs on
 * every rank's iteration-time stream (Greyhound §4.2, "Slow iteration detection").
 *
 * The model: the stream is cut into runs; inside a run the values are Gaussian with an unknown
 * mean and precision, drawn from a normal-gamma prior (μ0, κ0, α0, β0); a new run starts before
 * any value with a constant hazard H = 1 / expectedRunLength. After each value the detector holds
 * the posterior over the current run length r (how many of the latest values belong to the
 * current run). r = 0 is the hypothesis "a run starts right after this value": by the recursion
 * its probability is exactly H, so the evidence of a change shows up one value later, as mass on
 * r = 1, 2, ... (see `recentChange`).
 *
 * Greyhound does not name its observation model. The fail-slow tracker feeds ln(seconds), so
 * the prior and the 10 % rule mean the same thing for a 0.3 s and a 30 s iteration.
 *
 * Cost: the exact posterior grows by one hypothesis per value (O(t) per update). Hypotheses whose
 * probability falls below `pruneBelow` are dropped, and at most `maxRunLengths` are kept (the
 * least probable goes first, never the fresh run), so an update costs O(R): two logarithms and
 * one exponential per hypothesis. The predictive needs lgamma(α + ½) − lgamma(α) with
 * α = α0 + r/2: a per-detector table for short runs, its asymptotic series for long ones.
 */

export interface BocdOptions {
  /** Expected values between change points, 1/H. */
  readonly expectedRunLength?: number;
  /** Prior mean μ0; by default the first value seen. */
  readonly priorMean?: number;
  /** Prior guess of the noise standard deviation inside a run (sets β0 = α0·σ²). */
  readonly priorSigma?: number;
  /** κ0: how many values' worth of confidence the prior mean carries. */
  readonly priorMeanWeight?: number;
  /** α0: how many half-values' worth of confidence the prior noise level carries. */
  readonly priorShape?: number;
  /** Hypotheses less probable than this are dropped. 0 keeps them all. */
  readonly pruneBelow?: number;
  /** At most this many run-length hypotheses are kept. Infinity keeps them all. */
  readonly maxRunLengths?: number;
}

export interface RunLengthProbability {
  readonly runLength: number;
  readonly probability: number;
}

export interface RecentChange {
  /** Posterior probability that the current run began within the last `within` values. */
  readonly probability: number;
  /** The most probable such run length (≥ 1), or 0 when every such hypothesis was pruned. */
  readonly runLength: number;
}

export const BOCD_DEFAULTS = {
  expectedRunLength: 250,
  priorSigma: 0.05,
  priorMeanWeight: 0.01,
  priorShape: 1,
  pruneBelow: 1e-7,
  maxRunLengths: 64,
} as const;

/** Run lengths below this use a table of lgamma(α + ½) − lgamma(α); longer ones its series. */
const TABLE_RUN_LENGTHS = 64;

export class Bocd {
  private readonly hazard: number;
  private readonly logHazard: number;
  private readonly logGrowth: number;
  private readonly logPruneBelow: number;
  private readonly kappa0: number;
  private readonly alpha0: number;
  private readonly beta0: number;
  private readonly maxRunLengths: number;
  /** lgamma(α0 + r/2 + ½) − lgamma(α0 + r/2) for r < TABLE_RUN_LENGTHS. */
  private readonly lgammaRatio: Float64Array;
  private mu0: number | undefined;

  // One slot per hypothesis, in no particular order; the posterior is held as log-probabilities.
  private runLength: Float64Array;
  private logProbability: Float64Array;
  private mean: Float64Array;
  private beta: Float64Array;
  private weight: Float64Array;
  private size = 0;
  private seen = 0;

  constructor(options: BocdOptions = {}) {
    const expectedRunLength = options.expectedRunLength ?? BOCD_DEFAULTS.expectedRunLength;
    const sigma = options.priorSigma ?? BOCD_DEFAULTS.priorSigma;
    const pruneBelow = options.pruneBelow ?? BOCD_DEFAULTS.pruneBelow;
    this.kappa0 = options.priorMeanWeight ?? BOCD_DEFAULTS.priorMeanWeight;
    this.alpha0 = options.priorShape ?? BOCD_DEFAULTS.priorShape;
    this.maxRunLengths = options.maxRunLengths ?? BOCD_DEFAULTS.maxRunLengths;
    positive(expectedRunLength, 'expectedRunLength');
    if (expectedRunLength < 1) throw new InputError('bocd.expectedRunLength must be at least 1', 'expectedRunLength');
    positive(sigma, 'priorSigma');
    positive(this.kappa0, 'priorMeanWeight');
    positive(this.alpha0, 'priorShape');
    if (!(pruneBelow >= 0 && pruneBelow < 1)) throw new InputError('bocd.pruneBelow must be in [0, 1)', 'pruneBelow');
    if (!(this.maxRunLengths >= 2)) throw new InputError('bocd.maxRunLengths must be at least 2', 'maxRunLengths');
    if (options.priorMean !== undefined && !Number.isFinite(options.priorMean)) {
      throw new InputError('bocd.priorMean must be a finite number', 'priorMean');
    }
    this.hazard = 1 / expectedRunLength;
    this.logHazard = Math.log(this.hazard);
    this.logGrowth = Math.log1p(-this.hazard);
    this.logPruneBelow = Math.log(pruneBelow);
    this.beta0 = this.alpha0 * sigma * sigma;
    this.mu0 = options.priorMean;
    this.lgammaRatio = new Float64Array(TABLE_RUN_LENGTHS);
    this.lgammaRatio[0] = lgamma(this.alpha0 + 0.5) - lgamma(this.alpha0);
    for (let r = 1; r < TABLE_RUN_LENGTHS; r += 1) {
      // lgamma(α + 1) − lgamma(α + ½) = ln α − (lgamma(α + ½) − lgamma(α)).
      this.lgammaRatio[r] = Math.log(this.alpha0 + (r - 1) / 2) - (this.lgammaRatio[r - 1] as number);
    }

    const capacity = Number.isFinite(this.maxRunLengths) ? this.maxRunLengths + 1 : 64;
    this.runLength = new Float64Array(capacity);
    this.logProbability = new Float64Array(capacity);
    this.mean = new Float64Array(capacity);
    this.beta = new Float64Array(capacity);
    this.weight = new Float64Array(capacity);
  }

  /** Values seen so far. */
  get count(): number {
    return this.seen;
  }

  /** Run-length hypotheses currently held. */
  get hypotheses(): number {
    return this.size;
  }

  /** Absorbs one value; O(R) for R hypotheses held. Non-finite values are an InputError. */
  update(x: number): void {
    if (!Number.isFinite(x)) throw new InputError(`bocd: value ${String(x)} is not a finite number`, 'x');
    if (this.mu0 === undefined) this.mu0 = x;
    if (this.size === 0) this.pushFreshRun(0);
    const { runLength, logProbability, mean, beta, weight, kappa0, alpha0 } = this;

    // log(prior mass × predictive density of x): Student-t with 2α degrees of freedom, location
    // μ and scale² = β(κ + 1)/(ακ); the constant −½ ln π is left out, it cancels.
    let maxLog = Number.NEGATIVE_INFINITY;
    for (let slot = 0; slot < this.size; slot += 1) {
      const r = runLength[slot] as number;
      const kappa = kappa0 + r;
      const alpha = alpha0 + 0.5 * r;
      const spread = (2 * (beta[slot] as number) * (kappa + 1)) / kappa; // 2α·scale²
      const deviation = x - (mean[slot] as number);
      const tail = (alpha + 0.5) * Math.log1p((deviation * deviation) / spread);
      let logDensity: number;
      if (r < TABLE_RUN_LENGTHS) {
        logDensity = (this.lgammaRatio[r] as number) - 0.5 * Math.log(spread) - tail;
      } else {
        // lgamma(α + ½) − lgamma(α) = ½ ln α − 1/(8α) + 1/(192α³) − 1/(640α⁵) + O(α⁻⁷).
        const inverse = 1 / alpha;
        const inverse2 = inverse * inverse;
        logDensity = -0.5 * Math.log(spread * inverse) + inverse * (-1 / 8 + inverse2 * (1 / 192 - inverse2 / 640)) - tail;
      }
      const joint = (logProbability[slot] as number) + logDensity;
      logProbability[slot] = joint;
      if (joint > maxLog) maxLog = joint;
    }

    // Every hypothesis grows by one with probability 1 − H and absorbs x.
    let total = 0;
    for (let slot = 0; slot < this.size; slot += 1) {
      const w = Math.exp((logProbability[slot] as number) - maxLog);
      weight[slot] = w;
      total += w;
      const r = runLength[slot] as number;
      const kappa = kappa0 + r;
      const deviation = x - (mean[slot] as number);
      beta[slot] = (beta[slot] as number) + (kappa * deviation * deviation) / (2 * (kappa + 1));
      mean[slot] = (mean[slot] as number) + deviation / (kappa + 1);
      runLength[slot] = r + 1;
    }

    // Normalise, drop the improbable, and keep at most maxRunLengths − 1 grown hypotheses.
    const logScale = this.logGrowth - maxLog - Math.log(total);
    const logFloor = this.logPruneBelow;
    let kept = 0;
    let keptWeight = 0;
    let least = -1;
    for (let slot = 0; slot < this.size; slot += 1) {
      const logP = (logProbability[slot] as number) + logScale;
      if (!(logP >= logFloor) || !((weight[slot] as number) > 0)) continue;
      this.moveSlot(slot, kept);
      logProbability[kept] = logP;
      keptWeight += weight[slot] as number;
      weight[kept] = weight[slot] as number;
      if (least < 0 || logP < (logProbability[least] as number)) least = kept;
      kept += 1;
    }
    this.size = kept;
    if (this.size + 1 > this.maxRunLengths && least >= 0) {
      keptWeight -= weight[least] as number;
      this.moveSlot(this.size - 1, least);
      logProbability[least] = logProbability[this.size - 1] as number;
      this.size -= 1;
    }
    // Kept grown mass (1 − H)·keptWeight/total plus the fresh run's H: rescale to sum to 1.
    const logKept = Math.log(((1 - this.hazard) * keptWeight) / total + this.hazard);
    for (let slot = 0; slot < this.size; slot += 1) logProbability[slot] = (logProbability[slot] as number) - logKept;
    this.pushFreshRun(this.logHazard - logKept);
    this.seen += 1;
  }

  /**
   * How strongly the posterior says the current run began within the last `within` values (run
   * lengths 1..within), and the most probable of those run lengths.
   */
  recentChange(within: number): RecentChange {
    let probability = 0;
    let best = 0;
    let bestLog = Number.NEGATIVE_INFINITY;
    for (let slot = 0; slot < this.size; slot += 1) {
      const r = this.runLength[slot] as number;
      if (r === 0 || r > within) continue;
      const logP = this.logProbability[slot] as number;
      probability += Math.exp(logP);
      if (logP > bestLog || (logP === bestLog && r < best)) {
        bestLog = logP;
        best = r;
      }
    }
    return { probability, runLength: best };
  }

  /** The most probable run length. */
  mostProbableRunLength(): number {
    let best = 0;
    let bestLog = Number.NEGATIVE_INFINITY;
    for (let slot = 0; slot < this.size; slot += 1) {
      const logP = this.logProbability[slot] as number;
      if (logP > bestLog) {
        bestLog = logP;
        best = this.runLength[slot] as number;
      }
    }
    return best;
  }

  /** The run-length posterior, shortest run first (a copy; for inspection and tests). */
  posterior(): RunLengthProbability[] {
    const result: RunLengthProbability[] = [];
    for (let slot = 0; slot < this.size; slot += 1) {
      result.push({ runLength: this.runLength[slot] as number, probability: Math.exp(this.logProbability[slot] as number) });
    }
    return result.sort((a, b) => a.runLength - b.runLength);
  }

  private pushFreshRun(logProbability: number): void {
    if (this.size === this.runLength.length) this.grow();
    const slot = this.size;
    this.runLength[slot] = 0;
    this.logProbability[slot] = logProbability;
    this.mean[slot] = this.mu0 as number;
    this.beta[slot] = this.beta0;
    this.size += 1;
  }

  /** Copies a hypothesis's run length and sufficient statistics (not its probability). */
  private moveSlot(from: number, to: number): void {
    if (from === to) return;
    this.runLength[to] = this.runLength[from] as number;
    this.mean[to] = this.mean[from] as number;
    this.beta[to] = this.beta[from] as number;
  }

  private grow(): void {
    const capacity = this.runLength.length * 2;
    const widen = (array: Float64Array): Float64Array => {
      const wider = new Float64Array(capacity);
      wider.set(array);
      return wider;
    };
    this.runLength = widen(this.runLength);
    this.logProbability = widen(this.logProbability);
    this.mean = widen(this.mean);
    this.beta = widen(this.beta);
    this.weight = widen(this.weight);
  }
}

function positive(value: number, field: string): void {
  if (!(value > 0) || !Number.isFinite(value)) throw new InputError(`bocd.${field} must be a positive finite number, got ${String(value)}`, field);
}

/** ln Γ(x) for x > 0 (Lanczos, g = 7); used once per detector, for the prior's α0. */
function lgamma(x: number): number {
  const coefficients = [
    0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313, -176.61502916214059, 12.507343278686905, -0.13857109526572012,
    9.9843695780195716e-6, 1.5056327351493116e-7,
  ];
  if (x < 0.5) return Math.log(Math.PI / Math.abs(Math.sin(Math.PI * x))) - lgamma(1 - x);
  const shifted = x - 1;
  let sum = coefficients[0] as number;
  for (let index = 1; index < coefficients.length; index += 1) sum += (coefficients[index] as number) / (shifted + index);
  const t = shifted + 7.5;
  return 0.5 * Math.log(2 * Math.PI) + (shifted + 0.5) * Math.log(t) - t + Math.log(sum);
}
