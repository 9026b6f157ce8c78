/**
 * Typed errors the pipeline reacts to with `instanceof`, never by name strings.
 */

/** Input at an edge (HTTP body, file, CLI flag, config, queue payload) is malformed. */
export class InputError extends Error {
  constructor(
    message: string,
    /** Dotted path of the offending field, when one is known. */
    readonly field?: string,
  ) {
    super(message);
    this.name = 'InputError';
  }
}

/** The work must not be retried: retrying cannot change the outcome. */
export class DoNotRetryError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'DoNotRetryError';
  }
}

/** The work failed for a passing reason (a dependency is down); try again later. */
export class RetryLaterError extends Error {
  constructor(message: string, cause?: unknown) {
    super(message, { cause });
    this.name = 'RetryLaterError';
  }
}

/** Redis (the durable store) could not take or give data. */
export class StoreUnavailableError extends RetryLaterError {
  constructor(message: string, cause?: unknown) {
    super(message, cause);
    this.name = 'StoreUnavailableError';
  }
}

export function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
