import { CommanderError, type Command } from 'commander';
import { vi } from 'vitest';

export interface CliRun {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number;
}

/** Makes commander throw instead of exiting, and write to `stderr`, on a command and every subcommand. */
function inProcess(command: Command, stderr: (text: string) => void): Command {
  command.exitOverride().configureOutput({ writeOut: () => undefined, writeErr: stderr });
  command.commands.forEach((sub) => inProcess(sub, stderr));
  return command;
}

/**
 * Runs a CLI command in-process with user-style arguments, capturing what it writes and its exit
 * code: the one runCommand sets, or 2 for a commander usage error (as cli/main.ts maps them).
 * Nothing exits the test process.
 */
export async function runCli(command: Command, args: readonly string[], env: Readonly<Record<string, string>> = {}): Promise<CliRun> {
  let stdout = '';
  let stderr = '';
  const out = vi.spyOn(process.stdout, 'write').mockImplementation((chunk: string | Uint8Array) => {
    stdout += chunk.toString();
    return true;
  });
  const err = vi.spyOn(process.stderr, 'write').mockImplementation((chunk: string | Uint8Array) => {
    stderr += chunk.toString();
    return true;
  });
  for (const [name, value] of Object.entries(env)) vi.stubEnv(name, value);
  const previousExitCode = process.exitCode;
  process.exitCode = undefined;
  try {
    await inProcess(command, (text) => (stderr += text)).parseAsync([...args], { from: 'user' });
    return { stdout, stderr, exitCode: Number(process.exitCode ?? 0) };
  } catch (error) {
    if (!(error instanceof CommanderError)) throw error;
    return { stdout, stderr, exitCode: error.exitCode === 0 ? 0 : 2 };
  } finally {
    process.exitCode = previousExitCode;
    out.mockRestore();
    err.mockRestore();
    vi.unstubAllEnvs();
  }
}
