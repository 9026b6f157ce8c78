import type { z } from 'zod';
import { InputError } from './errors.js';

/** Formats zod issues as `field: message; field: message`, naming every bad field. */
export function describeIssues(issues: readonly z.core.$ZodIssue[], prefix = ''): string {
  return issues
    .map((issue) => {
      const path = [prefix, ...issue.path.map(String)].filter((part) => part !== '').join('.');
      return `${path || '(root)'}: ${issue.message}`;
    })
    .join('; ');
}

/** Parses `value` with `schema`, throwing an InputError that names each bad field. */
export function parseOrThrow<T extends z.ZodType>(schema: T, value: unknown, what: string): z.output<T> {
  const result = schema.safeParse(value);
  if (!result.success) {
    const first = result.error.issues[0];
    throw new InputError(`invalid ${what}: ${describeIssues(result.error.issues)}`, first ? first.path.map(String).join('.') : undefined);
  }
  return result.data;
}
