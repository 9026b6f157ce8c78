import { execFile } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { errorMessage } from '../../core/errors.js';

/**
 * Every command the lab runs goes through here: a fixed program with an argument array (never
 * a shell string), a time limit, and a typed error that says what failed and what it printed.
 */

const execFileAsync = promisify(execFile);

/** A lab step failed: a command refused, a daemon did not come up, the machine lacks something. */
export class LabError extends Error {
  constructor(message: string, cause?: unknown) {
    super(message, { cause });
    this.name = 'LabError';
  }
}

export interface RunOptions {
  readonly env?: Readonly<Record<string, string>>;
  readonly timeoutMs?: number;
}

export async function run(file: string, args: readonly string[], options: RunOptions = {}): Promise<string> {
  try {
    const { stdout } = await execFileAsync(file, [...args], {
      env: { ...process.env, ...options.env },
      timeout: options.timeoutMs ?? 15_000,
      maxBuffer: 4 * 1024 * 1024,
    });
    return stdout;
  } catch (error) {
    const failure = error as { stderr?: string; stdout?: string };
    const said = (failure.stderr?.trim() || failure.stdout?.trim() || errorMessage(error)).slice(0, 1000);
    throw new LabError(`${file} ${args.join(' ')} failed: ${said}`, error);
  }
}

/** Runs a command whose failure is expected and harmless (removing what may not exist). */
export async function runQuietly(file: string, args: readonly string[], options: RunOptions = {}): Promise<boolean> {
  try {
    await run(file, args, options);
    return true;
  } catch {
    return false;
  }
}

/** True when `program` is an executable file in a PATH directory (or the sbin ones root has). */
export function hasCommand(program: string): boolean {
  const dirs = [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/sbin'].filter(Boolean);
  return dirs.some((dir) => {
    try {
      accessSync(join(dir, program), constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}
