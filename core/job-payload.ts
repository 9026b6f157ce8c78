import { UnrecoverableError } from 'bullmq';
import type { z } from 'zod';
import { InputError } from './errors.js';
import { parseOrThrow } from './validate.js';

/**
 * Validates a queue payload (an input edge like any other). A malformed payload fails the job
 * for good: retrying cannot make it valid.
 */
export function parseJobPayload<T extends z.ZodType>(schema: T, value: unknown, what: string): z.output<T> {
  try {
    return parseOrThrow(schema, value, what);
  } catch (error) {
    if (error instanceof InputError) throw new UnrecoverableError(error.message);
    throw error;
  }
}
