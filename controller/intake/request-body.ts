import type { IncomingMessage, ServerResponse } from 'node:http';
import type { NextFunction, Request, Response } from 'express';

/**
 * Reads a JSON request body under three bounds: one request's size (`maxBytes`, 413), the bytes
 * all requests together may hold in memory at once (`budget`, 503 with Retry-After), and each
 * credential's share of that budget, so that one credential's requests cannot hold it all while
 * the others' wait. The first two are judged from Content-Length before a byte is read, so a
 * burst of big webhooks is turned away before it costs memory, and a sender told 503 has had
 * nothing stored: its retry is the first delivery. A chunked body, whose size is unknown,
 * reserves a whole `maxBytes`. A body that arrives slower than MIN_BYTES_PER_SECOND, past a
 * grace period, is cut off (408): trickling bytes cannot hold a share for the request timeout.
 *
 * The body must be what Alertmanager and the agents send: `application/json`, UTF-8, not
 * compressed. Anything else is refused with a message naming what was wrong.
 */

export type BodyRefusal = 'unsupported_media_type' | 'too_large' | 'busy' | 'unreadable' | 'too_slow';

export interface BodyRefused {
  readonly status: 400 | 408 | 413 | 415 | 503;
  readonly reason: BodyRefusal;
  readonly message: string;
}

/** A body past this long that has come slower than MIN_BYTES_PER_SECOND is cut off. */
const SLOW_BODY_GRACE_MS = 2000;
const MIN_BYTES_PER_SECOND = 16 * 1024;

/** The bytes of request bodies held in memory now, against a fixed total and a share per credential. */
export class BodyBudget {
  private used = 0;
  private readonly byOwner = new Map<string, number>();

  /** `shareBytes`: the most one owner (a credential) may hold at once; by default the whole budget. */
  constructor(
    readonly totalBytes: number,
    readonly shareBytes = totalBytes,
  ) {}

  get inUseBytes(): number {
    return this.used;
  }

  ownerBytes(owner: string): number {
    return this.byOwner.get(owner) ?? 0;
  }

  /** Takes `bytes` for `owner` if they fit in the whole budget and in the owner's share. */
  tryTake(bytes: number, owner = ''): boolean {
    const mine = this.ownerBytes(owner);
    if (this.used + bytes > this.totalBytes || mine + bytes > this.shareBytes) return false;
    this.used += bytes;
    this.byOwner.set(owner, mine + bytes);
    return true;
  }

  give(bytes: number, owner = ''): void {
    this.used = Math.max(0, this.used - bytes);
    const left = this.ownerBytes(owner) - bytes;
    if (left > 0) this.byOwner.set(owner, left);
    else this.byOwner.delete(owner);
  }
}

/** One fatal decoder for every body: decode() without `stream` starts afresh each call. */
const UTF8 = new TextDecoder('utf-8', { fatal: true });

const JSON_TYPE = /^application\/json\s*(?:;\s*charset\s*=\s*"?utf-8"?\s*)?$/i;

/** `\u0000` written as an escape in a JSON string (an even run of backslashes before it is text, not an escape). */
const ESCAPED_NUL = /(?:^|[^\\])(?:\\\\)*\\u0000/;

/** Whether the request carries a body at all (RFC 9112 §6.3: a length or a transfer coding). */
function hasBody(req: IncomingMessage): boolean {
  return req.headers['transfer-encoding'] !== undefined || (req.headers['content-length'] !== undefined && req.headers['content-length'] !== '0');
}

/** The refusal for headers that cannot carry an acceptable body, or undefined when they can. */
function refuseHeaders(req: IncomingMessage, maxBytes: number): BodyRefused | undefined {
  const type = req.headers['content-type'];
  if (type === undefined || !JSON_TYPE.test(type.trim())) {
    return {
      status: 415,
      reason: 'unsupported_media_type',
      message: `request body must be sent as "Content-Type: application/json" (UTF-8); got ${type === undefined ? 'no Content-Type' : JSON.stringify(type.slice(0, 100))}`,
    };
  }
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.trim().toLowerCase() !== 'identity') {
    return { status: 415, reason: 'unsupported_media_type', message: `request body must not be compressed; got "Content-Encoding: ${encoding.slice(0, 50)}"` };
  }
  const length = Number(req.headers['content-length']);
  if (req.headers['content-length'] !== undefined && length > maxBytes) {
    return { status: 413, reason: 'too_large', message: `request body larger than ${maxBytes} bytes` };
  }
  return undefined;
}

/**
 * How deeply a body may nest arrays and objects. Every body the controller takes nests a handful
 * of levels (a job registration's topology ranks: 4; an Alertmanager webhook's labels: 3); a body
 * nested thousands deep is refused before it is parsed, so that nothing that walks a body
 * afterwards (validation, the NUL search, a log line) can be made to run out of stack.
 */
export const MAX_BODY_DEPTH = 64;

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;

/**
 * Whether JSON text nests arrays and objects deeper than `limit`, outside strings: one pass over
 * the bytes, skipping each string with a native search for its closing quote. A multi-byte UTF-8
 * sequence holds no ASCII byte, so the bytes can be read without decoding. Text that is not JSON
 * may be judged either way; the parser refuses it afterwards.
 */
export function nestsDeeperThan(bytes: Uint8Array, limit: number): boolean {
  let depth = 0;
  for (let index = 0; index < bytes.length; index += 1) {
    const byte = bytes[index];
    if (byte === QUOTE) {
      index = closingQuote(bytes, index + 1);
      if (index === -1) return false;
    } else if (byte === OPEN_BRACKET || byte === OPEN_BRACE) {
      depth += 1;
      if (depth > limit) return true;
    } else if (byte === CLOSE_BRACKET || byte === CLOSE_BRACE) {
      depth -= 1;
    }
  }
  return false;
}

/** The index of the quote that ends a string whose text starts at `from` (one after an odd run of backslashes is escaped), or -1. */
function closingQuote(bytes: Uint8Array, from: number): number {
  for (let quote = bytes.indexOf(QUOTE, from); quote !== -1; quote = bytes.indexOf(QUOTE, quote + 1)) {
    let backslashes = 0;
    while (quote - backslashes - 1 >= from && bytes[quote - backslashes - 1] === BACKSLASH) backslashes += 1;
    if (backslashes % 2 === 0) return quote;
  }
  return -1;
}

/** Decodes and parses a complete body, or says why it cannot be. */
function parseBody(bytes: Buffer): { value: unknown } | BodyRefused {
  let text: string;
  try {
    text = UTF8.decode(bytes);
  } catch {
    return { status: 400, reason: 'unreadable', message: 'request body is not valid UTF-8' };
  }
  if (nestsDeeperThan(bytes, MAX_BODY_DEPTH)) {
    return { status: 400, reason: 'unreadable', message: `request body nests deeper than ${MAX_BODY_DEPTH} levels of arrays and objects` };
  }
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch (error) {
    return { status: 400, reason: 'unreadable', message: `request body is not valid JSON: ${(error as Error).message}` };
  }
  // The cheap test on the text first: only a body that has one is walked to name the field.
  if (ESCAPED_NUL.test(text)) {
    const where = pathOfNul(value) ?? [];
    return { status: 400, reason: 'unreadable', message: `${where.join('.') || '(root)'}: must not contain a NUL character (\\u0000)` };
  }
  return { value };
}

/** A value met on the walk, with the key it was found under and the place of its parent. */
interface Place {
  readonly value: unknown;
  readonly key: string | undefined;
  readonly parent: Place | undefined;
}

/** The field path from the body's root to `place`. */
function pathTo(place: Place): string[] {
  const path: string[] = [];
  for (let at: Place | undefined = place; at?.key !== undefined; at = at.parent) path.push(at.key);
  return path.reverse();
}

/**
 * Where the first string (a value or a key) holding a NUL is, as a field path. A walk with its
 * own stack, in document order: a body's depth never reaches the call stack.
 */
function pathOfNul(root: unknown): string[] | undefined {
  const stack: Place[] = [{ value: root, key: undefined, parent: undefined }];
  for (let place = stack.pop(); place !== undefined; place = stack.pop()) {
    const { value, key, parent } = place;
    if (key?.includes('\0') && parent !== undefined) return [...pathTo(parent), JSON.stringify(key)];
    if (typeof value === 'string') {
      if (value.includes('\0')) return pathTo(place);
      continue;
    }
    if (typeof value !== 'object' || value === null) continue;
    const entries = Object.entries(value);
    // Pushed last first, so that the first entry is walked first.
    for (let index = entries.length - 1; index >= 0; index -= 1) {
      const [key, item] = entries[index] as [string, unknown];
      stack.push({ value: item, key, parent: place });
    }
  }
  return undefined;
}

export interface BodyLimits {
  readonly maxBytes: number;
  readonly budget: BodyBudget;
}

/**
 * Reads and parses a request's JSON body: its value, the refusal to answer, or undefined when the
 * request has no body. The bytes it reserves in the budget are given back when the answer is sent.
 * Rejects only on a failure of its own (a bug): the caller answers that request 500.
 */
export function readJsonBody(req: IncomingMessage, res: ServerResponse, limits: BodyLimits, owner = ''): Promise<{ value: unknown } | BodyRefused | undefined> {
  const { maxBytes, budget } = limits;
  if (!hasBody(req)) return Promise.resolve(undefined);
  const refusedHeaders = refuseHeaders(req, maxBytes);
  if (refusedHeaders) return Promise.resolve(refusedHeaders);
  const declared = req.headers['content-length'] === undefined ? maxBytes : Number(req.headers['content-length']);
  if (!budget.tryTake(declared, owner)) {
    const mine = budget.ownerBytes(owner);
    return Promise.resolve({
      status: 503,
      reason: 'busy',
      message:
        mine + declared > budget.shareBytes
          ? `this credential's requests hold ${mine} bytes of request bodies, and ${declared} more would pass its share of ${budget.shareBytes}; nothing was stored, retry later`
          : `the controller holds ${budget.inUseBytes} bytes of request bodies, near its limit of ${budget.totalBytes}; nothing was stored, retry later`,
    });
  }
  // Held until the answer is sent: the parsed body and its signals live that long.
  res.once('close', () => budget.give(declared, owner));
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let received = 0;
    let done = false;
    const started = Date.now();
    const stop = (): boolean => {
      if (done) return false;
      done = true;
      clearInterval(slow);
      req.off('data', onData);
      return true;
    };
    const finish = (outcome: { value: unknown } | BodyRefused): void => {
      if (stop()) resolve(outcome);
    };
    // These listeners run on the request's events, outside any caller's try: a failure in one
    // (a bug, or a body no check foresaw) must fail this request, never reach the process.
    const guarded =
      <A extends unknown[]>(listener: (...args: A) => void) =>
      (...args: A): void => {
        try {
          listener(...args);
        } catch (error) {
          if (stop()) reject(error);
        }
      };
    const slow = setInterval(
      guarded(() => {
        const elapsed = Date.now() - started;
        if (elapsed < SLOW_BODY_GRACE_MS || received >= (MIN_BYTES_PER_SECOND * elapsed) / 1000) return;
        chunks.length = 0;
        // The rest of the body is not waited for: the connection ends with the answer.
        res.setHeader('Connection', 'close');
        finish({
          status: 408,
          reason: 'too_slow',
          message: `request body arrived at ${Math.round((received * 1000) / elapsed)} bytes/s, below the ${MIN_BYTES_PER_SECOND} bytes/s the controller waits for`,
        });
      }),
      500,
    );
    slow.unref();
    const onData = guarded((chunk: Buffer): void => {
      received += chunk.length;
      if (received > declared) {
        // A chunked body past the limit, or more bytes than the Content-Length promised.
        chunks.length = 0;
        finish({ status: 413, reason: 'too_large', message: `request body larger than ${maxBytes} bytes` });
        return;
      }
      chunks.push(chunk);
    });
    req.on('data', onData);
    req.once(
      'end',
      guarded(() => {
        const bytes = Buffer.concat(chunks, received);
        // The chunks would otherwise live as long as the request, beside the parsed body.
        chunks.length = 0;
        finish(parseBody(bytes));
      }),
    );
    req.once(
      'error',
      guarded((error: Error) => finish({ status: 400, reason: 'unreadable', message: `request body could not be read: ${error.message}` })),
    );
  });
}

/**
 * Express middleware that sets `req.body` to the parsed JSON body (left undefined when the
 * request has none) or answers the refusal through `refuse`.
 */
export function jsonBody(
  limits: BodyLimits,
  refuse: (req: Request, res: Response, refusal: BodyRefused) => void,
  owner: (res: Response) => string = () => '',
): (req: Request, res: Response, next: NextFunction) => void {
  // One request may pass this middleware more than once (it sits in front of several routers):
  // the body is read the first time only.
  const read = new WeakSet<Request>();
  return (req, res, next) => {
    if (read.has(req)) return next();
    read.add(req);
    readJsonBody(req, res, limits, owner(res))
      .then((outcome) => {
        if (outcome === undefined) return next();
        if ('value' in outcome) {
          req.body = outcome.value;
          next();
        } else {
          refuse(req, res, outcome);
        }
      }, next)
      // A refusal that fails to be sent goes to the app's error handler too (next never throws).
      .catch(next);
  };
}
