import { createHash } from 'node:crypto';
import { z } from 'zod';
import { identitySchema, type Identity } from './credentials.js';
import {
  APPEND_INDEXED,
  INDEX_CHUNK,
  INDEX_EARLIER,
  PREFIX_END,
  QUERY_VALUE_MAX_CHARS,
  READ_INDEXED,
  indexPrefixes,
  sortableId,
  type IndexFilter,
} from './audit-index.js';
import { StoreUnavailableError, errorMessage } from './errors.js';
import { luaScript, type Keys, type Redis } from './redis.js';
import { AUDIT_DATA_MAX_BYTES, AUDIT_SUMMARY_MAX_BYTES } from './retention.js';

/**
 * The audit trail: an append-only Redis stream of every signal, decision and action, each with
 * the reason it exists (docs/architecture.md, contracts). Readable by `steadfast audit`, `GET
 * /api/v1/audit` and Grafana.
 */

/** `access`: a credential refused for acting outside its scope (controller/intake/auth.ts). */
export const AUDIT_TYPES = ['signal', 'decision', 'action', 'access'] as const;
export type AuditType = (typeof AUDIT_TYPES)[number];

export interface AuditInput {
  readonly type: AuditType;
  /** The id of the signal, decision or action the entry is about. */
  readonly ref: string;
  readonly node?: string | undefined;
  /** One line a human reads in the timeline. */
  readonly summary: string;
  readonly data: Record<string, unknown>;
  /**
   * Who caused it: the credential behind the request, or behind the signal a decision or action
   * followed from; the controller itself for its own timers and analyzers. Absent: not known
   * (entries written before identities were recorded).
   */
  readonly actor?: Identity | undefined;
}

export interface AuditEntry extends AuditInput {
  /** The stream id (`<ms>-<seq>`), usable as a cursor. */
  readonly id: string;
  readonly time: string;
}

/** The most entries one read returns; page on with `after` (the last id seen). */
export const AUDIT_PAGE_MAX = 1000;

export const auditQuerySchema = z
  .object({
    limit: z.coerce.number().int().min(1).max(AUDIT_PAGE_MAX).default(100),
    /** Only entries after this stream id, for tailing. */
    after: z
      .string()
      .regex(/^\d+-\d+$/, 'must be a stream id like 1700000000000-0')
      .optional(),
    type: z.enum(AUDIT_TYPES).optional(),
    node: z.string().max(QUERY_VALUE_MAX_CHARS.node).optional(),
    ref: z.string().max(QUERY_VALUE_MAX_CHARS.ref).optional(),
  })
  .strict();

/** In-process readers (the controller's own checks, the tests, the lab) may take bigger pages. */
const auditReadSchema = auditQuerySchema.extend({ limit: z.coerce.number().int().min(1).max(100_000).default(100) });

export type AuditQuery = z.input<typeof auditReadSchema>;

const CUT_MARKER = '…[cut]';

/** `text` within `maxBytes` of UTF-8: cut between characters, ending in CUT_MARKER, when longer. */
function cutToBytes(text: string, maxBytes: number): string {
  if (Buffer.byteLength(text) <= maxBytes) return text;
  const room = maxBytes - Buffer.byteLength(CUT_MARKER);
  let bytes = 0;
  let end = 0;
  for (const char of text) {
    bytes += Buffer.byteLength(char);
    if (bytes > room) break;
    end += char.length;
  }
  return `${text.slice(0, end)}${CUT_MARKER}`;
}

/**
 * A write-once marker as stored: one longer than an entry's summary may be (the default marker
 * holds the whole summary, before it is cut) is kept as its hash, which tells the same markers
 * apart as well, so that the marker costs no more than the audit's share counts for it.
 */
function boundedMarker(once: string): string {
  return Buffer.byteLength(once) <= AUDIT_SUMMARY_MAX_BYTES ? once : `sha256:${createHash('sha256').update(once).digest('hex')}`;
}

/**
 * The entry's summary and data as stored: within AUDIT_SUMMARY_MAX_BYTES and
 * AUDIT_DATA_MAX_BYTES, so that the audit's length cap is a byte cap too. Data too large is
 * replaced by its size and the start of its JSON, saying so.
 */
export function boundedAuditFields(entry: Pick<AuditInput, 'summary' | 'data'>): { summary: string; data: string } {
  // Bytes, not characters: a summary naming a request's path may be all three-byte characters.
  const summary = cutToBytes(entry.summary, AUDIT_SUMMARY_MAX_BYTES);
  const data = JSON.stringify(entry.data);
  const bytes = Buffer.byteLength(data);
  if (bytes <= AUDIT_DATA_MAX_BYTES) return { summary, data };
  // Characters may take up to 3 bytes in UTF-8 (4 as surrogate pairs, counted as 2 here).
  const excerpt = data.slice(0, Math.floor((AUDIT_DATA_MAX_BYTES - 256) / 3));
  return { summary, data: JSON.stringify({ truncated: true, bytes, excerpt }) };
}

export class AuditLog {
  private readonly appendOnce: (...args: (string | number)[]) => Promise<unknown>;
  private readonly indexEarlier: (...args: (string | number)[]) => Promise<unknown>;
  private readonly readIndexed: (...args: (string | number)[]) => Promise<unknown>;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly maxLength = 100_000,
  ) {
    this.appendOnce = luaScript(redis, 'steadfastAuditAppendIndexed', 4, APPEND_INDEXED);
    this.indexEarlier = luaScript(redis, 'steadfastAuditIndexEarlier', 3, INDEX_EARLIER);
    this.readIndexed = luaScript(redis, 'steadfastAuditReadIndexed', 2, READ_INDEXED);
  }

  /**
   * Appends an entry unless one with the same `once` marker is still in the audit. Returns the
   * stream id, or undefined when the entry already existed.
   */
  async append(entry: AuditInput, once: string = `${entry.type}:${entry.ref}:${entry.summary}`): Promise<string | undefined> {
    const { summary, data } = boundedAuditFields(entry);
    const marker = boundedMarker(once);
    const now = Date.now();
    try {
      const id = (await this.appendOnce(
        this.keys.auditWritten,
        this.keys.audit,
        this.keys.auditIndex,
        this.keys.auditIndexedFrom,
        marker,
        String(this.maxLength),
        entry.type,
        entry.ref,
        entry.node ?? '',
        summary,
        data,
        new Date(now).toISOString(),
        String(now),
        entry.actor ? JSON.stringify(entry.actor) : '',
      )) as string | null;
      return id ?? undefined;
    } catch (error) {
      throw new StoreUnavailableError(`audit append failed: ${errorMessage(error)}`, error);
    }
  }

  /**
   * Newest-last list of entries matching the query: the newest `limit` of them, or with `after`
   * the first `limit` after that id. A filter (type, node, ref) reads the audit's index
   * (core/audit-index.ts) and fetches only the entries it names, in chunks of INDEX_CHUNK: an
   * entry deep in the stream is found without reading the entries around it. A ref with a node or
   * type reads the index of the two that names fewer entries.
   */
  async read(query: AuditQuery = {}): Promise<AuditEntry[]> {
    const parsed = auditReadSchema.parse(query);
    const filter: IndexFilter = { type: parsed.type, node: parsed.node, ref: parsed.ref };
    const prefixes = indexPrefixes(filter);
    // A value too long to be indexed is in no entry a query can name.
    if (prefixes === undefined) return [];
    return prefixes.length === 0 ? this.readStream(parsed.limit, parsed.after) : this.readFiltered(filter, prefixes, parsed.limit, parsed.after);
  }

  /** The newest `limit` entries, or the first `limit` after `after`. */
  private async readStream(limit: number, after: string | undefined): Promise<AuditEntry[]> {
    const forward = after !== undefined;
    const found: AuditEntry[] = [];
    // Exclusive bounds (`(id`) from the second chunk on: Redis 6.2 and later.
    let bound = forward ? `(${after}` : '+';
    while (found.length < limit) {
      const chunk = Math.min(READ_CHUNK, limit - found.length);
      const rows = await fromStore(() =>
        forward ? this.redis.xrange(this.keys.audit, bound, '+', 'COUNT', chunk) : this.redis.xrevrange(this.keys.audit, bound, '-', 'COUNT', chunk),
      );
      for (const [id, fields] of rows) found.push(decode(id, fields));
      const last = rows.at(-1);
      if (rows.length < chunk || last === undefined) break;
      bound = `(${last[0]}`;
    }
    return forward ? found : found.reverse();
  }

  private async readFiltered(filter: IndexFilter, prefixes: readonly string[], limit: number, after: string | undefined): Promise<AuditEntry[]> {
    await this.indexEarlierEntries();
    const matches = (entry: AuditEntry): boolean =>
      (!filter.type || entry.type === filter.type) && (!filter.node || entry.node === filter.node) && (!filter.ref || entry.ref === filter.ref);
    // Only a ref with a node or type has two indexes to choose from, and the chosen one may name
    // entries of the other's that do not match.
    const exact = prefixes.length === 1;
    const prefix = await this.narrowest(prefixes);
    const forward = after !== undefined;
    const found: AuditEntry[] = [];
    let min = forward ? `(${prefix}${sortableId(after)}` : `(${prefix}`;
    let max = `(${prefix}${PREFIX_END}`;
    while (found.length < limit) {
      // Where every entry the index names is a match, fetch no more than the answer needs.
      const chunk = exact ? Math.min(INDEX_CHUNK, limit - found.length) : INDEX_CHUNK;
      const [members, last, rows] = (await fromStore(() =>
        this.readIndexed(this.keys.auditIndex, this.keys.audit, min, max, forward ? 'FWD' : 'REV', chunk),
      )) as [number, string, [string, string[]][]];
      for (const [id, fields] of rows) {
        const entry = decode(id, fields);
        if (matches(entry)) found.push(entry);
        if (found.length >= limit) break;
      }
      if (members < chunk) break;
      if (forward) min = `(${prefix}${last}`;
      else max = `(${prefix}${last}`;
    }
    return forward ? found : found.reverse();
  }

  /** Of the filters' index prefixes, the one with the fewest members. */
  private async narrowest(prefixes: readonly string[]): Promise<string> {
    const [first, ...others] = prefixes as [string, ...string[]];
    if (others.length === 0) return first;
    const counts = await Promise.all(
      prefixes.map((prefix) => fromStore(() => this.redis.zlexcount(this.keys.auditIndex, `(${prefix}`, `(${prefix}${PREFIX_END}`))),
    );
    let best = 0;
    counts.forEach((count, index) => {
      if (count < (counts[best] as number)) best = index;
    });
    return prefixes[best] as string;
  }

  /**
   * Indexes the entries written before the index existed, once: a chunk per call, so that Redis
   * serves other clients in between. After that, one GET per filtered read.
   */
  private async indexEarlierEntries(): Promise<void> {
    let done = false;
    while (!done) done = (await fromStore(() => this.indexEarlier(this.keys.audit, this.keys.auditIndex, this.keys.auditIndexedFrom))) === 1;
  }
}

/** A Redis call of a read; its failure is the store's. */
async function fromStore<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call();
  } catch (error) {
    throw new StoreUnavailableError(`audit read failed: ${errorMessage(error)}`, error);
  }
}

/** Stream entries fetched and decoded at a time by a read. */
const READ_CHUNK = 1000;

function decode(id: string, fields: string[]): AuditEntry {
  const map = new Map<string, string>();
  for (let i = 0; i + 1 < fields.length; i += 2) map.set(fields[i] as string, fields[i + 1] as string);
  let data: Record<string, unknown> = {};
  try {
    const parsed: unknown = JSON.parse(map.get('data') ?? '{}');
    if (typeof parsed === 'object' && parsed !== null) data = parsed as Record<string, unknown>;
  } catch {
    data = { unreadable: map.get('data') };
  }
  const type = map.get('type');
  const actor = decodeActor(map.get('actor'));
  return {
    id,
    time: map.get('time') ?? new Date(Number(id.split('-')[0])).toISOString(),
    type: (AUDIT_TYPES as readonly string[]).includes(type ?? '') ? (type as AuditType) : 'signal',
    ref: map.get('ref') ?? '',
    node: map.get('node') || undefined,
    summary: map.get('summary') ?? '',
    data,
    ...(actor ? { actor } : {}),
  };
}

function decodeActor(raw: string | undefined): Identity | undefined {
  if (!raw) return undefined;
  try {
    const parsed = identitySchema.safeParse(JSON.parse(raw));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}
