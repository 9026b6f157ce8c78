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
