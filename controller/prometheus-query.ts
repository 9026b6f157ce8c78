import { z } from 'zod';
import { RetryLaterError, errorMessage } from '../core/errors.js';
import { describeIssues } from '../core/validate.js';

/** One instant-vector sample from Prometheus' HTTP API. */
export interface InstantSample {
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

const answerSchema = z.object({
  status: z.literal('success'),
  data: z.object({
    resultType: z.literal('vector'),
    result: z.array(z.object({ metric: z.record(z.string(), z.string()), value: z.tuple([z.number(), z.string()]) })),
  }),
});

/** `GET /api/v1/query`: an instant vector, or a RetryLaterError naming the query and what went wrong. */
export async function instantQuery(prometheusUrl: string, query: string, timeoutMs = 5000): Promise<InstantSample[]> {
  let response: Response;
  try {
    response = await fetch(`${prometheusUrl.replace(/\/+$/, '')}/api/v1/query?query=${encodeURIComponent(query)}`, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (error) {
    throw new RetryLaterError(`Prometheus query ${query} failed: ${errorMessage(error)}`, error);
  }
  const body = (await response.json().catch(() => undefined)) as unknown;
  const parsed = answerSchema.safeParse(body);
  if (!response.ok || !parsed.success) {
    const said = (body as { error?: unknown } | undefined)?.error;
    throw new RetryLaterError(`Prometheus query ${query} answered HTTP ${response.status}: ${typeof said === 'string' ? said : parsed.success ? 'not a vector' : describeIssues(parsed.error.issues)}`);
  }
  return parsed.data.data.result.map((sample) => ({ labels: sample.metric, value: Number(sample.value[1]) }));
}
