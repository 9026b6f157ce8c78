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
    // A message may quote the controller or a node: each of its lines printable.
    process.stderr.write(`steadfast: ${errorMessage(error).split('\n').map(printable).join('\n')}\n`);
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

/**
 * What a terminal would act on or hide rather than show: C0 and C1 controls and DEL (which move
 * the cursor, clear the screen, retitle the window); every format character (Cf: the
 * bidirectional marks, embeddings, overrides and isolates, which reorder what is shown, the
 * Arabic letter mark, zero-width spaces and joiners, the word joiner, the byte order mark, the
 * soft hyphen, the tag characters); the line and paragraph separators; the tag block's
 * unassigned code points; lone surrogates; and the Hangul fillers, letters that show as blanks.
 */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}\u{E0000}-\u{E007F}\u115F\u1160\u3164\uFFA0]/gu;
/** The same, less what JSON.stringify escapes itself (C0 controls and lone surrogates in strings; the rest of C0 in its output is its own layout). */
const UNPRINTABLE_IN_JSON = /[\u007f-\u009f\p{Cf}\p{Zl}\p{Zp}\u{E0000}-\u{E007F}\u115F\u1160\u3164\uFFA0]/gu;

/**
 * Text from the controller, Redis or a node (an alert's summary, a hold's reason, a job's
 * failure) as it may be written to a terminal: each UNPRINTABLE character is written as a visible
 * `\xNN`, `\uNNNN` or `\u{NNNNN}` escape instead.
 */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (char) => {
    const code = char.codePointAt(0) as number;
    if (code <= 0xff) return `\\x${code.toString(16).padStart(2, '0')}`;
    return code <= 0xffff ? `\\u${code.toString(16).padStart(4, '0')}` : `\\u{${code.toString(16)}}`;
  });
}

/**
 * `value` as JSON for a terminal: JSON.stringify escapes C0 controls itself, and each other
 * UNPRINTABLE character becomes a JSON `\uNNNN` escape (two for a character beyond U+FFFF), so
 * the text reads back the same and shows nothing raw.
 */
export function printableJson(value: unknown, indent?: number): string {
  return JSON.stringify(value, null, indent).replace(UNPRINTABLE_IN_JSON, (char) =>
    Array.from({ length: char.length }, (_, index) => `\\u${char.charCodeAt(index).toString(16).padStart(4, '0')}`).join(''),
  );
}
