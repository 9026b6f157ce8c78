import fc from 'fast-check';
import { expect } from 'vitest';
import { hostileString } from '../support/hostile.js';

/**
 * Request bodies for the HTTP fuzz targets: a valid body with one thing changed (a field
 * replaced, removed or added, the whole repeated in an array), arbitrary JSON, and bytes that
 * are not JSON at all, sent with varied content types and encodings. Not a test file itself.
 */

type Path = readonly (string | number)[];

/** Values that break schemas in interesting ways: wrong types, edge numbers, hostile strings, dates at the ends of time. */
export const anyValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  hostileString,
  fc.constantFrom<unknown>(
    null,
    true,
    false,
    0,
    -1,
    -0,
    0.5,
    1e308,
    -1e308,
    2 ** 31,
    2 ** 53,
    2 ** 53 + 2,
    'nan',
    'inf',
    '-inf',
    '',
    [],
    {},
    [[]],
    { '': null },
    '1970-01-01T00:00:00Z',
    '9999-12-31T23:59:59Z',
    '2026-11-21T10:00:00.000Z',
    '2026-02-30T10:00:00Z',
    'xid',
    'gpu_lost',
    '0000:3b:00',
    '79',
    'v2',
  ),
  fc.integer(),
  fc.double({ noNaN: true }),
  fc.string({ maxLength: 300 }),
  fc.array(fc.jsonValue({ maxDepth: 1 }), { maxLength: 5 }),
);

function pathsOf(value: unknown, prefix: Path = []): Path[] {
  const found: Path[] = [prefix];
  if (Array.isArray(value)) value.forEach((item, index) => found.push(...pathsOf(item, [...prefix, index])));
  else if (typeof value === 'object' && value !== null) for (const [key, item] of Object.entries(value)) found.push(...pathsOf(item, [...prefix, key]));
  return found;
}

function parentOf(root: unknown, path: Path): Record<string | number, unknown> | undefined {
  let cursor: unknown = root;
  for (const key of path.slice(0, -1)) cursor = (cursor as Record<string | number, unknown>)[key];
  return typeof cursor === 'object' && cursor !== null ? (cursor as Record<string | number, unknown>) : undefined;
}

type Mutation = 'replace' | 'delete' | 'add_field' | 'repeat' | 'whole';

/** `base` with one mutation applied at one of its paths. */
export function mutationsOf(base: unknown): fc.Arbitrary<unknown> {
  const paths = pathsOf(base);
  return fc
    .record({
      path: fc.constantFrom(...paths),
      mutation: fc.constantFrom<Mutation>('replace', 'replace', 'replace', 'delete', 'add_field', 'repeat', 'whole'),
      value: anyValue,
      key: fc.oneof(fc.constantFrom('__proto__', 'constructor', 'extra', 'kind', 'node'), fc.string({ maxLength: 12 })),
      copies: fc.oneof(fc.integer({ min: 0, max: 3 }), fc.constantFrom(100, 101, 1000, 1001)),
    })
    .map(({ path, mutation, value, key, copies }) => {
      const copy: unknown = structuredClone(base);
      if (mutation === 'whole' || (path.length === 0 && mutation !== 'add_field' && mutation !== 'repeat')) return value;
      if (mutation === 'repeat') return Array.from({ length: copies }, () => structuredClone(copy));
      if (mutation === 'add_field') {
        const target = path.length === 0 ? copy : (parentOf(copy, [...path, '']) ?? copy);
        if (typeof target === 'object' && target !== null && !Array.isArray(target)) {
          // defineProperty, so that "__proto__" becomes a real key as JSON.parse would make it.
          Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
        }
        return copy;
      }
      const parent = parentOf(copy, path);
      const last = path.at(-1) as string | number;
      if (!parent) return copy;
      if (mutation === 'delete') {
        if (Array.isArray(parent) && typeof last === 'number') parent.splice(last, 1);
        else delete parent[last];
      } else {
        parent[last] = value;
      }
      return copy;
    });
}

export interface RequestBody {
  readonly body: string | Uint8Array<ArrayBuffer>;
  readonly contentType?: string | undefined;
  readonly contentEncoding?: string | undefined;
  /** What kind of input this is, for the report. */
  readonly shape: 'mutated' | 'json' | 'raw';
}

/** Bytes that are not JSON, or JSON that parsers and schemas handle badly. */
function rawBodies(base: unknown): fc.Arbitrary<string | Uint8Array<ArrayBuffer>> {
  const text = JSON.stringify(base);
  return fc.oneof(
    fc.string({ maxLength: 200 }),
    fc.integer({ min: 0, max: text.length - 1 }).map((cut) => text.slice(0, cut)),
    fc.uint8Array({ maxLength: 300 }).map((bytes) => new Uint8Array(bytes)),
    fc.integer({ min: 1, max: 5000 }).map((depth) => `${'['.repeat(depth)}${']'.repeat(depth)}`),
    fc.integer({ min: 1, max: 5000 }).map((depth) => `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`),
    fc.constantFrom(
      '',
      'null',
      '"text"',
      '123',
      '1'.repeat(400),
      '{"__proto__": {"polluted": true}}',
      '{"constructor": {"prototype": {"polluted": true}}}',
      '{"a": 1, "a": 2}',
      '[]',
      '{}',
      '\ufeff{}',
      `${text}garbage`,
      `${text}${text}`,
    ),
  );
}

/** Any request body for an endpoint whose valid body is one of `bases`. */
export function requestBodies(bases: readonly unknown[]): fc.Arbitrary<RequestBody> {
  // Mostly what a real sender sends, so most inputs reach the schemas; the rest try the media-type checks.
  const contentType = fc.oneof(
    { weight: 8, arbitrary: fc.constantFrom<string | undefined>('application/json', 'application/json; charset=utf-8') },
    {
      weight: 2,
      arbitrary: fc.constantFrom<string | undefined>(
        'text/plain',
        undefined,
        'application/x-www-form-urlencoded',
        'application/json; charset=utf-16',
        'multipart/form-data; boundary=x',
      ),
    },
  );
  const contentEncoding = fc.oneof(
    { weight: 9, arbitrary: fc.constantFrom<string | undefined>(undefined, 'identity') },
    { weight: 1, arbitrary: fc.constantFrom<string | undefined>('gzip', 'x-unknown') },
  );
  const body = fc
    .constantFrom(...bases)
    .chain((base) =>
      fc.oneof(
        { weight: 6, arbitrary: mutationsOf(base).map((value) => ({ body: JSON.stringify(value) ?? 'null', shape: 'mutated' as const })) },
        { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 3 }).map((value) => ({ body: JSON.stringify(value), shape: 'json' as const })) },
        { weight: 2, arbitrary: rawBodies(base).map((raw) => ({ body: raw, shape: 'raw' as const })) },
      ),
    );
  return fc.record({ body, contentType, contentEncoding }).map(({ body: chosen, contentType: type, contentEncoding: encoding }) => ({
    ...chosen,
    contentType: type,
    contentEncoding: encoding,
  }));
}

export interface Answer {
  readonly status: number;
  readonly contentType: string;
  readonly text: string;
}

/**
 * The contract every API answer keeps under fuzzing: never a 5xx, always JSON, and an error
 * answer carries a sentence in `error`. Returns the status as the outcome label.
 */
export function expectWellFormed(answer: Answer, allowed: readonly number[], input: unknown): string {
  const where = `answer ${answer.status} ${answer.text.slice(0, 300)} to ${JSON.stringify(input)?.slice(0, 300)}`;
  expect(allowed, where).toContain(answer.status);
  expect(answer.contentType, where).toMatch(/^application\/json/);
  const body = JSON.parse(answer.text) as unknown;
  expect(typeof body === 'object' && body !== null, where).toBe(true);
  if (answer.status >= 400) {
    const error = (body as { error?: unknown }).error;
    expect(typeof error === 'string' && error.length > 0, where).toBe(true);
  }
  return String(answer.status);
}

/** JSON.parse with "__proto__" must never have reached Object.prototype. */
export function expectNoPrototypePollution(): void {
  expect((Object.prototype as Record<string, unknown>).polluted).toBeUndefined();
  expect(({} as Record<string, unknown>).polluted).toBeUndefined();
}
