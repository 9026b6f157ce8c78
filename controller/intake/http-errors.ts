import type { Request, Response } from 'express';
import { InputError, RetryLaterError, errorMessage } from '../../core/errors.js';
import { JobExistsError, JobNotFoundError, NodesBusyError } from '../job-store.js';
import { StaleEpochError } from '../world-store.js';

/**
 * The one mapping from the typed errors a handler throws (core/errors.ts, and the job store's,
 * which are InputErrors) to HTTP statuses, for every endpoint of the controller: the API's
 * routers (jobs-api.ts, operator-api.ts) through `answerTypedErrors`, the intake endpoints
 * (intake-http.ts) and the app's last error handler (server.ts) through `failureAnswer`.
 */

/** The reason a refusal is counted under (steadfast_requests_rejected_total). */
export type ErrorReason = 'invalid' | 'not_found' | 'conflict' | 'store_unavailable';

export interface ErrorStatus {
  readonly status: 400 | 404 | 409 | 503;
  readonly reason: ErrorReason;
}

/** How long a 503 asks its caller to wait before retrying, in seconds (the Retry-After header). */
export const RETRY_AFTER_SECONDS = '5';

/** The status of a typed error; undefined for any other error, which is ours (a bug: 500). */
export function errorStatus(error: unknown): ErrorStatus | undefined {
  if (error instanceof JobNotFoundError) return { status: 404, reason: 'not_found' };
  if (error instanceof JobExistsError || error instanceof NodesBusyError || error instanceof StaleEpochError) return { status: 409, reason: 'conflict' };
  if (error instanceof InputError) return { status: 400, reason: 'invalid' };
  // The store down (StoreUnavailableError) or any other passing failure: the caller's retry will do.
  if (error instanceof RetryLaterError) return { status: 503, reason: 'store_unavailable' };
  return undefined;
}

/**
 * An Express handler of the API's routers that answers a typed error itself: its status and
 * `{ error: <its message> }`, a 503 with Retry-After. Any other error goes on to the app's error
 * handler (server.ts).
 */
export function answerTypedErrors(work: (req: Request, res: Response) => Promise<void>): (req: Request, res: Response) => Promise<void> {
  return async (req, res) => {
    try {
      await work(req, res);
    } catch (error) {
      const known = errorStatus(error);
      if (known === undefined) throw error;
      if (known.status === 503) res.set('Retry-After', RETRY_AFTER_SECONDS);
      res.status(known.status).json({ error: errorMessage(error) });
    }
  };
}

export interface Failure {
  readonly status: number;
  readonly reason: ErrorReason | 'internal';
  /** The answer's `error`. */
  readonly message: string;
}

/**
 * The answer to a request whose handler failed, for the endpoints that answer every error
 * themselves (intake-http.ts, server.ts): a typed refusal with its message; a passing failure,
 * or any failure while Redis is down, as 503 with a fixed message (the caller's retry will do,
 * not a bug report); anything else as 500.
 */
export async function failureAnswer(error: unknown, redisUp: () => Promise<boolean>): Promise<Failure> {
  const known = errorStatus(error);
  if (known !== undefined && known.status !== 503) return { ...known, message: errorMessage(error) };
  if (known !== undefined || !(await redisUp())) return { status: 503, reason: 'store_unavailable', message: 'the store (Redis) is unavailable; retry later' };
  return { status: 500, reason: 'internal', message: 'internal error; see the controller log' };
}
