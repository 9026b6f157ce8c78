import { z } from 'zod';
import { identitySchema, type Identity } from './credentials.js';
import { StoreUnavailableError, errorMessage } from './errors.js';
import { luaScript, type Keys, type Redis } from './redis.js';
import { AUDIT_DATA_MAX_BYTES, AUDIT_SUMMARY_MAX_CHARS } from './retention.js';

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
    node: z.string().max(64).optional(),
    ref: z.string().max(128).optional(),
  })
  .strict();

/** In-process readers (the controller's own checks, the tests, the lab) may take bigger pages. */
const auditReadSchema = auditQuerySchema.extend({ limit: z.coerce.number().int().min(1).max(100_000).default(100) });

export type AuditQuery = z.input<typeof auditReadSchema>;

// Appends only if the marker is new, so a retried job never writes the same entry twice. The
// markers are a sorted set by time, kept as long as the stream: the newest maxLength of them.
const APPEND_ONCE = `
if redis.call('ZADD', KEYS[1], 'NX', ARGV[9], ARGV[1]) == 0 then
  return false
end
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[2])
if excess > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, excess - 1)
end
return redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'type', ARGV[3], 'ref', ARGV[4], 'node', ARGV[5], 'summary', ARGV[6], 'data', ARGV[7], 'time', ARGV[8], 'actor', ARGV[10])
`;

const CUT_MARKER = '…[cut]';

/**
 * The entry's summary and data as stored: within AUDIT_SUMMARY_MAX_CHARS and
 * AUDIT_DATA_MAX_BYTES, so that the audit's length cap is a byte cap too. Data too large is
 * replaced by its size and the start of its JSON, saying so.
 */
export function boundedAuditFields(entry: Pick<AuditInput, 'summary' | 'data'>): { summary: string; data: string } {
  const summary = entry.summary.length <= AUDIT_SUMMARY_MAX_CHARS ? entry.summary : `${entry.summary.slice(0, AUDIT_SUMMARY_MAX_CHARS - CUT_MARKER.length)}${CUT_MARKER}`;
  const data = JSON.stringify(entry.data);
  const bytes = Buffer.byteLength(data);
  if (bytes <= AUDIT_DATA_MAX_BYTES) return { summary, data };
  // Characters may take up to 3 bytes in UTF-8 (4 as surrogate pairs, counted as 2 here).
  const excerpt = data.slice(0, Math.floor((AUDIT_DATA_MAX_BYTES - 256) / 3));
  return { summary, data: JSON.stringify({ truncated: true, bytes, excerpt }) };
}

export class AuditLog {
  private readonly appendOnce: (...args: (string | number)[]) => Promise<unknown>;

  constructor(
    private readonly redis: Redis,
    private readonly keys: Keys,
    private readonly maxLength = 100_000,
  ) {
    this.appendOnce = luaScript(redis, 'steadfastAuditAppendOnce', 2, APPEND_ONCE);
  }

  /**
   * Appends an entry unless one with the same `once` marker is still in the audit. Returns the
   * stream id, or undefined when the entry already existed.
   */
  async append(entry: AuditInput, once: string = `${entry.type}:${entry.ref}:${entry.summary}`): Promise<string | undefined> {
    const { summary, data } = boundedAuditFields(entry);
    const now = Date.now();
    try {
      const id = (await this.appendOnce(
        this.keys.auditWritten,
        this.keys.audit,
        once,
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
   * the first `limit` after that id. A filter (type, node, ref) walks the whole stream if it must,
   * in chunks of READ_CHUNK entries, keeping only the matches: an entry deep in the stream is
   * found, and no read holds more than one chunk besides its answer nor blocks the event loop for
   * longer than one chunk takes to decode.
   */
  async read(query: AuditQuery = {}): Promise<AuditEntry[]> {
    const parsed = auditReadSchema.parse(query);
    const matches = (entry: AuditEntry): boolean =>
      (!parsed.type || entry.type === parsed.type) &&
      (!parsed.node || entry.node === parsed.node) &&
      (!parsed.ref || entry.ref === parsed.ref);
    const forward = parsed.after !== undefined;
    // Unfiltered, every entry is a match: fetch no more than the answer needs.
    const filtered = Boolean(parsed.type || parsed.node || parsed.ref);
    const found: AuditEntry[] = [];
    // Exclusive bounds (`(id`) from the second chunk on: Redis 6.2 and later.
    let bound = forward ? `(${parsed.after}` : '+';
    for (;;) {
      const chunk = filtered ? READ_CHUNK : Math.min(READ_CHUNK, parsed.limit - found.length);
      let rows: [string, string[]][];
      try {
        rows = forward ? await this.redis.xrange(this.keys.audit, bound, '+', 'COUNT', chunk) : await this.redis.xrevrange(this.keys.audit, bound, '-', 'COUNT', chunk);
      } catch (error) {
        throw new StoreUnavailableError(`audit read failed: ${errorMessage(error)}`, error);
      }
      for (const [id, fields] of rows) {
        const entry = decode(id, fields);
        if (matches(entry)) found.push(entry);
        if (found.length >= parsed.limit) break;
      }
      const last = rows.at(-1);
      if (found.length >= parsed.limit || rows.length < chunk || last === undefined) break;
      bound = `(${last[0]}`;
    }
    return forward ? found : found.reverse();
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
