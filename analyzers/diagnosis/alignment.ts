import { InputError } from '../../core/errors.js';

/**
 * Bit-wise alignment (ByteRobust §4.3, NaN loss diagnosis): every machine runs one step of a
 * reference model with fixed weights, input and parallelism, so that every healthy machine
 * produces exactly the same output. The agents hash that output; this module compares hashes.
 *
 * Without a known-good hash the output most machines agree on is taken as correct, and only a
 * strict majority (more than half of the machines that produced a hash) counts: with 2 vs 2,
 * or 2 vs 1 vs 1, there is no way to tell which side is corrupt, so nobody is named and the
 * verdict says why. With a known-good hash (computed once on trusted hardware) every machine
 * that differs from it is an outlier, majority or not.
 */

export interface HashGroup {
  readonly hash: string;
  /** Machines that produced this hash, in the order given. */
  readonly machines: string[];
}

export type AlignmentVerdict =
  | {
      readonly aligned: true;
      /** The hash taken as correct: the known-good one, or the strict majority's. */
      readonly hash: string;
      readonly basis: 'expected' | 'majority';
      /** Machines whose hash differs from it, in the order given. */
      readonly outliers: string[];
      readonly groups: HashGroup[];
    }
  | {
      readonly aligned: false;
      /** Nobody is named when there is no basis for a verdict. */
      readonly outliers: [];
      readonly reason: string;
      readonly groups: HashGroup[];
    };

export interface AlignmentOptions {
  /** The reference step's output hash on known-good hardware; when given, it decides alone. */
  readonly expectedHash?: string | undefined;
}

/** Compares the reference-step hashes of machines; never names anyone without a basis. */
export function alignReferenceHashes(hashes: ReadonlyMap<string, string> | Readonly<Record<string, string>>, options: AlignmentOptions = {}): AlignmentVerdict {
  const entries = hashes instanceof Map ? [...hashes.entries()] : Object.entries(hashes);
  const byHash = new Map<string, string[]>();
  for (const [machine, hash] of entries) {
    if (hash === '') throw new InputError(`machine ${machine} has an empty hash`, machine);
    const machines = byHash.get(hash) ?? [];
    machines.push(machine);
    byHash.set(hash, machines);
  }
  // Largest group first; equal sizes by first appearance, so the verdict is deterministic.
  const groups: HashGroup[] = [...byHash.entries()].map(([hash, machines]) => ({ hash, machines })).sort((a, b) => b.machines.length - a.machines.length);
  const outliersFrom = (hash: string): string[] => entries.filter(([, other]) => other !== hash).map(([machine]) => machine);

  if (options.expectedHash !== undefined) {
    return { aligned: true, hash: options.expectedHash, basis: 'expected', outliers: outliersFrom(options.expectedHash), groups };
  }
  if (entries.length === 0) return { aligned: false, outliers: [], reason: 'no machine produced a reference hash', groups };
  const largest = groups[0]!;
  if (largest.machines.length * 2 > entries.length) {
    return { aligned: true, hash: largest.hash, basis: 'majority', outliers: outliersFrom(largest.hash), groups };
  }
  const sizes = groups.map((group) => group.machines.length).join(' vs ');
  return {
    aligned: false,
    outliers: [],
    reason: `no strict majority among ${entries.length} reference hashes (${groups.length} distinct outputs, ${sizes}): cannot tell which output is correct, so no machine is named`,
    groups,
  };
}
