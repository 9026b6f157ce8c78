import { seededUniform } from '../../core/random.js';

/** Seeded randomness for one replay: mulberry32 (small, fast, the same on every machine) and the draws built on it. */
export class Random {
  readonly next: () => number;
  private spare: number | undefined;

  constructor(seed: number) {
    this.next = seededUniform(seed);
  }

  uniform(low: number, high: number): number {
    return low + (high - low) * this.next();
  }

  /** Standard normal (Marsaglia's polar method; the second value of a pair is kept for the next call). */
  normal(): number {
    if (this.spare !== undefined) {
      const value = this.spare;
      this.spare = undefined;
      return value;
    }
    for (;;) {
      const u = 2 * this.next() - 1;
      const v = 2 * this.next() - 1;
      const square = u * u + v * v;
      if (square === 0 || square >= 1) continue;
      const factor = Math.sqrt((-2 * Math.log(square)) / square);
      this.spare = v * factor;
      return u * factor;
    }
  }

  poisson(mean: number): number {
    if (mean <= 0) return 0;
    if (mean > 30) return Math.max(0, Math.round(mean + Math.sqrt(mean) * this.normal()));
    const limit = Math.exp(-mean);
    let count = 0;
    for (let product = this.next(); product > limit; product *= this.next()) count += 1;
    return count;
  }

  /** White noise with rare 4σ outliers, as real gauges have. */
  noise(sigma: number): number {
    return sigma * this.normal() * (this.next() < 0.003 ? 4 : 1);
  }
}
