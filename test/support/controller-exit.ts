import { spawn } from 'node:child_process';
import { join, resolve } from 'node:path';

const REPO = resolve(import.meta.dirname, '../..');

/** Runs `steadfast controller --config FILE` as a real process; its exit code (null: still up after 25 s) and stderr. */
export async function controllerExit(config: string): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, ['--import', 'tsx', join(REPO, 'cli', 'main.ts'), 'controller', '--config', config], {
    cwd: REPO,
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, STEADFAST_LOG_LEVEL: 'silent' },
  });
  let stderr = '';
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const code = await new Promise<number | null>((done) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      done(null);
    }, 25_000);
    child.on('exit', (exitCode) => {
      clearTimeout(timer);
      done(exitCode);
    });
  });
  return { code, stderr };
}
