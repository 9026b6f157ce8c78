import type { Command } from 'commander';
import { vi } from 'vitest';

export interface CliRun {
  readonly stdout: string;
  readonly stderr: string;
  readonly exitCode: number;
}

/**
 * Runs a CLI command in-process with user-style arguments, capturing what it writes and the exit
 * code it sets (runCommand sets process.exitCode; nothing exits the test process).
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
    await command.exitOverride().parseAsync([...args], { from: 'user' });
    return { stdout, stderr, exitCode: Number(process.exitCode ?? 0) };
  } finally {
    process.exitCode = previousExitCode;
    out.mockRestore();
    err.mockRestore();
    vi.unstubAllEnvs();
  }
}
