import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { repoRoot } from '../../core/paths.js';

const run = promisify(execFile);

/**
 * The burn the agent ships (clients/python/steadfast_burn.py) under Python's own unittest, with
 * Debian's /usr/bin/python3 and python3-torch, on the CPU: a corrupted result fails its device,
 * and the command prints the one JSON line the agent reads.
 */
describe('the burn script', () => {
  it('passes its unittest suite', async () => {
    const done = await run(
      '/usr/bin/python3',
      ['-m', 'unittest', 'discover', '-s', join(repoRoot(), 'clients', 'python', 'tests'), '-p', 'test_steadfast_burn.py', '-v'],
      { timeout: 240_000 },
    ).catch((error: { stdout?: string; stderr?: string; message: string }) => {
      throw new Error(`python unittest failed:\n${error.stderr ?? ''}${error.stdout ?? ''}${error.message}`);
    });
    expect(done.stderr).toMatch(/\nOK\n?$/);
  }, 300_000);
});
