import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { isDeepStrictEqual, promisify } from 'node:util';
import { z } from 'zod';

/**
 * A stand-in Kubernetes API server that replays recorded exchanges in order. It checks every
 * request against the next recorded one (method, path, query, content type, JSON body and the
 * bearer token) and answers with the recorded response; anything else is written down as a
 * problem and answered 418, so `verify()` fails the test.
 */

const exchangeSchema = z
  .object({
    request: z
      .object({
        method: z.enum(['GET', 'POST', 'PATCH', 'PUT', 'DELETE']),
        path: z.string().startsWith('/'),
        query: z.record(z.string(), z.string()).optional(),
        /** Checked when given: a merge patch and a JSON patch of the same intent are different requests. */
        contentType: z.string().optional(),
        body: z.unknown().optional(),
      })
      .strict(),
    response: z.object({ status: z.number().int().min(100).max(599), body: z.unknown() }).strict(),
  })
  .strict();

export type RecordedExchange = z.infer<typeof exchangeSchema>;

const FIXTURES = new URL('../fixtures/kubernetes/', import.meta.url);

/** Reads `test/fixtures/kubernetes/<name>.json`, a list of recorded exchanges. */
export function recordedExchanges(name: string): RecordedExchange[] {
  return z.array(exchangeSchema).parse(JSON.parse(readFileSync(new URL(`${name}.json`, FIXTURES), 'utf8')));
}

export interface KubeApiStandIn {
  /** Base URL for the backend's `server`. */
  readonly url: string;
  readonly token: string;
  /** Serves these exchanges next, after any not yet consumed. */
  load(exchanges: RecordedExchange[]): void;
  /**
   * Answers every GET of `path` (with `query`) with `response`, however often it comes, where no
   * recorded exchange is due: for a controller that polls on its own clock. A later call for the
   * same request replaces the answer; `verify()` removes them all.
   */
  answer(path: string, response: RecordedExchange['response'], query?: Record<string, string>): void;
  /** How many GETs of `path` the standing answers have served so far. */
  served(path: string): number;
  /**
   * Answers every TokenReview where no recorded exchange is due with what `answer` resolves to for
   * the token under review, whenever it resolves: a slow API server, a flood of reviews.
   * `abandoned` fires when the controller drops the review before its answer. `verify()` removes it.
   */
  reviews(answer: ReviewAnswer): void;
  /** Throws, listing every unexpected request and unconsumed exchange, then starts clean. */
  verify(): void;
  close(): Promise<void>;
}

async function readBody(request: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of request) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

function requestLine(method: string, path: string, query: Record<string, string>): string {
  const search = new URLSearchParams(query).toString();
  return `${method} ${path}${search ? `?${search}` : ''}`;
}

type ReviewAnswer = (token: string, abandoned: AbortSignal) => Promise<RecordedExchange['response']>;

/** The token a TokenReview asks about, when the request is one. */
function reviewedToken(method: string, path: string, body: unknown): string | undefined {
  if (method !== 'POST' || path !== '/apis/authentication.k8s.io/v1/tokenreviews') return undefined;
  const parsed = z.object({ spec: z.object({ token: z.string() }) }).safeParse(body);
  return parsed.success ? parsed.data.spec.token : undefined;
}

/** `tls`: serve https with this key and certificate (PEM), as a real API server does; plain http otherwise. */
export async function startKubeApi(token = 'steadfast-test-token', tls?: { key: string; cert: string }): Promise<KubeApiStandIn> {
  let pending: RecordedExchange[] = [];
  let problems: string[] = [];
  let standing = new Map<string, RecordedExchange['response']>();
  const servedCount = new Map<string, number>();
  let reviewAnswer: ReviewAnswer | undefined;

  function mismatch(
    expected: RecordedExchange | undefined,
    method: string,
    path: string,
    query: Record<string, string>,
    contentType: string | undefined,
    body: unknown,
    auth: string | undefined,
  ): string | undefined {
    const got = requestLine(method, path, query);
    if (!expected) return `unexpected request ${got}: no exchange left`;
    const want = expected.request;
    const wanted = requestLine(want.method, want.path, want.query ?? {});
    if (auth !== `Bearer ${token}`) return `${got}: Authorization ${JSON.stringify(auth)}, expected the bearer token`;
    if (method !== want.method || path !== want.path || !isDeepStrictEqual(query, want.query ?? {})) return `got ${got}, expected ${wanted}`;
    if (want.contentType !== undefined && contentType !== want.contentType) return `${got}: Content-Type ${contentType}, expected ${want.contentType}`;
    if (!isDeepStrictEqual(body, want.body)) return `${got}: body ${JSON.stringify(body)}, expected ${JSON.stringify(want.body)}`;
    return undefined;
  }

  async function serve(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = new URL(request.url ?? '/', 'http://stand-in');
    const method = request.method ?? '';
    const query = Object.fromEntries(url.searchParams);
    const text = await readBody(request);
    let body: unknown;
    try {
      body = text === '' ? undefined : JSON.parse(text);
    } catch {
      body = text;
    }
    const contentType = request.headers['content-type']?.split(';')[0];
    const problem = mismatch(pending[0], method, url.pathname, query, contentType, body, request.headers.authorization);
    const standingAnswer = standing.get(requestLine(method, url.pathname, query));
    const reviewed = reviewedToken(method, url.pathname, body);
    if (problem !== undefined && reviewAnswer !== undefined && reviewed !== undefined && request.headers.authorization === `Bearer ${token}`) {
      const abandoned = new AbortController();
      response.once('close', () => {
        if (!response.writableFinished) abandoned.abort();
      });
      const answer = await reviewAnswer(reviewed, abandoned.signal);
      if (abandoned.signal.aborted) return;
      response.writeHead(answer.status, { 'content-type': 'application/json' });
      response.end(JSON.stringify(answer.body));
      return;
    }
    if (problem !== undefined && standingAnswer !== undefined && request.headers.authorization === `Bearer ${token}`) {
      servedCount.set(url.pathname, (servedCount.get(url.pathname) ?? 0) + 1);
      response.writeHead(standingAnswer.status, { 'content-type': 'application/json' });
      response.end(JSON.stringify(standingAnswer.body));
      return;
    }
    if (problem !== undefined) {
      problems.push(problem);
      response.writeHead(418, { 'content-type': 'application/json' });
      response.end(JSON.stringify({ kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message: problem, code: 418 }));
      return;
    }
    const exchange = pending.shift() as RecordedExchange;
    response.writeHead(exchange.response.status, { 'content-type': 'application/json' });
    response.end(JSON.stringify(exchange.response.body));
  }

  const handle = (request: IncomingMessage, response: ServerResponse): void => {
    serve(request, response).catch((error: unknown) => {
      problems.push(`stand-in failed: ${String(error)}`);
      response.destroy();
    });
  };
  const server = tls ? createTlsServer(tls, handle) : createServer(handle);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;

  return {
    url: `${tls ? 'https' : 'http'}://127.0.0.1:${port}`,
    token,
    load(exchanges) {
      pending = [...pending, ...exchanges];
    },
    answer(path, response, query = {}) {
      standing.set(requestLine('GET', path, query), response);
    },
    served: (path) => servedCount.get(path) ?? 0,
    reviews(answer) {
      reviewAnswer = answer;
    },
    verify() {
      const left = pending.map(
        (exchange) => `unconsumed exchange ${requestLine(exchange.request.method, exchange.request.path, exchange.request.query ?? {})}`,
      );
      const all = [...problems, ...left];
      pending = [];
      problems = [];
      standing = new Map();
      reviewAnswer = undefined;
      if (all.length > 0) throw new Error(`Kubernetes API stand-in:\n  ${all.join('\n  ')}`);
    },
    close: () =>
      new Promise<void>((resolve, reject) => {
        server.closeAllConnections();
        server.close((error) => (error ? reject(error) : resolve()));
      }),
  };
}

/**
 * The stand-in over https, as the controller's configuration must reach it (it cannot skip TLS
 * verification): a certificate made for 127.0.0.1 in `dir`, named as `caFile`, and the stand-in's
 * bearer token in `tokenFile`, for backend.kubernetes's `connection: token`.
 */
export async function startKubeApiOverTls(dir: string): Promise<{ api: KubeApiStandIn; caFile: string; tokenFile: string }> {
  const key = join(dir, 'key.pem');
  const caFile = join(dir, 'cert.pem');
  await promisify(execFile)('openssl', [
    'req',
    '-x509',
    '-newkey',
    'ec',
    '-pkeyopt',
    'ec_paramgen_curve:prime256v1',
    '-nodes',
    '-keyout',
    key,
    '-out',
    caFile,
    '-days',
    '1',
    '-subj',
    '/CN=127.0.0.1',
    '-addext',
    'subjectAltName=IP:127.0.0.1',
  ]);
  const api = await startKubeApi(undefined, { key: readFileSync(key, 'utf8'), cert: readFileSync(caFile, 'utf8') });
  const tokenFile = join(dir, 'token');
  writeFileSync(tokenFile, api.token, { mode: 0o600 });
  return { api, caFile, tokenFile };
}
