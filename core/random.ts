/**
 * A small seeded generator (a 32-bit counter through an integer mixer): the same seed gives the
 * same stream on every machine, which the simulations, benchmarks and property tests rely on to
 * be reproducible. Not for anything secret.
 */
export function seededUniform(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let mixed = Math.imul(state ^ (state >>> 15), state | 1);
    mixed ^= mixed + Math.imul(mixed ^ (mixed >>> 7), mixed | 61);
    return ((mixed ^ (mixed >>> 14)) >>> 0) / 2 ** 32;
  };
}
