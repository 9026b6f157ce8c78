import { describe, expect, it } from 'vitest';
import { alignReferenceHashes } from '../../../analyzers/diagnosis/alignment.js';
import { InputError } from '../../../core/errors.js';

const GOOD = 'a'.repeat(64);
const BAD = 'b'.repeat(64);
const OTHER = 'c'.repeat(64);

describe('bit-wise alignment of reference-step hashes (ByteRobust §4.3)', () => {
  it('names the machines that disagree with a strict majority', () => {
    const verdict = alignReferenceHashes({ n1: GOOD, n2: BAD, n3: GOOD, n4: GOOD });
    expect(verdict).toEqual({
      aligned: true,
      hash: GOOD,
      basis: 'majority',
      outliers: ['n2'],
      groups: [
        { hash: GOOD, machines: ['n1', 'n3', 'n4'] },
        { hash: BAD, machines: ['n2'] },
      ],
    });
  });

  it('names nobody when every machine agrees', () => {
    expect(
      alignReferenceHashes(
        new Map([
          ['n1', GOOD],
          ['n2', GOOD],
        ]),
      ),
    ).toMatchObject({ aligned: true, outliers: [] });
  });

  it('names nobody, and says why, when the largest output is held by exactly half', () => {
    const verdict = alignReferenceHashes({ n1: GOOD, n2: BAD, n3: GOOD, n4: BAD });
    expect(verdict.aligned).toBe(false);
    expect(verdict.outliers).toEqual([]);
    expect(verdict).toMatchObject({ reason: expect.stringContaining('no strict majority among 4 reference hashes (2 distinct outputs, 2 vs 2)') });
  });

  it('names nobody when a plurality is not a majority (2 vs 1 vs 1)', () => {
    const verdict = alignReferenceHashes({ n1: GOOD, n2: GOOD, n3: BAD, n4: OTHER });
    expect(verdict).toMatchObject({ aligned: false, outliers: [], reason: expect.stringContaining('2 vs 1 vs 1') });
  });

  it('names every machine that differs from a known-good hash, even a majority of them', () => {
    const verdict = alignReferenceHashes({ n1: BAD, n2: BAD, n3: GOOD }, { expectedHash: GOOD });
    expect(verdict).toMatchObject({ aligned: true, basis: 'expected', hash: GOOD, outliers: ['n1', 'n2'] });
  });

  it('has no basis for a verdict without any hash, and rejects an empty hash', () => {
    expect(alignReferenceHashes({})).toMatchObject({ aligned: false, outliers: [], reason: 'no machine produced a reference hash' });
    expect(() => alignReferenceHashes({ n1: '' })).toThrow(InputError);
  });
});
