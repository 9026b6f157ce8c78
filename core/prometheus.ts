import { z } from 'zod';
import { DoNotRetryError, RetryLaterError, errorMessage } from './errors.js';

/**
 * The one client of Prometheus' instant-query API (`GET /api/v1/query`), for the controller's
 * watches and the multi-signal feature source alike. A failure comes as one of two types, so a
 * caller can tell "ask again later" (Prometheus down, slow, overloaded) from "asking again cannot
 * help" (the query or the URL is wrong) without reading messages: the feature source reports the
 * two apart per feature, the controller's watches log either and try at their next tick.
 */

/** One instant-vector sample: the series' labels and its value (NaN and ±Inf as Prometheus sent them). */
export interface InstantSample {
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Prometheus could not be reached or could not answer now (down, timed out, 5xx, 429): retry later. */
export class PrometheusUnavailableError extends RetryLaterError {
  constructor(
    message: string,
    /** The queries concerned. */
    readonly queries: readonly string[],
    cause?: unknown,
  ) {
    super(message, cause);
    this.name = 'PrometheusUnavailableError';
  }
}

/** Prometheus refused a query, or answered something that is not the vector asked for: fix the query or the URL. */
export class PrometheusQueryRejectedError extends DoNotRetryError {
  constructor(
    message: string,
    /** The queries concerned. */
    readonly queries: readonly string[],
  ) {
    super(message);
    this.name = 'PrometheusQueryRejectedError';
  }
}

export type PrometheusQueryFailure = PrometheusUnavailableError | PrometheusQueryRejectedError;

export interface InstantQueryOptions {
  /** Evaluation time, ms since the epoch; Prometheus' own "now" when absent. */
  readonly time?: number;
  readonly timeoutMs?: number;
  /** How error messages name the query (e.g. the feature it computes); `Prometheus query <query>` by default. */
  readonly subject?: string;
}

const answerSchema = z.discriminatedUnion('status', [
  z.object({
    status: z.literal('success'),
    data: z.object({ resultType: z.string(), result: z.array(z.unknown()) }),
  }),
  z.object({ status: z.literal('error'), errorType: z.string().optional(), error: z.string().optional() }),
]);

const sampleSchema = z.object({
  metric: z.record(z.string(), z.string()),
  value: z.tuple([z.number(), z.string()]),
});

/** errorType values that say the query or its data is wrong, not that Prometheus is unwell. */
const QUERY_FAULTS = new Set(['bad_data', 'execution', 'not_found', 'not_acceptable']);

/**
 * `query` evaluated at `options.time` against the Prometheus at `prometheusUrl` (a path prefix is
 * kept): its instant vector, or a PrometheusUnavailableError / PrometheusQueryRejectedError whose
 * message names the query (or `options.subject`) and what went wrong.
 */
export async function instantQuery(prometheusUrl: string, query: string, options: InstantQueryOptions = {}): Promise<InstantSample[]> {
  const url = prometheusUrl.replace(/\/+$/, '');
  const { timeoutMs = 5000 } = options;
  const subject = options.subject ?? `Prometheus query ${query}`;
  const unavailable = (reason: string, cause?: unknown) => new PrometheusUnavailableError(`${subject}: ${reason}`, [query], cause);
  const rejected = (reason: string) => new PrometheusQueryRejectedError(`${subject}: ${reason}`, [query]);

  const params = new URLSearchParams({ query });
  if (options.time !== undefined) params.set('time', (options.time / 1000).toFixed(3));
  const signal = AbortSignal.timeout(timeoutMs);
  let status: number;
  let body: string;
  try {
    const response = await fetch(`${url}/api/v1/query?${params}`, { signal });
    status = response.status;
    body = await response.text();
  } catch (error) {
    throw unavailable(signal.aborted ? `no answer from ${url} within ${timeoutMs} ms` : `could not reach Prometheus at ${url}: ${errorMessage(error)}`, error);
  }

  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch {
    const reason = `Prometheus answered HTTP ${status} with a body that is not JSON: ${JSON.stringify(body.slice(0, 200))}`;
    throw status >= 500 || status === 429 ? unavailable(reason) : rejected(reason);
  }
  const answer = answerSchema.safeParse(json);
  if (!answer.success) throw rejected(`Prometheus answered HTTP ${status} with JSON that is not a query answer`);
  if (answer.data.status === 'error') {
    const reason = `Prometheus answered HTTP ${status}, ${answer.data.errorType ?? 'error'}: ${answer.data.error ?? '(no message)'}`;
    const queryFault = status === 400 || status === 422 || QUERY_FAULTS.has(answer.data.errorType ?? '');
    throw queryFault ? rejected(reason) : unavailable(reason);
  }
  if (status < 200 || status >= 300) throw unavailable(`Prometheus answered HTTP ${status}`);
  if (answer.data.data.resultType !== 'vector') throw rejected(`the query returns a ${answer.data.data.resultType}, not an instant vector`);

  return answer.data.data.result.map((raw) => {
    const sample = sampleSchema.safeParse(raw);
    if (!sample.success) throw rejected('a series of the answer has no [time, "value"] sample');
    return { labels: sample.data.metric, value: Number(sample.data.value[1]) };
  });
}
