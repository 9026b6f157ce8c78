import type { Counter } from 'prom-client';
import { ACTION_ANNOTATION_TAG, type StepRecord } from '../core/steps.js';
import { errorMessage } from '../core/errors.js';
import type { Logger } from '../core/log.js';

/**
 * Posts each finished action to Grafana's annotation API (`POST /api/annotations`), so that every
 * steadfast dashboard shows what steadfast did, when, and to which node (docs/architecture.md). Best
 * effort by design: the action has already happened and is in the audit log; a Grafana that is
 * down, slow or refusing is logged and counted, and never fails or delays the action.
 */

export type AnnotationFailure = 'timeout' | 'unreachable' | 'status';

export interface GrafanaAnnotatorOptions {
  /** Grafana's base URL; a path prefix (Grafana behind /grafana) is kept. */
  readonly url: string;
  readonly token: string;
  /** Attach annotations to this dashboard; otherwise they are organisation-wide. */
  readonly dashboardUid?: string | undefined;
  readonly timeoutMs: number;
  readonly failed: Counter<'reason'>;
  readonly logger: Logger;
}

/** The body Grafana's `POST /api/annotations` takes. */
export interface AnnotationBody {
  /** Epoch milliseconds. */
  readonly time: number;
  readonly tags: string[];
  readonly text: string;
  readonly dashboardUID?: string;
}

export function annotationBody(record: StepRecord, dashboardUid?: string): AnnotationBody {
  const time = Date.parse(record.time);
  const where = [record.node, record.job].filter((tag): tag is string => tag !== undefined);
  return {
    time: Number.isFinite(time) ? time : Date.now(),
    tags: [ACTION_ANNOTATION_TAG, record.verb, record.state, ...where],
    text: `${record.job === undefined ? '' : `${record.job}: `}${record.verb}${record.node === undefined ? '' : ` ${record.node}`}: ${record.state} (${record.detail}) [${record.backend}, decision ${record.ref}]`,
    ...(dashboardUid !== undefined ? { dashboardUID: dashboardUid } : {}),
  };
}

/** fetch() reports "fetch failed" and keeps the reason (ECONNREFUSED, a TLS error) in `cause`. */
function withCause(error: unknown): string {
  return error instanceof Error && error.cause !== undefined ? `${error.message}: ${errorMessage(error.cause)}` : errorMessage(error);
}

export class GrafanaAnnotator {
  private readonly endpoint: URL;
  private readonly inFlight = new Set<Promise<void>>();

  constructor(private readonly options: GrafanaAnnotatorOptions) {
    const base = options.url.endsWith('/') ? options.url : `${options.url}/`;
    this.endpoint = new URL('api/annotations', base);
  }

  /** Posts the annotation in the background; never throws. */
  annotate(record: StepRecord): void {
    const post = this.post(record).finally(() => this.inFlight.delete(post));
    this.inFlight.add(post);
  }

  /** Resolves once every post started so far has finished or failed (each is bounded by the timeout). */
  async settled(): Promise<void> {
    await Promise.all([...this.inFlight]);
  }

  private async post(record: StepRecord): Promise<void> {
    const { token, timeoutMs, logger } = this.options;
    const context = { decision: record.ref, node: record.node, state: record.state, grafana: this.endpoint.origin };
    const signal = AbortSignal.timeout(timeoutMs);
    let failure: AnnotationFailure;
    let why: string;
    try {
      const response = await fetch(this.endpoint, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify(annotationBody(record, this.options.dashboardUid)),
        signal,
      });
      // Drain the body either way so the connection can be reused.
      const answer = await response.text();
      if (response.ok) return;
      failure = 'status';
      why = `HTTP ${response.status}: ${answer.slice(0, 200)}`;
    } catch (error) {
      failure = signal.aborted ? 'timeout' : 'unreachable';
      why = failure === 'timeout' ? `no answer within ${timeoutMs} ms` : withCause(error);
    }
    this.options.failed.inc({ reason: failure });
    logger.warn({ ...context, reason: failure, err: why }, 'could not post the action annotation to Grafana; the action is unaffected');
  }
}
