import { InvalidArgumentError } from 'commander';
import { InputError, errorMessage } from '../core/errors.js';

/** Exit codes: 0 ok, 1 the work failed, 2 bad input (flags, config, files). */
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;

export function parsePort(value: string): number {
  const port = Number(value);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new InvalidArgumentError('must be a port number 0-65535');
  return port;
}

export function parsePositiveInt(value: string): number {
  const number = Number(value);
  if (!Number.isInteger(number) || number < 1) throw new InvalidArgumentError('must be a whole number of at least 1');
  return number;
}

/** Runs a command body, turning InputError into a clear message and exit code 2. */
export async function runCommand(body: () => Promise<void>): Promise<void> {
  try {
    await body();
  } catch (error) {
    process.stderr.write(`steadfast: ${errorMessage(error)}\n`);
    process.exitCode = error instanceof InputError ? EXIT_USAGE : EXIT_FAILURE;
  }
}

/** Resolves on SIGINT or SIGTERM. */
export function untilSignalled(): Promise<NodeJS.Signals> {
  return new Promise((resolve) => {
    process.once('SIGINT', () => resolve('SIGINT'));
    process.once('SIGTERM', () => resolve('SIGTERM'));
  });
}

// C0 and C1 controls, DEL, and the bidirectional overrides and isolates.
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u202a-\u202e\u2066-\u2069]/g;

/**
 * Text from the controller (an alert's summary, a hold's reason, a job's failure) as it may be
 * written to a terminal: control characters, which could move the cursor, clear the screen or
 * retitle the window, and bidirectional overrides, which could reorder what is shown, are
 * written as `\xNN` / `\uNNNN` escapes instead.
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (char) => {
    const code = char.charCodeAt(0);
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}
