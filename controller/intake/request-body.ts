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

/** Decodes and parses a complete body, or says why it cannot be. */
function parseBody(bytes: Buffer): { value: unknown } | BodyRefused {
  let text: string;
  try {
    text = UTF8.decode(bytes);
  } catch {
    return { status: 400, reason: 'unreadable', message: 'request body is not valid UTF-8' };
  }
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch (error) {
    return { status: 400, reason: 'unreadable', message: `request body is not valid JSON: ${(error as Error).message}` };
  }
  // The cheap test on the text first: only a body that has one is walked to name the field.
  if (ESCAPED_NUL.test(text)) {
    const where = pathOfNul(value, []) ?? [];
    return { status: 400, reason: 'unreadable', message: `${where.join('.') || '(root)'}: must not contain a NUL character (\\u0000)` };
  }
  return { value };
}

/** Where the first string (a value or a key) holding a NUL is, as a field path. */
function pathOfNul(value: unknown, path: string[]): string[] | undefined {
  if (typeof value === 'string') return value.includes('\0') ? path : undefined;
  if (typeof value !== 'object' || value === null) return undefined;
  for (const [key, item] of Object.entries(value)) {
    if (key.includes('\0')) return [...path, JSON.stringify(key)];
    const found = pathOfNul(item, [...path, key]);
    if (found) return found;
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
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let received = 0;
    let done = false;
    const started = Date.now();
    const slow = setInterval(() => {
      const elapsed = Date.now() - started;
      if (elapsed < SLOW_BODY_GRACE_MS || received >= (MIN_BYTES_PER_SECOND * elapsed) / 1000) return;
      chunks.length = 0;
      // The rest of the body is not waited for: the connection ends with the answer.
      res.setHeader('Connection', 'close');
      finish({ status: 408, reason: 'too_slow', message: `request body arrived at ${Math.round((received * 1000) / elapsed)} bytes/s, below the ${MIN_BYTES_PER_SECOND} bytes/s the controller waits for` });
    }, 500);
    slow.unref();
    const finish = (outcome: { value: unknown } | BodyRefused): void => {
      if (done) return;
      done = true;
      clearInterval(slow);
      req.off('data', onData);
      resolve(outcome);
    };
    const onData = (chunk: Buffer): void => {
      received += chunk.length;
      if (received > declared) {
        // A chunked body past the limit, or more bytes than the Content-Length promised.
        chunks.length = 0;
        finish({ status: 413, reason: 'too_large', message: `request body larger than ${maxBytes} bytes` });
        return;
      }
      chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('end', () => {
      const bytes = Buffer.concat(chunks, received);
      // The chunks would otherwise live as long as the request, beside the parsed body.
      chunks.length = 0;
      finish(parseBody(bytes));
    });
    req.once('error', (error) => finish({ status: 400, reason: 'unreadable', message: `request body could not be read: ${error.message}` }));
  });
}

/**
 * Express middleware that sets `req.body` to the parsed JSON body (left undefined when the
 * request has none) or answers the refusal through `refuse`.
 */
export function jsonBody(limits: BodyLimits, refuse: (req: Request, res: Response, refusal: BodyRefused) => void, owner: (res: Response) => string = () => ''): (req: Request, res: Response, next: NextFunction) => void {
  // One request may pass this middleware more than once (it sits in front of several routers):
  // the body is read the first time only.
  const read = new WeakSet<Request>();
  return (req, res, next) => {
    if (read.has(req)) return next();
    read.add(req);
    readJsonBody(req, res, limits, owner(res)).then((outcome) => {
      if (outcome === undefined) return next();
      if ('value' in outcome) {
        req.body = outcome.value;
        next();
      } else {
        refuse(req, res, outcome);
      }
    }, next);
  };
}
